"""An adaptive build's rounds: which seeds each (class, shift) stratum gets (docs/adaptive.md).

Pure functions of numbers, no I/O.  A stratum's seeds are always the first ``n`` of
``benchmark.seeds`` (ids and seeds from coordinates, as a uniform build's), so an adaptive
build is a subset of the uniform build over the same seeds.  The pilot gives every stratum
``pilot`` seeds; each later round adds up to ``round_size`` trajectories by the greedy form of
Neyman allocation: one trajectory at a time to the stratum whose next trajectory removes the
most (target-normalised) variance per UNet evaluation, ``load_h (1/n_h - 1/(n_h+1)) / c_h``,
which converges to n_h ∝ W_h σ_h / √c_h.  A round ends early once the variances estimated so
far project every target met, so the last round does not overshoot.  :func:`schedule` replays the rounds from what is
committed, so a resumed build makes the same allocation as an uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from pipeline.plan import WorkUnit

Stratum = tuple[int, str]  # (class id, shift)
Allocation = tuple[int, ...]  # seeds per stratum, in the order of the strata list

STOP_TARGETS = "targets met"
STOP_CAP = "cap reached"
STOP_SEEDS = "seeds exhausted"


def strata_of(classes: Sequence[int], shifts: Sequence[str]) -> list[Stratum]:
    """Every (class, shift) stratum, classes outer (the order of :func:`pipeline.plan.plan_units`)."""
    return [(int(c), s) for c in classes for s in shifts]


def allocate(n: Sequence[int], load: Sequence[float], cost: Sequence[float], extra: int, n_max: int,
             images: Sequence[int], image_budget: int, enough: Callable[[Allocation], bool] | None = None) -> Allocation:
    """``n`` plus up to ``extra`` trajectories, one at a time to the stratum with the largest
    ``load_h (1/n_h - 1/(n_h + 1)) / cost_h`` (ties: the first stratum), never beyond ``n_max``
    seeds nor ``image_budget`` images (``images[h]``: a trajectory's images).  A stratum with
    zero load gets nothing: its intervals are within their targets.  ``enough``: whether an
    allocation is projected to meet every target (the variances as estimated now); the round
    ends there rather than overshoot by the rest of ``extra``."""
    out = [int(v) for v in n]
    budget = int(image_budget)
    for _ in range(int(extra)):
        if enough is not None and out != list(n) and enough(tuple(out)):
            break
        best, gain = -1, 0.0
        for h, (nh, lh, ch) in enumerate(zip(out, load, cost)):
            if nh >= n_max or images[h] > budget or lh <= 0:
                continue
            g = float(lh) / (nh * (nh + 1) * float(ch)) if nh else float("inf")
            if g > gain:
                best, gain = h, g
        if best < 0:
            break
        out[best] += 1
        budget -= images[best]
    return tuple(out)


@dataclass
class Schedule:
    """The rounds replayed so far: ``rounds[k]`` is the cumulative allocation of round k (round 0:
    the pilot).  ``stop`` is why the build ends (:data:`STOP_TARGETS`, :data:`STOP_CAP`,
    :data:`STOP_SEEDS`) once the last round is committed, None while it is still to make."""

    strata: list[Stratum]
    rounds: list[Allocation] = field(default_factory=list)
    stop: str | None = None

    @property
    def current(self) -> Allocation:
        return self.rounds[-1]

    def seeds_of(self, seeds: Sequence[int]) -> dict[Stratum, list[int]]:
        return {h: list(seeds[:n]) for h, n in zip(self.strata, self.current)}


def schedule(strata: list[Stratum], n_seeds: int, pilot: int, round_size: int, max_images: int,
             images: Sequence[int], cost: Sequence[float], present: Callable[[Allocation], bool],
             assess: Callable[[Allocation], tuple[list[float], bool]]) -> Schedule:
    """Replay the rounds: from the pilot, while a round's trajectories are all ``present``
    (committed, or failed), ``assess`` it (per-stratum load, whether every target is met and,
    optionally, a projection: whether an allocation would meet them, :func:`allocate`'s
    ``enough``) and allocate the next.  Ends at the first round still to make, or with the reason to stop."""
    alloc: Allocation = tuple(min(pilot, n_seeds) for _ in strata)
    out = Schedule(strata, [alloc])
    while present(alloc):
        load, met, *projection = assess(alloc)
        if met:
            out.stop = STOP_TARGETS
            return out
        spent = sum(a * i for a, i in zip(alloc, images))
        new = allocate(alloc, load, cost, round_size, n_seeds, images, max_images - spent, *projection)
        if new == alloc:
            # Nothing added: the strata whose intervals would still shrink have every seed, or none fits the cap.
            wanting = any(a < n_seeds and lh > 0 for a, lh in zip(alloc, load))
            out.stop = STOP_CAP if wanting else STOP_SEEDS
            return out
        alloc = new
        out.rounds.append(alloc)
    return out


def adaptive_units(sched: Schedule, seeds: Sequence[int], class_name: Callable[[int], str],
                   done: set[str] | frozenset[str]) -> list[WorkUnit]:
    """Work units of the current round's trajectories not in ``done``: per (class, seed) the
    shifts whose stratum has that seed (classes, then seeds, then shifts in the strata's order)."""
    from pipeline.plan import trajectory_id

    wanted = sched.seeds_of(seeds)
    classes = list(dict.fromkeys(c for c, _ in sched.strata))
    units = []
    for c in classes:
        for seed in seeds:
            todo = tuple(s for (cc, s) in sched.strata if cc == c and seed in wanted[(cc, s)]
                         and trajectory_id(s, c, seed) not in done)
            if todo:
                units.append(WorkUnit(c, seed, todo, class_name(c)))
    return units
