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
    sampler's semantics (:meth:`pipeline.models.sampler.SliderSampler.pre_window` and
    ``run_branches``, as ``generate_group`` runs them); returns ``({point: PIL image},
    UNet sample-evaluations, seconds)``."""
    start = time.perf_counter()
    sampler.reset_evals()
    neg, pos = sampler.prompt_embeds(class_id)
    shifts = sorted({s for s, _ in points})
    sampler.bank.reserve(len(shifts))
    sliders = {s: sampler.load_slider(class_id, s) for s in shifts}
    key = (id(sampler), class_id, seed)
    state = cache.get(key)
    if state is None:
        state = sampler.pre_window(seed, neg, pos)
        cache.put(key, state)
    finals = sampler.run_branches(state, neg, pos, sliders, [(s, float(m)) for s, m in points])
    images = sampler.decode_finals(finals)
    return images, float(sampler.unet_evals), time.perf_counter() - start
