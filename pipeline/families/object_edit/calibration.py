"""Calibration of the background-complexity guidance against the original's formulas.

The original (``alibaba/easyrobust``, ``ImageNet-Editing/editing_diffusion``) guides a
256 px pixel-space DDPM (1000 training steps, linear betas 1e-4 .. 0.02, respaced to 100,
``skip_timesteps`` 25 by default: 74 guided steps) with
``cond_fn = lambda * grad_x mean|fftn((x0_hat + 1) / 2)|`` (``--hard``, so +lambda = busier),
added to the DDPM mean as ``variance * cond_fn``; the object region is replaced by the
object image at every step, and the result is clamped to [0, 1].  How much this changes
the background depends on how the network's clean-image prediction ``x0_hat`` passes a
shift of ``x_t`` on, which its formulas do not say.  :func:`original_change` evaluates the
formulas with the network taken as the identity on the clean image (``d x0_hat / d x_t =
1``, a shift of the mean stays in the image), the calibration target; two bounds are
computed beside it:

* ``fixed_eps``: the network's noise estimate held fixed, so the gradient reaches ``x_t``
  through ``x0_hat = (x_t - sqrt(1 - abar) eps) / sqrt(abar)`` (gain ``1 / sqrt(abar)``, and
  a shift persists in ``x0`` space) -- an upper bound: it saturates the background;
* ``wiener``: the network as the ideal denoiser of Gaussian data (per-pixel std 0.5 in
  [-1, 1]): gain ``sqrt(abar) s^2 / (abar s^2 + 1 - abar)``, a shift propagated by the
  DDPM posterior -- a lower bound: most of each shift is denoised away.

The measure is the relative change of the background's mean Fourier amplitude
(:func:`background_amplitude`: ``mean |fft2(image * background)|``) between lambda = 0 and
lambda; for the original the image is resized to 256 px (LANCZOS, as ``image_editor.py``
loads it), for this project's loop it is the loop's own output with and without guidance
from the same noise.  :func:`fit_gain` finds, per sign, the gain of
:func:`pipeline.families.object_edit.guidance.guidance_strength` at which the loop's mean
change over :func:`reference_images` equals the original's at lambda = +-20.

``python -m pipeline.families.object_edit.calibration --model assets/world/sd`` prints
both changes and the gains (``docs/imagenet_e.md`` records them for the world model).
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.errors import CnsbenchError

ORIGINAL_SIZE = 256
TRAIN_STEPS = 1000
BETAS = (1e-4, 0.02)
RESPACED = 100
SKIP = 25  # arguments.py: --skip_timesteps default
WIENER_STD = 0.5
MODELS = ("identity", "fixed_eps", "wiener")


def original_steps(model: str = "identity") -> np.ndarray:
    """Per guided step, the change of the clean image in [0, 1] per unit lambda and unit gradient.

    The respaced schedule of guided diffusion (``space_timesteps(1000, "100")``) with the
    first ``SKIP`` steps skipped; variance = the respaced beta.  ``model``: see the module
    docstring.  The last step's shift goes into the sample, not into the saved prediction,
    so it counts only for ``identity`` (whose shift stays in the image).
    """
    if model not in MODELS:
        raise CnsbenchError(f"unknown model {model!r}; one of {', '.join(MODELS)}")
    betas = np.linspace(*BETAS, TRAIN_STEPS, dtype=np.float64)
    abar_all = np.cumprod(1 - betas)
    frac = (TRAIN_STEPS - 1) / (RESPACED - 1)
    abar = abar_all[sorted({round(i * frac) for i in range(RESPACED)})]
    prev = np.concatenate([[1.0], abar[:-1]])
    beta = 1 - abar / prev
    run = list(range(RESPACED))[::-1][SKIP:]
    if model == "identity":
        return np.array([beta[t] / 4 for t in run])  # (x + 1) / 2 twice: the objective's input and the image
    if model == "fixed_eps":
        return np.array([beta[t] / (4 * math.sqrt(abar[t] * prev[t])) for t in run[:-1]])
    s2 = WIENER_STD**2
    gain = np.sqrt(abar) * s2 / (abar * s2 + 1 - abar)  # d x0_hat / d x_t of the ideal denoiser
    carry = np.sqrt(prev) * beta / (1 - abar) * gain + np.sqrt(1 - beta) * (1 - prev) / (1 - abar)
    out = []
    for k, t in enumerate(run[:-1]):
        onward = gain[run[-1]] * float(np.prod([carry[j] for j in run[k + 1 : -1]]))
        out.append(onward * beta[t] * gain[t] / 4)
    return np.array(out)


def amplitude_gradient(image: np.ndarray) -> np.ndarray:
    """Gradient of ``mean |fft2|`` over (C, H, W) of a [C, H, W] image: ``Re(ifft2(phase)) / C``."""
    f = np.fft.fft2(image, axes=(-2, -1))
    phase = np.where(np.abs(f) > 0, f / np.maximum(np.abs(f), 1e-30), 0)
    return np.real(np.fft.ifft2(phase, axes=(-2, -1))) / image.shape[0]


def background_amplitude(image: np.ndarray, background: np.ndarray) -> float:
    """``mean |fft2(image * background)|``: [H, W, 3] (or [C, H, W] with ``chw``) image in [0, 1]."""
    x = image.transpose(2, 0, 1) if image.ndim == 3 and image.shape[-1] in (1, 3) else image
    return float(np.abs(np.fft.fft2(x * background[None], axes=(-2, -1))).mean())


def _resized(image: np.ndarray, obj: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image

    im = Image.fromarray(np.clip(np.rint(image * 255), 0, 255).astype(np.uint8)).resize((size, size), Image.LANCZOS)
    mask = Image.fromarray(obj.astype(np.uint8) * 255).resize((size, size), Image.NEAREST)
    return np.asarray(im, dtype=np.float64).transpose(2, 0, 1) / 255.0, np.asarray(mask) > 0


def original_change(image: np.ndarray, obj: np.ndarray, lam: float, model: str = "identity", size: int = ORIGINAL_SIZE) -> float:
    """Relative change of the background's mean |FFT| that the original's guidance at ``lam`` makes.

    ``image``: [H, W, 3] in [0, 1] (the background with the object removed, the object in
    place); ``obj``: its object mask.  Gradient ascent (descent for negative lambda) on the
    whole image's amplitude with the step sizes of :func:`original_steps`, applied to the
    background only, the result clamped to [0, 1].
    """
    u, mask = _resized(image, obj, size)
    background = (~mask).astype(np.float64)
    u0 = u.copy()
    for step in original_steps(model):
        u = u + lam * step * amplitude_gradient(u) * background[None]
    u = np.clip(u, 0, 1)
    before = background_amplitude(u0, background)
    return (background_amplitude(u, background) - before) / before


def reference_images(size: int = 32) -> list[tuple[np.ndarray, np.ndarray]]:
    """(image, object mask) pairs with textured backgrounds: a ring on a sine lattice, a disc on smooth noise.

    A black background (the world's) has no amplitude to change relatively, so the
    calibration needs backgrounds with content; both are deterministic.
    """
    from scipy import ndimage

    yy, xx = np.mgrid[:size, :size]
    c = (size - 1) / 2
    r = np.hypot(yy - c, xx - c) * 32 / size
    ring = (r >= 6) & (r <= 9)
    lattice = np.repeat((0.25 * (0.5 + 0.5 * np.sin(xx * 1.9 * 32 / size) * np.sin(yy * 1.7 * 32 / size)))[..., None], 3, -1)
    lattice[ring] = 0.9
    disc = r <= 7
    noise = ndimage.gaussian_filter(np.random.default_rng(7).random((size, size)), size / 16)
    noise = 0.1 + 0.4 * (noise - noise.min()) / (noise.max() - noise.min())
    smooth = np.stack([noise, noise * 0.8, noise * 0.6], -1)
    smooth[disc] = (0.8, 0.7, 0.2)
    return [(lattice.astype(np.float32), ring), (smooth.astype(np.float32), disc)]


def loop_changes(pipe: Any, image: np.ndarray, obj: np.ndarray, strengths: Sequence[float], steps: int, strength: float, seed: int = 1) -> list[float]:
    """Relative change of the background's mean |FFT| that this project's loop makes at each guidance strength."""
    from pipeline.families.object_edit import geometry as G
    from pipeline.families.object_edit.guidance import (
        DenoiseSettings,
        MaskedDenoiser,
        from_tensor,
        to_tensor,
    )

    size = image.shape[0]
    start = G.classical_fill(image, G.dilate(obj, 1))
    background = (~obj).astype(np.float64)
    rows = [0.0, *strengths]
    uncond = pipe.encode_prompt("", pipe.unet.device, 1, False)[0]
    den = MaskedDenoiser(pipe, DenoiseSettings(steps=steps, strength=strength, guidance_scale=1.0))
    out = den.run(
        to_tensor([start] * len(rows), pipe.unet.config.sample_size * pipe.vae_scale_factor),
        to_tensor([image] * len(rows), pipe.unet.config.sample_size * pipe.vae_scale_factor),
        to_tensor([obj.astype(np.float32)] * len(rows), pipe.unet.config.sample_size * pipe.vae_scale_factor, signed=False),
        rows,
        (uncond, uncond),
        seed=seed,
    )
    amps = [background_amplitude(a, background) for a in from_tensor(out, size)]
    return [(a - amps[0]) / amps[0] for a in amps[1:]]


PLATEAU = 0.95  # a target beyond the loop's reach: the first strength within 5 % of its largest change


def fit_gain(strengths: Sequence[float], changes: Sequence[float], target: float, lam: float) -> tuple[float, bool]:
    """(gain = strength / |lambda| at which the change reaches ``target``, reached).

    Log-linear between the bracketing strengths.  When no strength brackets the target
    and the target lies beyond the largest change (the loop saturates), the gain is the
    first strength reaching :data:`PLATEAU` of the largest change, and ``reached`` is False.
    """
    pairs = sorted(zip((abs(s) for s in strengths), changes))
    for (s0, c0), (s1, c1) in itertools.pairwise(pairs):
        if (c0 - target) * (c1 - target) <= 0 and c0 != c1:
            w = (target - c0) / (c1 - c0)
            return math.exp(math.log(s0) + w * (math.log(s1) - math.log(s0))) / abs(lam), True
    extreme = max(c for _, c in pairs) if target > 0 else min(c for _, c in pairs)
    if abs(target) > abs(extreme) and extreme * target > 0:
        first = next(s for s, c in pairs if abs(c) >= PLATEAU * abs(extreme))
        return first / abs(lam), False
    raise CnsbenchError(f"no strength in {[p[0] for p in pairs]} brackets the target change {target:+.4f} (changes {changes})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="diffusers text-to-image pipeline directory")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--strength", type=float, default=0.6)
    parser.add_argument("--lam", type=float, default=20.0)
    parser.add_argument("--up", type=float, nargs="+", default=[1e4, 2e4, 4e4, 8e4, 1.6e5])
    parser.add_argument("--down", type=float, nargs="+", default=[2.5e2, 5e2, 1e3, 2e3, 4e3])
    parser.add_argument("--signs", default="+-", help="which signs of lambda to calibrate: +, - or +-")
    args = parser.parse_args(argv)
    import torch

    from pipeline.models.diffusion import load_pipeline

    pipe = load_pipeline(args.model, torch.float32, "cpu")
    images = reference_images(pipe.unet.config.sample_size * pipe.vae_scale_factor)
    for sign, grid in [(1.0, args.up)] * ("+" in args.signs) + [(-1.0, args.down)] * ("-" in args.signs):
        lam = sign * args.lam
        original = {m: float(np.mean([original_change(i, o, lam, m) for i, o in images])) for m in MODELS}
        ours = np.mean([loop_changes(pipe, i, o, [sign * s for s in grid], args.steps, args.strength) for i, o in images], 0)
        print(f"lambda {lam:+g}: original " + ", ".join(f"{m} {v:+.4f}" for m, v in original.items()))
        print("  loop: " + ", ".join(f"{sign * s:g} {c:+.4f}" for s, c in zip(grid, ours)))
        gain, reached = fit_gain(grid, list(ours), original["identity"], lam)
        what = "reaches the original's change" if reached else f"the loop's plateau ({PLATEAU:.0%} of its largest change)"
        print(f"  gain ({'complexity' if sign > 0 else 'simplicity'}): {gain:.6g} -- {what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
