"""``resources``: Ray resources of each stage's actor pool, and how the model stages run.

The filter and classify stages also say in which numeric precision their models run
(``precision``, ``channels_last``; :mod:`pipeline.models.precision`) and may leave their batch
size to the memory projection (``batch_size: auto``, :func:`pipeline.perf.memory.stage_batch_size`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.config.base import Strict
from pipeline.io import bounds


class StageResources(Strict):
    """Ray resources of one stage's actor pool."""

    num_gpus: float = Field(0.0, ge=0, description="GPUs per actor (fractions pack actors on a GPU)")
    num_cpus: float = Field(1.0, gt=0, description="CPUs per actor; also the stage's torch threads under every runner")
    batch_size: int = Field(1, ge=1, le=bounds.MAX_BATCH, description="rows per map_batches call")
    pool_size: int = Field(1, ge=1, le=bounds.MAX_BATCH, description="actors started at once")
    max_pool_size: int | None = Field(None, ge=1, description="autoscale up to this many actors")
    max_retries: int = Field(2, ge=0, description="restarts of a crashed actor before items are failed")

    @model_validator(mode="after")
    def _pool(self) -> "StageResources":
        if self.max_pool_size is not None and self.max_pool_size < self.pool_size:
            raise ValueError(f"max_pool_size ({self.max_pool_size}) must be >= pool_size ({self.pool_size})")
        return self


# Numeric precision of a model stage: float32 (TF32 off for matmuls and convolutions: the
# paper's numbers), tf32 (float32 storage, TF32 tensor-core matmuls and convolutions on a
# CUDA GPU; plain float32 elsewhere), bfloat16 (weights and inputs in bfloat16, autocast).
Precision = Literal["float32", "tf32", "bfloat16"]
PRECISIONS: tuple[str, ...] = ("float32", "tf32", "bfloat16")
# Resource keys that change a build's numbers (filter scores, predictions), unlike pools and
# batch sizes: part of the config hash when not float32, and fixed for the life of an output.
OUTPUT_CHANGING: tuple[str, ...] = ("resources.filter.precision", "resources.classify.precision")


def output_changing(resources: dict) -> dict[str, str]:
    """The :data:`OUTPUT_CHANGING` keys of a resolved ``resources`` section that are not float32."""
    out = {}
    for key in OUTPUT_CHANGING:
        _, stage, field = key.split(".")
        value = (resources.get(stage) or {}).get(field, "float32")
        if value != "float32":
            out[key] = value
    return out


class ModelStageResources(StageResources):
    """A stage that runs image models (filter, classify): also its precision and memory budget."""

    batch_size: int | Literal["auto"] = Field(
        1,
        description="rows per map_batches call; auto: the largest batch whose projected memory fits "
        "memory_budget_gb (or num_gpus x resources.device_memory_gb), printed by `cnsbench validate`",
    )
    precision: Precision = Field(
        "float32", description="float32 (the paper's numbers under protocol cns) | tf32 | bfloat16"
    )
    channels_last: bool = Field(False, description="models and inputs in channels-last memory format")
    memory_budget_gb: float | None = Field(
        None, gt=0, description="GB one actor may use on its device; bounds batch_size auto"
    )

    @field_validator("batch_size", mode="before")
    @classmethod
    def _batch(cls, value: object) -> object:
        whole = isinstance(value, int) and not isinstance(value, bool)
        if value != "auto" and not (whole and 1 <= value <= bounds.MAX_BATCH):  # type: ignore[operator]
            raise ValueError(f"must be auto or an integer in 1..{bounds.MAX_BATCH}")
        return value


class ClassifyResources(ModelStageResources):
    """The classify pool, with an optional memory budget per actor."""

    memory_budget_gb: Annotated[float, Field(gt=0)] | Literal["auto"] | None = Field(
        None,
        description="GB one classify actor may use on its device: the classifiers are packed into groups whose "
        "projected memory (weights + activations at the batch size) fits, each group its own actor pool; "
        "auto: the actor's share (num_gpus) of the device found at run time, less the allocator's reserve "
        "(pipeline.perf.device); unset: one pool runs every classifier; also bounds batch_size auto",
    )


class Resources(Strict):
    generate: StageResources = StageResources(num_gpus=1.0, batch_size=1)
    filter: ModelStageResources = ModelStageResources(num_gpus=0.25, batch_size=8)
    classify: ClassifyResources = ClassifyResources(num_gpus=0.25, batch_size=8)
    write: StageResources = StageResources(num_cpus=1.0, batch_size=64)
    # Reading existing images (evaluate): light I/O, batches the size of the next stage's.
    load: StageResources = StageResources(num_cpus=1.0, batch_size=8)
    # Adding predictions of new classifiers to committed shards (one shard per batch).
    reclassify: StageResources = StageResources(num_gpus=0.25, batch_size=1)
    device_memory_gb: float | None = Field(
        None,
        gt=0,
        description="memory of one GPU (GB): a filter or classify stage with batch_size auto and no "
        "memory_budget_gb fits its share of it (num_gpus x this)",
    )
    max_gpus: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="GPU budget of a build (`--max-gpus`): split among the GPU pools in proportion to their "
        "projected GPU time (pipeline/perf/budget.py), each pool ranging from pool_size to its share; on an "
        "autoscaling cluster the whole budget is requested up front and the pools start at their share, "
        "their actors starting as GPU nodes join. Unset: a "
        "cluster given by address uses the GPUs it has at start; a local Ray, the pools as configured",
    )

    @model_validator(mode="after")
    def _auto_batches(self) -> "Resources":
        for name in ("filter", "classify"):
            res = getattr(self, name)
            if res.batch_size == "auto" and res.memory_budget_gb is None and not (
                self.device_memory_gb and res.num_gpus > 0
            ):
                raise ValueError(
                    f"resources.{name}.batch_size: auto needs a memory to fit: set resources.{name}.memory_budget_gb, "
                    f"or resources.device_memory_gb with resources.{name}.num_gpus > 0"
                )
        return self
