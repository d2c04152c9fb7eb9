"""Train stage: slider jobs (one (class, shift) each) -> one result row per trained slider.

``cnsbench train-sliders`` hands its jobs to the same executors as a build
(:mod:`pipeline.executors`): a pool of training actors under Ray Data, or this stage in
process.  The stage commits each slider itself (file, then its metadata JSON as the
done-marker, see :class:`pipeline.train.sliders.SliderTrainer`), so it is the last stage
of its chain.  A pair that raises is returned as an error row; the others go on.
"""

from __future__ import annotations

import json
import traceback
from typing import Any

import pyarrow as pa

from pipeline.executors.chain import Chain, StageSpec
from pipeline.stages.base import Stage

# One slider to train (SliderJob's fields), and what training it gave.
JOB = pa.schema([("class_id", pa.int64()), ("class_name", pa.string()), ("shift", pa.string()),
                 ("path", pa.string()), ("meta_path", pa.string()), ("seed", pa.int64())])
TRAINED = pa.schema([("label", pa.string()), ("job", pa.string()), ("result", pa.string()), ("error", pa.string())])


class TrainStage(Stage):
    name = "train"
    output_schema = TRAINED
    # Training a pair is retried by the executor a bounded number of times; no markers.
    keeps_attempts = False

    def __init__(self, config, output: str | None = None, device: str | None = None, threads: int | None = None,
                 store: str = "") -> None:
        super().__init__(config, output, device, threads)
        self.store = store

    @property
    def max_attempts(self) -> int:
        return self.config.slider_training.resources.max_retries + 1

    def setup(self) -> None:
        from pipeline.train.sliders import SliderTrainer

        self.trainer = SliderTrainer(self.config, self.store, self.device_override, self.threads)

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from pipeline.train.sliders import SliderJob

        out = []
        for row in rows:
            job = SliderJob(**{k: row[k] for k in JOB.names})
            try:
                result, error = json.dumps(self.trainer.train(job)), None
            except Exception as err:  # recorded per pair; the others go on
                result, error = None, f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=4)}"
            out.append({"label": job.label, "job": json.dumps(job.to_dict()), "result": result, "error": error})
        return out


def train_chain(cfg, store: str) -> Chain:
    """One pool of training actors at ``slider_training.resources`` (no memory projection: the
    projection knows the build's stages)."""
    return Chain(cfg, [StageSpec(TrainStage, {"store": store}, resources=cfg.slider_training.resources, batch_size=1)])
