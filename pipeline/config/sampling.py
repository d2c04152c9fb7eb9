"""``sampling``: a sequential, stratified build whose budget is set by precision (docs/adaptive.md).

Off by default (the section absent): every (class, shift) gets every seed of
``benchmark.seeds``.  With the section, a pilot gives every (class, shift) stratum its first
``pilot`` seeds; each further round gives ``round_size`` more trajectories to the strata whose
seeds shrink the widest intervals most per UNet evaluation (Neyman allocation), until every
headline number's interval is within its target or ``max_images`` is reached.  Seeds are
always taken in the order of ``benchmark.seeds``, so an adaptive build's trajectories are a
subset of the uniform build over the same seeds.
"""

from __future__ import annotations

from pydantic import Field

from pipeline.config.base import Strict


class SamplingSpec(Strict):
    """Targets, cap, pilot and round size of an adaptive build."""

    target: float = Field(
        ..., gt=0.0, le=1.0,
        description="half-width of the accuracy and accuracy-drop intervals to reach (a fraction, e.g. 0.1)",
    )
    failure_point_target: float | None = Field(
        None, gt=0.0,
        description="half-width of the mean failure point's interval per (classifier, shift), in scale units; "
                    "default: target x the largest scale",
    )
    max_images: int = Field(..., ge=1, description="cap on the build's images")
    pilot: int = Field(2, ge=2, description="seeds every (class, shift) stratum gets first (2 or more: a variance)")
    round_size: int = Field(..., ge=1, description="trajectories each round after the pilot adds")
    level: float = Field(0.95, gt=0.5, lt=1.0, description="two-sided level of the intervals")

    def fp_target(self, max_scale: float) -> float:
        return self.failure_point_target if self.failure_point_target is not None else self.target * max_scale


def check_sampling(spec: SamplingSpec | None, seeds: list[int], pilot_images: int) -> None:
    """The checks across sections (a ValueError naming the key): the seeds must leave room
    beyond the pilot, and the cap must hold the pilot's images."""
    if spec is None:
        return
    if len(seeds) <= spec.pilot:
        raise ValueError(
            f"benchmark.seeds: sampling draws its rounds from benchmark.seeds, whose {len(seeds)} seed(s) leave "
            f"nothing beyond the pilot of {spec.pilot} to extend; give a seed range such as '1..64'"
        )
    if spec.max_images < pilot_images:
        raise ValueError(
            f"sampling.max_images: {spec.max_images} is below the pilot's {pilot_images} images "
            f"({spec.pilot} seeds for every (class, shift) at every scale)"
        )
