"""Ray Data executor: work units stream through one actor pool per stage.

    units --map_batches(GenerateStage)--> trajectories --FilterStage--> --ClassifyStage-->
          --WriteStage--> one row per committed shard, consumed by the driver

Each stage is a callable class in an ``ActorPoolStrategy`` pool whose size, GPUs, CPUs
and batch size come from ``resources.<stage>`` in the config; weights load once per
actor.  The driver only iterates the small per-shard rows, so its memory does not grow
with the plan.
"""

from __future__ import annotations

import os
import warnings
from typing import Callable, Iterator, Sequence

from pipeline.config import BuildConfig, StageResources
from pipeline.plan import WorkUnit


def init_ray(address: str | None, cfg: BuildConfig) -> None:
    """Connect to ``address`` or start a local Ray sized for the configured pools."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "0")
    if address or os.environ.get("RAY_ADDRESS"):
        # A Ray job's driver (`cnsbench submit`, KubeRay RayJob) gets the cluster in
        # $RAY_ADDRESS, and ray.init() refuses num_cpus/num_gpus when it connects to one.
        ray.init(address=address, log_to_driver=True)
        return
    res = cfg.resources
    pools = (res.generate, res.filter, res.classify, res.write)
    # Enough logical CPUs for one actor of every pool plus the read tasks; oversubscribing
    # logical CPUs is harmless, a pool waiting forever for a CPU is not.
    cpus = max(os.cpu_count() or 1, int(sum(p.num_cpus * p.pool_size for p in pools)) + 1)
    gpus = 0
    try:
        import torch

        gpus = torch.cuda.device_count()
    except Exception:
        pass
    needed_gpus = max(p.num_gpus for p in pools)
    ray.init(
        num_cpus=cpus,
        num_gpus=max(gpus, 1 if needed_gpus > 0 else 0),
        include_dashboard=False,
        log_to_driver=True,
        runtime_env={"env_vars": {"HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "0")}},
    )


def _pool(stage: StageResources):
    import ray

    return ray.data.ActorPoolStrategy(min_size=stage.pool_size, max_size=stage.max_pool_size or stage.pool_size)


def _remote_args(stage: StageResources, bookkept: bool) -> dict:
    # A crashed actor is restarted and its batch retried.  Stages that keep attempt markers
    # (pipeline.faults) give up on a batch by themselves after max_retries + 1 attempts, so
    # Ray may retry them without limit: that also rides out a node that is lost for a while
    # (its actors are "unavailable" until the node is declared dead and they restart
    # elsewhere).  The write stage keeps no markers and gets a bounded budget.
    retries = -1 if bookkept else stage.max_retries + 1
    return {"max_restarts": -1, "max_task_retries": retries}


def stream(
    cfg: BuildConfig,
    rows: list[dict],
    output: str,
    chain: Sequence[tuple[type, StageResources, int, dict]],
    num_blocks: int,
    on_shard: Callable[[dict], None] | None,
) -> Iterator[dict]:
    """Rows through ``chain`` (stage class, resources, batch size, extra kwargs), each an
    actor pool; yields the write stage's one row per committed shard."""
    import ray

    cfg_dict = cfg.model_dump(mode="json")
    ray.data.DataContext.get_current().enable_progress_bars = True
    ds = ray.data.from_items(list(rows), override_num_blocks=max(1, num_blocks))
    for cls, r, batch_size, extra in chain:
        kwargs = {"config": cfg_dict, "output": output, "threads": max(1, int(r.num_cpus)), **extra}
        with warnings.catch_warnings():
            # Ray 2.60 has no named parameter for bounded actor restarts/retries yet; the
            # remote-args route it deprecates is still the only way to bound them.
            warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
            ds = ds.map_batches(
                cls,
                fn_constructor_kwargs=kwargs,
                batch_size=batch_size,
                batch_format="pyarrow",
                compute=_pool(r),
                num_gpus=r.num_gpus,
                num_cpus=r.num_cpus,
                **_remote_args(r, bookkept=cls.keeps_attempts),
            )
    for row in ds.iter_rows():
        row = dict(row)
        if on_shard:
            on_shard(row)
        yield row


def run_ray(
    cfg: BuildConfig, units: list[WorkUnit], output: str, on_shard: Callable[[dict], None] | None = None
) -> Iterator[dict]:
    """A build: work units -> generate -> filter -> classify -> write."""
    from pipeline.stages.classify import ClassifyStage
    from pipeline.stages.filter import FilterStage
    from pipeline.stages.generate import GenerateStage
    from pipeline.stages.write import WriteStage

    res = cfg.resources
    chain = [
        (GenerateStage, res.generate, res.generate.batch_size, {}),
        (FilterStage, res.filter, res.filter.batch_size, {}),
        (ClassifyStage, res.classify, res.classify.batch_size, {}),
        (WriteStage, res.write, cfg.output.trajectories_per_shard, {}),
    ]
    # One work unit per block, so generation spreads across the actors from the start.
    yield from stream(cfg, [u.to_row() for u in units], output, chain, len(units), on_shard)


def run_ray_rows(
    cfg: BuildConfig,
    rows: list[dict],
    output: str,
    stages: Sequence[tuple[type, StageResources, int, dict]],
    on_shard: Callable[[dict], None] | None = None,
) -> Iterator[dict]:
    """Like :func:`run_ray`, but the stream starts from ready rows instead of work units.

    ``stages``: ``(stage class, resources, batch size, extra constructor kwargs)`` in
    order, each run as an actor pool like the build's; the write stage is appended.  Used
    by ``cnsbench evaluate`` (pointer rows -> load -> [filter ->] classify -> write).
    """
    from pipeline.stages.write import WriteStage

    chain = list(stages) + [(WriteStage, cfg.resources.write, cfg.output.trajectories_per_shard, {})]
    # Rows are light pointers; a few per block keeps the load pool busy from the start.
    yield from stream(cfg, rows, output, chain, min(len(rows), 1000), on_shard)
