"""Whether a chain's actor pools can start on a cluster, before any of them is asked for.

Ray places each actor on a node that holds its whole request (CPUs, GPUs, ``memory``) and
waits, without a word, for one that never comes.  So before the pools start:

* an actor that fits no node (a fixed cluster) and no node type (an autoscaling one) is
  refused: :class:`Unplaceable` names the stage, its request and what the nodes offer;
* on a fixed cluster the pools must also all hold their first actors at once, beside what is
  already taken (a job's driver reserves a CPU): Ray starts a chain's actors in no fixed order,
  and a downstream pool that takes the last CPU first leaves the generate actor waiting for
  ever.  :func:`fit_fixed` scales the pools' CPU and memory requests to fit, as a local Ray
  is sized to fit, and refuses when even scaled they cannot be placed.

Pure functions over plain numbers: the cluster is read by :mod:`pipeline.executors.cluster`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from pipeline.errors import CnsbenchError

GIB = 1024**3
KEYS = ("CPU", "GPU", "memory")
MIN_CPU = 0.01  # the smallest CPU share a scaled actor asks for (Ray counts in 1e-4 steps)


class Unplaceable(CnsbenchError):
    """A pool whose actors no node of the cluster can hold (exit 2: bad input for this cluster)."""


@dataclass(frozen=True)
class Ask:
    """What one pool asks for: per actor, and how many actors it starts with."""

    name: str
    cpu: float
    gpu: float
    memory: int  # bytes; 0: none declared
    actors: int = 1

    def request(self) -> dict[str, float]:
        return {"CPU": self.cpu, "GPU": self.gpu, "memory": float(self.memory)}


def describe(resources: dict[str, float]) -> str:
    """``{'CPU': 2, 'GPU': 1, 'memory': 2**31}`` as ``2 CPU, 1 GPU, 2.0 GiB memory``."""
    parts = []
    for key in KEYS:
        value = float(resources.get(key, 0) or 0)
        if key == "memory":
            parts.append(f"{value / GIB:.1f} GiB memory" if value else "no memory declared")
        elif value or key == "CPU":
            parts.append(f"{value:g} {key}")
    return ", ".join(parts)


def fits(request: dict[str, float], node: dict[str, float], *, memory_declared: bool = True) -> bool:
    """Whether one actor's ``request`` fits in ``node``'s resources.  A node type that declares
    no memory offers none to an autoscaler starting it from zero (``memory_declared`` False)."""
    for key in KEYS:
        want = float(request.get(key, 0) or 0)
        if key == "memory" and not memory_declared and "memory" not in node:
            have = 0.0
        else:
            have = float(node.get(key, 0) or 0)
        if want > have + 1e-9:
            return False
    return True


def check_actors(asks: Sequence[Ask], offers: dict[str, dict[str, float]], where: str) -> None:
    """Raise :class:`Unplaceable` for every pool whose actor fits none of ``offers``
    (node or node type name -> its resources); ``where`` says what they are."""
    bad = [a for a in asks if not any(fits(a.request(), node, memory_declared=False) for node in offers.values())]
    if not bad:
        return
    lines = [f"{len(bad)} actor pool(s) ask for more than any {where} offers, so Ray would wait for them forever:"]
    lines += [f"  {a.name}: one actor asks for {describe(a.request())}" for a in bad]
    lines.append(f"  {where}s: " + "; ".join(f"{name}: {describe(res)}" for name, res in offers.items()))
    hints = []
    if any(a.gpu > 0 for a in bad) and not any(float(r.get("GPU", 0) or 0) > 0 for r in offers.values()):
        hints.append("run the GPU stages on a cluster with GPU nodes, or set resources.<stage>.num_gpus: 0")
    if any(a.memory for a in bad):
        hints.append("declare each node type's memory in the cluster config (resources: {memory: BYTES}), "
                     "or choose larger nodes")
    if hints:
        lines.append("  to fix: " + "; ".join(hints))
    raise Unplaceable("\n".join(lines))


def _first_fit(asks: Sequence[Ask], free: list[dict[str, float]]) -> bool:
    """Whether every actor of ``asks`` can be placed at once on ``free`` (first fit, largest first)."""
    free = [dict(n) for n in free]
    actors = sorted((a for a in asks for _ in range(a.actors)), key=lambda a: (a.gpu, a.cpu, a.memory), reverse=True)
    for a in actors:
        for node in free:
            if fits(a.request(), node):
                for key, value in a.request().items():
                    node[key] = float(node.get(key, 0) or 0) - value
                break
        else:
            return False
    return True


@dataclass(frozen=True)
class Fit:
    """The asks as they will be made, and what was scaled (empty: nothing)."""

    asks: list[Ask]
    notes: list[str]


def fit_fixed(asks: Sequence[Ask], free: list[dict[str, float]]) -> Fit:
    """Scale the CPU and memory requests of ``asks`` so that all their first actors fit in the
    nodes' ``free`` resources at once; :class:`Unplaceable` when they cannot, naming the pools
    and what the cluster has.  GPUs are never scaled here: a GPU is a device, not a share."""
    asks = list(asks)
    if _first_fit(asks, free):
        return Fit(asks, [])
    notes = []
    for key in ("CPU", "memory"):
        have = sum(max(0.0, float(n.get(key, 0) or 0)) for n in free)
        want = sum((a.cpu if key == "CPU" else a.memory) * a.actors for a in asks)
        if want <= have or want <= 0:
            continue
        # A little under the exact share: each node's leftover is a fraction of one actor.
        scale = have / want * 0.95
        if key == "CPU":
            asks = [replace(a, cpu=max(MIN_CPU, math.floor(a.cpu * scale * 1e4) / 1e4)) for a in asks]
            notes.append(f"the actor pools ask for {want:g} CPUs and the cluster has {have:g} free: every pool's "
                         f"num_cpus is scaled by {scale:.3f} so that all of them can start")
        else:
            asks = [replace(a, memory=int(a.memory * scale)) for a in asks]
            notes.append(f"the actor pools' projected memory ({want / GIB:.1f} GiB) exceeds the cluster's free "
                         f"{have / GIB:.1f} GiB: every pool's memory request is scaled by {scale:.3f}")
    if _first_fit(asks, free):
        return Fit(asks, notes)
    lines = ["the actor pools cannot all start at once on this cluster, so a pool would wait forever for one "
             "that holds what it needs:"]
    lines += [f"  {a.name}: {a.actors} actor(s) of {describe(a.request())}" for a in asks]
    lines += ["  free on the nodes: " + "; ".join(describe(n) for n in free)]
    lines.append("  to fix: add nodes, or lower resources.<stage>.pool_size / num_gpus")
    raise Unplaceable("\n".join(lines))
