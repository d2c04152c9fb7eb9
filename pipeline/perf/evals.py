"""How many UNet evaluations a build makes: the count of ``SliderSampler.generate_group``.

Per (class, seed) unit the DDIM steps above the LoRA window's threshold run once, shared by
every shift and scale; then the scale-0 image and every (shift, non-zero scale) branch run
the window's steps.  With classifier-free guidance a step is 2 sample-evaluations.
"""

from __future__ import annotations

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
