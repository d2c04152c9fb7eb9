"""How each pool of a chain is sized on the cluster at hand: its actor range under the GPU
budget, and requests every node can place.

* **The GPU budget** (``resources.max_gpus``, ``--max-gpus``; on a cluster given by address
  without one, the GPUs it has at start) is split among the GPU pools by
  :func:`pipeline.perf.budget.split`: each pool's range runs from ``pool_size`` to its share
  (Ray Data's ``ActorPoolStrategy(min_size, max_size, initial_size)``).  Where the budget's GPUs
  are asked for up front or already there, a GPU pool starts at its share (its actors wait for
  their nodes); elsewhere it starts at ``pool_size`` and Ray Data grows it.
* **Placement** (:mod:`pipeline.executors.placement`): an actor that no node (type) can hold
  is refused before anything waits on it, on a local Ray as on a cluster
  (:func:`check_local_actors`); on a fixed cluster the pools' first actors must fit at once,
  and their CPU and memory requests are scaled until they do.
* **The request up front**: on an autoscaling cluster, one bundle per actor of each GPU pool's
  range (:func:`budget_bundles`), asked for at the start so that the nodes start together, and
  withdrawn once they are up and the pools' starting actors hold their GPUs
  (:func:`first_gpus`, :func:`pipeline.executors.ray_private.budget_request`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

from pipeline.executors.chain import Chain, Pool
from pipeline.executors.cluster import ClusterView
from pipeline.executors.placement import Ask, check_actors, fit_fixed

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import StageResources

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sized:
    """A pool as it will be asked for: resources (with its actor range) and memory per actor."""

    pool: Pool
    resources: "StageResources"
    memory: int | None
    starts_whole: bool = False  # started at max_size (its share), not min_size

    @property
    def min_size(self) -> int:
        return self.resources.pool_size

    @property
    def max_size(self) -> int:
        return self.resources.max_pool_size or self.resources.pool_size

    @property
    def initial_size(self) -> int:
        return self.max_size if self.starts_whole else self.min_size


def gpu_budget(chain: Chain, view: ClusterView, notice: Callable[[str], None]) -> float | None:
    """The build's GPU budget: ``resources.max_gpus``, else on a cluster given by address the
    GPUs it has at start; None on a local Ray without one (the pools as configured)."""
    max_gpus = getattr(chain.cfg.resources, "max_gpus", None)
    if max_gpus is not None:
        return float(max_gpus)
    if view.local:
        return None
    have = view.total("GPU")
    if have <= 0 and any(p.resources.num_gpus > 0 for p in chain.pools):
        notice("the cluster has no GPU at start: each GPU pool starts with its pool_size actors and grows no "
               "further; pass --max-gpus N (resources.max_gpus) to let the pools grow as GPU nodes join")
        return None
    return have


def _ranges(chain: Chain, sized: list[Sized], budget: float) -> dict[str, int]:
    """Pool name -> its ``max_size`` under ``budget`` (:func:`pipeline.perf.budget.split`)."""
    from pipeline.perf import budget as split_budget
    from pipeline.perf.estimate import pool_seconds

    gpu = [s for s in sized if s.resources.num_gpus > 0]
    if not gpu:
        return {}
    try:
        seconds = pool_seconds(chain.cfg, [(s.pool.name, s.pool.stage, s.pool.members) for s in gpu])
    except Exception as err:  # noqa: BLE001 - a projection is advice: the pools share the budget evenly
        log.info("no GPU-time projection for the budget's split (%s): the GPU pools share it evenly", err)
        seconds = [1.0] * len(gpu)
    units = split_budget.work_units(chain.cfg)
    pools = [split_budget.GpuPool(s.pool.name, s.resources.num_gpus, s.resources.pool_size, t,
                                  units if s.pool.stage == "generate" else None) for s, t in zip(gpu, seconds)]
    return {r.name: r.max_size for r in split_budget.split(budget, pools)}


def size_pools(chain: Chain, sized: list[Sized], view: ClusterView, notice: Callable[[str], None]) -> list[Sized]:
    """``sized`` (each pool's resources after the local adjustments) with its actor range under
    the GPU budget, refused or scaled to what the cluster can place (see the module doc)."""
    budget = gpu_budget(chain, view, notice)
    if budget is not None:
        if view.local:
            budget = min(budget, view.total("GPU"))
        ranges = _ranges(chain, sized, budget)
        # The GPU pools start at their whole share where its GPUs are there or asked for: on an
        # autoscaling cluster (the budget requested up front; each actor waits for its node), and
        # on a fixed cluster that holds the budget.  Ray Data's own growth adds actors as their
        # queues fill, about one step per ten seconds: at 4 GPUs from zero nodes, the generate
        # actors began work 17, 37 and 54 s into the build, the nodes having been up since
        # 18 s (BENCHMARKS.md, "Pools that start at their share (2026-11-28)").
        whole = (view.autoscaling and upfront_request()) or budget <= view.total("GPU") + 1e-6
        sized = [replace(s, resources=s.resources.model_copy(update={"max_pool_size": ranges[s.pool.name]}),
                         starts_whole=whole)
                 if s.pool.name in ranges else s for s in sized]
        if ranges:
            notice(f"GPU budget {budget:g}: " + ", ".join(
                f"{s.pool.name} {s.min_size}-{s.max_size} actors" for s in sized if s.pool.name in ranges)
                + ("; each GPU pool starts at its maximum" if whole else ""))
    asks = [Ask(s.pool.name, s.resources.num_cpus, s.resources.num_gpus, int(s.memory or 0), s.min_size)
            for s in sized]
    if view.autoscaling:
        check_actors(asks, view.offers(), "node type or node")
        return sized
    check_actors(asks, {f"node {nid[:8]}": res for nid, res in view.nodes.items()}, "node")
    fit = fit_fixed(asks, list(view.free.values()))
    for note in fit.notes:
        notice(note)
    out = []
    for s, a in zip(sized, fit.asks):
        if a.cpu != s.resources.num_cpus:
            s = replace(s, resources=s.resources.model_copy(update={"num_cpus": a.cpu}))
        if s.memory and a.memory != s.memory:
            s = replace(s, memory=a.memory)
        out.append(s)
    return out


def check_local_actors(chain: Chain, view: ClusterView, cpu_only: bool) -> None:
    """On a local Ray, refuse (:class:`~pipeline.executors.placement.Unplaceable`, the message a
    cluster's nodes give) a pool whose one actor asks for more GPUs or memory than the machine has.

    A local Ray shares its GPUs and memory out among the pools (their requests are scaled to
    fit together), and that scaling also made a single actor projected at 161 GB fit a smaller
    machine: it ran without a word until the machine ran out.  So each actor's own request, as
    configured and projected, is checked against the machine first; without a GPU the GPU
    stages run on the CPU and only their memory is checked."""
    if not view.local:
        return
    asks = []
    for pool in chain.pools:
        try:
            memory = pool.memory()
        except Exception as err:  # noqa: BLE001 - a projection is advice: the pool asks for none
            log.debug("no memory projection for %s: %s", pool.name, err)
            memory = None
        gpus = 0.0 if cpu_only else pool.resources.num_gpus
        asks.append(Ask(pool.name, pool.resources.num_cpus, gpus, int(memory or 0)))
    check_actors(asks, {f"node {nid[:8]}": res for nid, res in view.nodes.items()}, "node")


# Set to 0, the budget is not requested up front: the autoscaler then adds nodes at its own pace,
# as the pools' pending actors ask (bench/autoscale.py measures the ramp both ways).
UPFRONT_ENV = "CNSBENCH_UPFRONT_REQUEST"


def upfront_request() -> bool:
    return os.environ.get(UPFRONT_ENV, "1") != "0"


def first_gpus(sized: list[Sized]) -> float:
    """The GPUs the pools' starting actors (``initial_size`` each) hold."""
    return sum(s.initial_size * s.resources.num_gpus for s in sized if s.resources.num_gpus > 0)


def budget_bundles(sized: list[Sized]) -> list[dict[str, float]]:
    """One bundle per actor of each GPU pool's range: what an autoscaler is asked for up front."""
    out = []
    for s in sized:
        if s.resources.num_gpus <= 0:
            continue
        bundle = {"CPU": s.resources.num_cpus, "GPU": s.resources.num_gpus}
        if s.memory:
            bundle["memory"] = float(s.memory)
        out += [dict(bundle) for _ in range(s.max_size)]
    return out
