"""Stand-in generate, filter and classify stages for simulating a build at scale without GPUs.

Each is a :class:`~pipeline.stages.base.Stage` with the real stage's ``name``,
``output_schema`` and batch keys (attempt bookkeeping through ``Stage.__call__`` as for the
real ones), whose ``process`` emits rows of the real schema without running a model, and
without importing torch or the model code (a worker starts in a second, not ten): generation emits every (shift, scale) image of its (class, seed)
unit as a small real PNG (16x16 px, so the writer's tars, Parquet files and manifests do
their real work), the filter scores every image as kept, the classifier predicts every
configured classifier's top-5.  A batch takes the time the real models would take on the
simulated GPU (:mod:`pipeline.perf.estimate`: UNet evaluations x seconds per evaluation at the
configured resolution, the filter's and the classifiers' FLOPs per image), divided by the
actor's share of its GPU (``num_gpus``: a quarter-GPU actor runs at a quarter of the
speed) and by ``compression``.  The batch sleeps whatever of that time its own CPU work did
not use.

Every batch appends one line to ``<stats_dir>/<stage>-<pid>.jsonl``: its start and end
(wall clock), the modelled GPU work in compressed seconds at a whole GPU, and the CPU
seconds the batch used in this process.  ``TimedWriteStage`` (the real writer) records
the same.  ``bench/scale.py`` reads them back.
"""

from __future__ import annotations

import io
import json
import os
import time
from typing import Any

from pipeline import plan

from pipeline.perf import estimate

from pipeline.plan import schema
from pipeline.stages.base import Stage
from pipeline.stages.write import WriteStage

PNG_SIDE = 16
PALETTE = 64  # distinct images, encoded once per actor


