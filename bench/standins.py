"""Stand-in generate, filter and classify stages for simulating a build at scale without GPUs.

Each is a :class:`~pipeline.stages.base.Stage` with the real stage's ``name``, output schema
and batch keys (attempt bookkeeping through ``Stage.__call__`` as for the real ones); the
classify stand-in is the real ``ClassifyStage`` of its classifier group (its predictions
merged with the groups' before it in config order) without models.  Their rows carry real
bytes: generation emits every (shift, scale) image of its (class, seed) unit as one of a
palette of 256 px PNGs of photographs, encoded once and read at setup, so the object store,
the writer's tars, Parquet files and manifests move what a build moves.  No stand-in imports
torch or a model.

What runs inside each GPU node's actors is modelled as time, divided by the time
``compression`` (``sim``):

* GPU work: the project's latency model (:mod:`pipeline.perf.latency`: a unit's UNet
  evaluations and decodes, the filter's and each group's classifiers' FLOPs per image) on
  the simulated GPU, divided by the actor's share of its GPU (``num_gpus``);
* the CPU work of the real stages (``sim["cpu_model_s"]``, measured once on this machine
  with the real code by ``bench/scale.py``): the PNG encode of each image in generate; the
  decode and the filter's preprocessing in filter; the decode and every classifier's
  preprocessing in each classify group;
* start-up: each actor's imports and model loading (:mod:`pipeline.perf.startup`, the
  rehearsal's measurement), slept at its first batch, where the real stages load.

A batch sleeps whatever of its modelled time its own CPU work did not use.  Every actor's
constructor waits until all the chain's actors have started (``sim["actors"]``): on a
cluster each node starts its own actors at once, where this machine starts them one after
another; the build's clock (``barrier.json``) starts when the last one is up.

Every batch appends one line to ``<stats_dir>/<stage>-<pid>.jsonl``: its start and end
(wall clock), the modelled GPU work in compressed seconds at a whole GPU, and the CPU
seconds the batch used in this process.  ``TimedWriteStage`` (the real writer) records the
same.  ``bench/scale.py`` reads them back.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from pipeline import plan
from pipeline.perf import data, latency
from pipeline.plan import schema
from pipeline.stages.base import Stage
from pipeline.stages.classify import ClassifyStage
from pipeline.stages.generate import GenerateStage
from pipeline.stages.write import WriteStage

BARRIER_TIMEOUT_S = 900
PREDICTIONS = ("pred_top1", "pred_top5", "pred_p_true", "pred_answer", "pred_excluded")


class _Timed:
    """Per-batch timing of a stand-in (mixed into a real stage class)."""

    name: str
    sim: dict
    startup_key: str = ""

    def __init__(self, *args: Any, sim: dict, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # the real stage's
        self.sim = sim
        self._log = None
        self.threads = None  # no torch thread setting: a stand-in's worker never imports torch
        self._barrier()

    def _barrier(self) -> None:
        """Wait until every actor of the chain has started; the last one to arrive notes the time."""
        folder = Path(self.sim["stats_dir"]) / "ready"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{os.getpid()}-{id(self)}").write_text(str(time.time()))
        deadline = time.time() + BARRIER_TIMEOUT_S
        while len(os.listdir(folder)) < self.sim["actors"] and time.time() < deadline:
            time.sleep(0.05)
        mark = Path(self.sim["stats_dir"]) / "barrier.json"
        if not mark.exists():
            tmp = mark.with_name(f"barrier-{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"released": time.time(), "actors": len(os.listdir(folder))}))
            os.replace(tmp, mark)
        if self.sim.get("hold_s"):  # a calibration's idle spell: every actor up, nothing moving
            released = json.loads(mark.read_text())["released"]
            time.sleep(max(0.0, released + self.sim["hold_s"] - time.time()))

    def _record(self, t0: float, cpu0: float, work: float) -> None:
        if self._log is None:
            os.makedirs(self.sim["stats_dir"], exist_ok=True)
            self._log = open(os.path.join(self.sim["stats_dir"], f"{self.name}-{os.getpid()}.jsonl"), "a")
        line = {"start": t0, "end": time.time(), "work": work, "cpu": time.process_time() - cpu0}
        self._log.write(json.dumps(line) + "\n")
        self._log.flush()

    def _hold(self, t0: float, gpu_seconds: float, cpu_seconds: float) -> float:
        """Sleep until the batch's modelled time has passed since ``t0``: ``gpu_seconds`` (at a
        whole GPU, real time) at this actor's GPU share, then ``cpu_seconds``, both compressed.
        Returns the compressed GPU work at a whole GPU."""
        share = max(self.sim["shares"][self.name], 1e-9)
        work = gpu_seconds / self.sim["compression"]
        left = work / share + cpu_seconds / self.sim["compression"] - (time.time() - t0)
        if left > 0:
            time.sleep(left)
        return work

    def setup(self) -> None:
        self.spec = data.gpu_spec(self.sim["gpu"])
        self.images = [Path(p).read_bytes() for p in self.sim["palette"]]
        self.cpu = self.sim["cpu_model_s"]
        loading = self.sim["startup_s"].get(self.startup_key or self.name, 0.0) / self.sim["compression"]
        if loading > 0:
            time.sleep(loading)  # the stage's imports and model loading, as its first batch pays them


class StandInGenerate(_Timed, Stage):
    name = "generate"
    output_schema = schema.GENERATED
    uses_torch = False

    def batch_keys(self, rows: list[dict[str, Any]]) -> list[str]:
        return [r["unit_id"] for r in rows]

    fail_rows = GenerateStage.fail_rows  # the generate stage's failed trajectory rows

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        t0, cpu0 = time.time(), time.process_time()
        cfg = self.config
        out, gpu_s, cpu_s = [], 0.0, 0.0
        palette = len(self.images)
        for row in rows:
            unit = plan.WorkUnit.from_row(row)
            for group in cfg.family_groups():
                shifts = [s for s in unit.shifts if s in group.shifts]
                if not shifts:
                    continue
                scales = list(group.scales)
                seconds, e = latency.unit_seconds(cfg, self.spec, len(shifts), scales)
                gpu_s += seconds
                cpu_s += e["branches"] * self.cpu["encode"]  # one PNG per distinct image of the unit
                for k, shift in enumerate(shifts):
                    h = unit.class_id * 31 + unit.seed * 7 + k
                    out.append(
                        schema.trajectory_row(
                            class_id=unit.class_id, class_name=unit.class_name, seed=unit.seed, shift=shift,
                            scales=scales, images=[self.images[(h + i) % palette] for i in range(len(scales))],
                            unet_evals=e["evals"] / len(shifts), gen_seconds=seconds / len(shifts),
                        )
                    )
        self._record(t0, cpu0, self._hold(t0, gpu_s, cpu_s))
        return out


def _images(rows: list[dict[str, Any]]) -> int:
    return sum(len(r.get("images") or []) for r in rows if not r.get("error"))


class StandInFilter(_Timed, Stage):
    name = "filter"
    output_schema = schema.FILTERED
    uses_torch = False

    def setup(self) -> None:
        _Timed.setup(self)
        self.per_image = latency.image_seconds(self.config, self.spec, "filter")[0]

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        t0, cpu0 = time.time(), time.process_time()
        out = []
        for row in rows:
            k = len(row.get("images") or []) if not row.get("error") else 0
            extra = {c: [0.9] * k for c in (*schema.SCORE_COLUMNS, *schema.REALISATION_COLUMNS)}
            out.append({**row, **extra, "n_pass": [4] * k, "kept": [True] * k})
        n = _images(rows)
        cpu = n * (self.cpu["decode"] + self.cpu["filter_preprocess"])
        self._record(t0, cpu0, self._hold(t0, n * self.per_image, cpu))
        return out


class StandInClassify(_Timed, ClassifyStage):
    """One classifier group's classify stage (``classifiers``, ``done``) without its models."""

    uses_torch = False

    def __init__(self, *args: Any, sim: dict, per_image: float, **kwargs: Any) -> None:
        super().__init__(*args, sim=sim, **kwargs)
        self.startup_key = "classify:" + "-".join(map(str, self.owned))
        self.per_image = per_image

    def setup(self) -> None:
        _Timed.setup(self)
        self.cpu_per_image = self.cpu["decode"] + sum(self.cpu["classifier_preprocess"][i] for i in self.owned)

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        t0, cpu0 = time.time(), time.process_time()
        m = len(self.owned)
        out = []
        for row in rows:
            k = len(row.get("images") or []) if not row.get("error") else 0
            c = int(row["class_id"])
            top5 = [c, c + 1, c + 2, c + 3, c + 4]
            own = {
                "pred_top1": [[c if (i + j) % 3 else c + 1 for j in self.owned] for i in range(k)],
                "pred_top5": [[top5] * m for _ in range(k)],
                "pred_p_true": [[0.5] * m for _ in range(k)],
                "pred_answer": [[None] * m for _ in range(k)],
                "pred_excluded": [[None] * m for _ in range(k)],
            }
            out.append({**row, **(self._merged(row, own) if self.done else own)})
        n = _images(rows)
        self._record(t0, cpu0, self._hold(t0, n * self.per_image, n * self.cpu_per_image))
        return out


