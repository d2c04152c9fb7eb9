"""Refinement points of a (class, seed) unit from one shared prefix, the prefix kept for the next round.

A build's slider sampler (:meth:`pipeline.models.sampler.SliderSampler.generate_group`)
makes ``shifts x scales`` images plus scale 0 from one pre-window prefix.  A refinement
round asks each trajectory of a unit for one image at its own scale, so that call would
make a cross product (or, one call per scale, a prefix and a scale-0 branch per call).
:func:`generate_points` makes exactly the asked (shift, scale) branches, in chunks of
``generator.branch_batch_size`` as the build's window runs them, continuing from the unit's
prefix: the same initial noise, the same steps before the window (the slider off), then
each branch with its slider at its multiplier.

The prefix -- the latent and the scheduler after the last step before the window -- is
cached in the generating process (:class:`PrefixCache`), so later rounds of the same unit
start at the window: it costs a few kilobytes per unit (a 4 x 96 x 96 latent at SD2's 768
px), against the pre-window UNet steps that recomputing it costs every round
(``bench/refine.py`` measures both; docs/refine.md).
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from typing import Any

import torch


class PrefixCache:
    """Pre-window states of (class, seed) units, least recently used dropped beyond ``capacity``."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self.states: OrderedDict[Any, tuple[torch.Tensor, Any, int]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: Any) -> tuple[torch.Tensor, Any, int] | None:
        state = self.states.get(key)
        if state is not None:
            self.states.move_to_end(key)
            self.hits += 1
        else:
            self.misses += 1
        return state

    def put(self, key: Any, state: tuple[torch.Tensor, Any, int]) -> None:
        self.states[key] = state
        self.states.move_to_end(key)
        while len(self.states) > self.capacity:
            self.states.popitem(last=False)


PREFIXES = PrefixCache()
"""The process's cache: kept across rounds and classifiers while the process lives (the
in-process runner; on Ray, an actor pool lives one round)."""


@torch.inference_mode()
def generate_points(sampler: Any, class_id: int, seed: int, points: list[tuple[str, float]],
                    cache: PrefixCache = PREFIXES) -> tuple[dict[tuple[str, float], Any], float, float]:
    """The images of ``points`` ((shift, nonzero scale) of one (class, seed)) with the slider
    sampler's semantics; returns ``({point: PIL image}, UNet sample-evaluations, seconds)``."""
    start = time.perf_counter()
    sampler._evals = 0
    neg, pos = sampler.prompt_embeds(class_id)
    shifts = sorted({s for s, _ in points})
    sampler.bank.reserve(len(shifts))
    sliders = {s: sampler.load_slider(class_id, s) for s in shifts}
    key = (id(sampler), class_id, seed)
    state = cache.get(key)
    if state is None:
        state = prefix(sampler, seed, neg, pos)
        cache.put(key, state)
    latents, sched, first_window = state
    timesteps = sched.timesteps

    finals: dict[tuple[str, float], torch.Tensor] = {}
    size = sampler.spec.branch_batch_size
    for lo in range(0, len(points), size):
        chunk = points[lo : lo + size]
        n = len(chunk)
        pad = size - n if sampler.compiled else 0  # compiled: every window forward has the build's shapes
        csched = copy.deepcopy(sched)
        lat = latents.expand(n + pad, -1, -1, -1).clone()
        rows = [sliders[s] for s, _ in chunk] + [None] * pad
        mults = [float(m) for _, m in chunk] + [0.0] * pad
        sampler.bank.route(rows * 2 if sampler.do_cfg else rows, mults * 2 if sampler.do_cfg else mults)
        cond = pos.expand(n + pad, -1, -1)
        for t in timesteps[first_window:]:
            lat = sampler._step(csched, lat, t, neg, cond)
        sampler.bank.clear_route()
        for b, point in enumerate(chunk):
            finals[point] = lat[b : b + 1]
    images = sampler._decode(finals)
    return images, float(sampler._evals), time.perf_counter() - start


def prefix(sampler: Any, seed: int, neg: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, Any, int]:
    """The unit's state where the window starts: latent, scheduler, index of the first window step."""
    sched = sampler._timesteps()
    latents = sampler._initial_latents(seed)
    sampler.bank.clear_route()
    first_window = len(sched.timesteps)
    for i, t in enumerate(sched.timesteps):
        if int(t) <= sampler.spec.lora_timestep_threshold:
            first_window = i
            break
        latents = sampler._step(sched, latents, t, neg, pos)
    return latents, sched, first_window
