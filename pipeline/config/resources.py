"""``resources``: Ray resources of each stage's actor pool."""

from __future__ import annotations

from pydantic import Field, model_validator

from pipeline.config.base import Strict
from pipeline.io import bounds


class StageResources(Strict):
    """Ray resources of one stage's actor pool."""

    num_gpus: float = Field(0.0, ge=0, description="GPUs per actor (fractions pack actors on a GPU)")
    num_cpus: float = Field(1.0, gt=0)
    batch_size: int = Field(1, ge=1, le=bounds.MAX_BATCH, description="rows per map_batches call")
    pool_size: int = Field(1, ge=1, le=bounds.MAX_BATCH, description="actors started at once")
    max_pool_size: int | None = Field(None, ge=1, description="autoscale up to this many actors")
    max_retries: int = Field(2, ge=0, description="restarts of a crashed actor before items are failed")

    @model_validator(mode="after")
    def _pool(self) -> "StageResources":
        if self.max_pool_size is not None and self.max_pool_size < self.pool_size:
            raise ValueError(f"max_pool_size ({self.max_pool_size}) must be >= pool_size ({self.pool_size})")
        return self


class ClassifyResources(StageResources):
    """The classify pool, with an optional memory budget per actor."""

    memory_budget_gb: float | None = Field(
        None,
        gt=0,
        description="GB one classify actor may use on its device: the classifiers are packed into groups whose "
        "projected memory (weights + activations at the batch size) fits, each group its own actor pool; "
        "unset: one pool runs every classifier",
    )


class Resources(Strict):
    generate: StageResources = StageResources(num_gpus=1.0, batch_size=1)
    filter: StageResources = StageResources(num_gpus=0.25, batch_size=8)
    classify: ClassifyResources = ClassifyResources(num_gpus=0.25, batch_size=8)
    write: StageResources = StageResources(num_cpus=1.0, batch_size=64)
    # Reading existing images (evaluate): light I/O, batches the size of the next stage's.
    load: StageResources = StageResources(num_cpus=1.0, batch_size=8)
    # Adding predictions of new classifiers to committed shards (one shard per batch).
    reclassify: StageResources = StageResources(num_gpus=0.25, batch_size=1)
