"""How many UNet evaluations a build makes: the counts of the text-to-image samplers.

``SliderSampler.generate_group`` (:func:`unet_evals_per_unit`): per (class, seed) unit the
DDIM steps above the LoRA window's threshold run once, shared by every shift and scale;
then the scale-0 image and every (shift, non-zero scale) branch run the window's steps.
``PromptSampler.generate_group`` (:func:`prompt_evals_per_unit`): the plain prompt and one
branch per shift run every step (a shift's non-zero scales share its one image).  The
mask-blended loops of the transforming families (:func:`denoise_evals_per_unit`: the
generated background of ``masked_scenario``, the fills and background edits of
``object_edit``) run each of their rows over its own steps, nothing shared.  With
classifier-free guidance a step is 2 sample-evaluations.

A family states its own count (:class:`UnetCost`, ``Family.unet_cost``); the estimate asks
each family of a build through the registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import BuildConfig

TRAIN_TIMESTEPS = 1000  # SD2's DDIM scheduler: 1,000 training steps, "leading" spacing, offset 1
STEPS_OFFSET = 1


def ddim_timesteps(steps: int) -> list[int]:
    """The timesteps of SD2's DDIM scheduler for ``steps`` steps (981, 961, ..., 1 for 50)."""
    ratio = TRAIN_TIMESTEPS // steps
    return [i * ratio + STEPS_OFFSET for i in reversed(range(steps))]


def unet_evals_per_unit(steps: int, threshold: int, n_shifts: int, scales: list[float], cfg_scale: float) -> dict:
    """UNet sample-evaluations of one (class, seed) unit as the build makes them.

    The steps before the window run once; the scale-0 image and every (shift, non-zero
    scale) branch run the window's steps.  A classifier-free-guidance step counts 2."""
    timesteps = ddim_timesteps(steps)
    prefix = sum(1 for t in timesteps if t > threshold)
    window = steps - prefix
    branches = 1 + n_shifts * sum(1 for s in scales if s != 0)
    per_step = 2 if cfg_scale > 1.0 else 1
    images = n_shifts * len(scales)
    return {
        "prefix_steps": prefix,
        "window_steps": window,
        "branches": branches,
        "evals": per_step * (prefix + branches * window),
        "evals_unshared": per_step * steps * images,
        "images": images,
    }


def prompt_evals_per_unit(steps: int, n_shifts: int, scales: list[float], cfg_scale: float) -> dict:
    """UNet sample-evaluations of one (class, seed) unit of a prompt family (``PromptSampler``):
    the plain prompt and each shift's prompt run every step from the same noise, in the same
    keys as :func:`unet_evals_per_unit` (no prefix: nothing is shared across branches)."""
    branches = 1 + n_shifts
    per_step = 2 if cfg_scale > 1.0 else 1
    images = n_shifts * len(scales)
    return {
        "prefix_steps": 0,
        "window_steps": steps,
        "branches": branches,
        "evals": per_step * steps * branches,
        "evals_unshared": per_step * steps * images,
        "images": images,
    }


def denoise_evals_per_unit(runs: list[tuple[int, int]], cfg: bool, images: int) -> dict:
    """UNet sample-evaluations of one unit whose loops each run ``rows`` rows over ``steps``
    steps (``runs``: one ``(rows, steps)`` per loop), in the keys of :func:`unet_evals_per_unit`:
    no prefix, one decode per row, nothing shared.  ``cfg``: a step is 2 sample-evaluations."""
    per_step = 2 if cfg else 1
    evals = per_step * sum(rows * steps for rows, steps in runs)
    return {
        "prefix_steps": 0,
        "window_steps": max((steps for rows, steps in runs if rows), default=0),
        "branches": sum(rows for rows, _ in runs),
        "evals": evals,
        "evals_unshared": evals,
        "images": images,
    }


@dataclass(frozen=True)
class UnetCost:
    """What one (class, seed) unit of a family costs the UNet.

    ``evals``: the counts of :func:`unet_evals_per_unit` (same keys), or None when they are
    not known before the build (``unknown`` says why); ``hooked``: the window's forwards
    carry per-row slider hooks (measured slower than the bare UNet); ``note``: what the
    count assumes, printed among the estimate's assumptions (e.g. that it is an upper bound
    because a unit with an unusable mask runs none)."""

    evals: dict | None
    hooked: bool = False
    unknown: str = ""
    note: str = ""


def unit_evals(cfg: "BuildConfig", n_shifts: int | None = None, scales: list[float] | None = None) -> dict:
    """:func:`unet_evals_per_unit` for ``cfg``'s generator, its benchmark grid unless given."""
    gen = cfg.generator
    n_shifts = len(cfg.benchmark.shifts) if n_shifts is None else n_shifts
    scales = list(cfg.benchmark.scales) if scales is None else scales
    return unet_evals_per_unit(gen.steps, gen.lora_timestep_threshold, n_shifts, scales, gen.guidance_scale)


def evals_per_image(cfg: "BuildConfig") -> float:
    """UNet sample-evaluations per image of ``cfg``'s benchmark grid (65.0 for the paper's 10 x 6)."""
    e = unit_evals(cfg)
    return e["evals"] / max(1, e["images"])