def _palette() -> list[bytes]:
    from PIL import Image

    out = []
    for i in range(PALETTE):
        img = Image.new("RGB", (PNG_SIDE, PNG_SIDE), ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256))
        img.putpixel((i % PNG_SIDE, i // PNG_SIDE % PNG_SIDE), (255, 255, 255))
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


class _Timed:
    """Per-batch timing of a stand-in (mixed into a real stage class)."""

    sim: dict

    def _init_sim(self, sim: dict) -> None:
        self.sim = sim
        self._log = None
        self.threads = None  # no torch thread setting: a stand-in's worker never imports torch

    def _record(self, t0: float, cpu0: float, work: float) -> None:
        if self._log is None:
            os.makedirs(self.sim["stats_dir"], exist_ok=True)
            self._log = open(os.path.join(self.sim["stats_dir"], f"{self.name}-{os.getpid()}.jsonl"), "a")
        line = {"start": t0, "end": time.time(), "work": work, "cpu": time.process_time() - cpu0}
        self._log.write(json.dumps(line) + "\n")
        self._log.flush()

    def _hold(self, t0: float, gpu_seconds: float) -> float:
        """Sleep until ``gpu_seconds`` (at a whole GPU, uncompressed) have passed since ``t0`` for
        this actor's GPU share; returns the compressed work at a whole GPU."""
        share = max(self.sim["shares"][self.name], 1e-9)
        work = gpu_seconds / self.sim["compression"]
        left = work / share - (time.time() - t0)
        if left > 0:
            time.sleep(left)
        return work

    def setup(self) -> None:
        self.spec = estimate.gpu_spec(self.sim["gpu"])
        self.images = _palette()


class StandInGenerate(_Timed, Stage):
    name = "generate"
    output_schema = schema.GENERATED

    def __init__(self, *args: Any, sim: dict, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_sim(sim)

    def batch_keys(self, rows: list[dict[str, Any]]) -> list[str]:
        return [r["unit_id"] for r in rows]

    def fail_rows(self, rows: list[dict[str, Any]], message: str) -> list[dict[str, Any]]:
        return [
            schema.trajectory_row(class_id=r["class_id"], class_name=r["class_name"], seed=r["seed"], shift=s,
                                  scales=[], images=[], error=message)
            for r in rows for s in r["shifts"]
        ]

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        t0, cpu0 = time.time(), time.process_time()
        cfg = self.config
        out, gpu_s = [], 0.0
        for row in rows:
            unit = plan.WorkUnit.from_row(row)
            for group in cfg.family_groups():
                shifts = [s for s in unit.shifts if s in group.shifts]
                if not shifts:
                    continue
                scales = list(group.scales)
                seconds, e = estimate.unit_seconds(cfg, self.spec, len(shifts), scales)
                gpu_s += seconds
                for k, shift in enumerate(shifts):
                    h = unit.class_id * 31 + unit.seed * 7 + k
                    out.append(
                        schema.trajectory_row(
                            class_id=unit.class_id,
                            class_name=unit.class_name,
                            seed=unit.seed,
                            shift=shift,
                            scales=scales,
                            images=[self.images[(h + i) % PALETTE] for i in range(len(scales))],
                            unet_evals=e["evals"] / len(shifts),
                            gen_seconds=seconds / len(shifts),
                        )
                    )
        self._record(t0, cpu0, self._hold(t0, gpu_s))
        return out


class StandInFilter(_Timed, Stage):
    name = "filter"
    output_schema = schema.FILTERED
    def __init__(self, *args: Any, sim: dict, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_sim(sim)

    def setup(self) -> None:
        _Timed.setup(self)
        self.per_image = estimate.image_seconds(self.config, self.spec, "filter")[0]

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        t0, cpu0 = time.time(), time.process_time()
        out, n = [], 0
        for row in rows:
            k = len(row.get("images") or []) if not row.get("error") else 0
            n += k
            extra = {c: [0.9] * k for c in (*schema.SCORE_COLUMNS, *schema.REALISATION_COLUMNS)}
            out.append({**row, **extra, "n_pass": [4] * k, "kept": [True] * k})
        self._record(t0, cpu0, self._hold(t0, n * self.per_image))
        return out


class StandInClassify(_Timed, Stage):
    name = "classify"
    output_schema = schema.CLASSIFIED
    def __init__(self, *args: Any, sim: dict, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_sim(sim)

    def setup(self) -> None:
        _Timed.setup(self)
        self.per_image = estimate.image_seconds(self.config, self.spec, "classify")[0]
        self.n_classifiers = len(self.config.classifiers)

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        t0, cpu0 = time.time(), time.process_time()
        out, n, m = [], 0, self.n_classifiers
        for row in rows:
            k = len(row.get("images") or []) if not row.get("error") else 0
            n += k
            c = int(row["class_id"])
            top5 = [c, c + 1, c + 2, c + 3, c + 4]
            out.append(
                {
                    **row,
                    "pred_top1": [[c if (i + j) % 3 else c + 1 for j in range(m)] for i in range(k)],
                    "pred_top5": [[top5] * m for _ in range(k)],
                    "pred_p_true": [[0.5] * m for _ in range(k)],
                }
            )
        self._record(t0, cpu0, self._hold(t0, n * self.per_image))
        return out


class TimedWriteStage(_Timed, WriteStage):
    """The real writer, its batches timed like the stand-ins' (no GPU work)."""

    def __init__(self, *args: Any, sim: dict, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_sim(sim)

    def setup(self) -> None:
        WriteStage.setup(self)

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        t0, cpu0 = time.time(), time.process_time()
        out = WriteStage.process(self, rows)
        self._record(t0, cpu0, 0.0)
        return out


class RayBatchedWriteStage(TimedWriteStage):
    """The writer fed as before the shard repartition (``bench/scale.py --ray-batches``, the
    baseline): Ray Data's bundles cut into a full shard and a remainder."""

    exact_batches = False


def standin_chain(cfg, sim: dict, lease=None) -> list:
    """The build's chain (``pipeline.build.build_chain``) with the model stages stood in for."""
    from pipeline import build
    from pipeline.executors import StageSpec

    writer = {"sim": sim, **(build.lease_kwargs(lease) if hasattr(build, "lease_kwargs") else {})}
    return [
        StageSpec(StandInGenerate, {"sim": sim}),
        StageSpec(StandInFilter, {"sim": sim}),
        StageSpec(StandInClassify, {"sim": sim}),
        StageSpec(RayBatchedWriteStage if sim.get("ray_batches") else TimedWriteStage, writer,
                  batch_size=cfg.output.trajectories_per_shard),
    ]
