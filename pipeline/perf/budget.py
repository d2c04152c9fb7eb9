"""A GPU budget split among a build's GPU pools, in proportion to their projected GPU time.

One function, :func:`split`, decides every pool's actor range for a budget of N GPUs: the build
(the pools' ``max_size``), ``cnsbench validate`` (the ranges it prints) and ``cnsbench estimate
--gpus N`` (the wall time of the pools the build will start) all call it, with the pools'
projected GPU times from :func:`pipeline.perf.estimate.pool_seconds`
(:func:`pipeline.perf.estimate.config_split` for a config's own pools).

* Each GPU pool's weight is its projected GPU time over the GPU time of all of them
  (:func:`pipeline.perf.estimate.pool_seconds`: the estimate's latency model; for the paper's build about 85 %
  generate).
* Every pool starts at ``pool_size`` actors; the rest of the budget is handed out an actor
  (its ``num_gpus``) at a time to the pool with the most work per GPU it holds, while one
  more actor fits the budget: the pools' GPUs come out in proportion to their GPU time as
  far as whole actors allow, and their sum stays within the budget (unless the pools'
  ``pool_size`` alone exceed it).
* A pool never grows beyond its proportional share rounded up to whole actors, nor beyond what
  the plan can use (generate: one per work unit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import BuildConfig


@dataclass(frozen=True)
class GpuPool:
    """One GPU pool as the split sees it."""

    name: str
    num_gpus: float  # per actor
    pool_size: int  # actors it starts with
    seconds: float  # projected GPU time on one GPU
    max_actors: int | None = None  # what the plan can use (None: no bound)


@dataclass(frozen=True)
class PoolRange:
    """A pool's actor range under a budget: starts at ``min_size``, may grow to ``max_size``."""

    name: str
    num_gpus: float
    min_size: int
    max_size: int
    share: float  # the pool's proportional share of the budget, in GPUs

    @property
    def gpus(self) -> float:
        """GPUs its actors hold at ``max_size``."""
        return self.max_size * self.num_gpus


def split(budget: float, pools: Sequence[GpuPool]) -> list[PoolRange]:
    """Each of ``pools``' actor range under a budget of ``budget`` GPUs (see the module doc)."""
    if not pools:
        return []
    total = sum(max(0.0, p.seconds) for p in pools)
    weights = [max(0.0, p.seconds) / total if total > 0 else 1 / len(pools) for p in pools]

    def cap(k: int) -> int:
        # Its share of the budget, rounded up to whole actors, and what the plan can use.
        p = pools[k]
        share = math.ceil(budget * weights[k] / p.num_gpus - 1e-9) if p.num_gpus > 0 else p.pool_size
        return max(p.pool_size, min(share, p.max_actors if p.max_actors is not None else share))

    # Every pool starts at its pool_size; the rest of the budget goes an actor at a time to
    # the pool with the most projected work per GPU it holds (the stage that would finish
    # last), so the stages' times come out as even as whole actors allow: that is the split
    # in proportion to their GPU time, and never above the budget.
    actors = [p.pool_size for p in pools]
    left = budget - sum(n * p.num_gpus for n, p in zip(actors, pools))
    while True:
        room = [i for i, p in enumerate(pools) if 0 < p.num_gpus <= left + 1e-9 and actors[i] < cap(i)]
        if not room:
            break
        i = max(room, key=lambda k: (weights[k] / (actors[k] * pools[k].num_gpus), -k))
        actors[i] += 1
        left -= pools[i].num_gpus
    return [PoolRange(p.name, p.num_gpus, p.pool_size, n, budget * w) for p, n, w in zip(pools, actors, weights)]


def work_units(cfg: "BuildConfig") -> int:
    """The build's generation units (class, seed): the most generate actors it can use."""
    from pipeline import plan

    summary = plan.summarize(cfg)
    return max(1, summary.n_classes * summary.n_seeds)


def config_pools(cfg: "BuildConfig") -> list[tuple[str, str, float, int, list[int] | None]]:
    """The GPU pools a build of ``cfg`` starts, without building its chain: ``(name, stage,
    num_gpus, pool_size, classifier members)``; generate, filter, each classifier group."""
    from pipeline.perf.memory import classifier_groups

    res = cfg.resources
    out = []
    if res.generate.num_gpus > 0:
        out.append(("generate", "generate", res.generate.num_gpus, res.generate.pool_size, None))
    if cfg.filter.enabled and res.filter.num_gpus > 0:
        out.append(("filter", "filter", res.filter.num_gpus, res.filter.pool_size, None))
    if res.classify.num_gpus > 0:
        groups = classifier_groups(cfg)
        for k, members in enumerate(groups, 1):
            name = f"classify group {k} of {len(groups)}" if len(groups) > 1 else "classify"
            out.append((name, "classify", res.classify.num_gpus, res.classify.pool_size,
                        list(members) if len(groups) > 1 else None))
    return out