class TimedWriteStage(_Timed, WriteStage):
    """The real writer, its batches timed like the stand-ins' (no GPU work)."""

    def setup(self) -> None:
        WriteStage.setup(self)

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        t0, cpu0 = time.time(), time.process_time()
        out = WriteStage.process(self, rows)
        self._record(t0, cpu0, 0.0)
        return out


def standin_chain(cfg, sim: dict, commit: dict | None = None):
    """The build's chain (``pipeline.build.build_chain``) with the model stages stood in for:
    one classify stage per group of ``sim["groups"]``, each pool as ``sim["pools"]`` says;
    ``commit``: the writer's commit kwargs, from the run.  The stand-ins hold no model, so no
    pool declares the models' projected memory."""
    from pipeline.executors import Chain, StageSpec

    res = cfg.resources
    pools = sim["pools"]

    def sized(stage: str, key: str):
        return getattr(res, stage).model_copy(update={"pool_size": pools[key]["actors"],
                                                      "num_gpus": pools[key]["gpu_share"]})

    chain = [StageSpec(StandInGenerate, {"sim": sim}, resources=sized("generate", "generate")),
             StageSpec(StandInFilter, {"sim": sim}, resources=sized("filter", "filter"))]
    done: list[int] = []
    # The group's modelled seconds per image, worked out here: the classifiers' FLOPs come from
    # their kinds' classes (pipeline.perf.flops), whose modules import torch, which a stand-in's
    # worker must not pay (a real classify actor imports it for its models; the driver holds it).
    spec = data.gpu_spec(sim["gpu"])
    for k, group in enumerate(sim["groups"]):
        per_image = latency.image_seconds(cfg, spec, "classify", group)[0]
        chain.append(StageSpec(StandInClassify, {"sim": sim, "classifiers": group, "done": list(done),
                                                 "per_image": per_image},
                               resources=sized("classify", f"classify:{k}")))
        done = sorted(done + group)
    chain.append(StageSpec(TimedWriteStage, {"sim": sim, **(commit or {})},
                           resources=sized("write", "write"), batch_size=cfg.output.trajectories_per_shard))
    return Chain(cfg, chain, project_memory=False)
