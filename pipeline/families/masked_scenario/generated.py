"""Scenario ``generated_background``: the background repainted by the text-to-image model.

XIMAGENET-12 made its AI-generated backgrounds by giving the transparent image to an
SDXL outpainting tool with a scene prompt.  Here the build's own text-to-image model
repaints everything outside the object mask by mask-blended denoising: the image is
encoded to latents, noised to the start step, and denoised with classifier-free guidance
on the background prompt; after every step the object's latents are replaced by the
original latents noised to the same step, so the model paints a background that fits the
kept object.  The decoded background is composited with the original object pixels, so
the object stays byte-identical.

Strength ``s`` sets the start step: denoising starts at step ``round((1 - s) * steps)``
of ``generator.steps``: ``s = 1`` starts from pure noise (a new background), small ``s``
only re-renders detail, ``s = 0`` is the original image.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Painted:
    images: list[Any]
    seconds: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)
    unet_evals: int = 0  # UNet sample-evaluations (a CFG step on one row counts 2)


def start_step(strength: float, steps: int) -> int:
    """The step a strength's row joins the denoising at (``steps``: none; 0: from pure noise)."""
    return int(round((1 - strength) * steps))


def painted_rows(scales: list[float], steps: int) -> tuple[list[int], int]:
    """The rows :meth:`BackgroundPainter.paint` denoises for ``scales`` (the strengths > 0 that
    start before the last step) and the steps the batch runs (from the earliest start on)."""
    firsts = [start_step(v, steps) for v in scales]
    rows = [r for r, v in enumerate(scales) if v > 0 and firsts[r] < steps]
    return rows, (steps - min(firsts[r] for r in rows)) if rows else 0


class BackgroundPainter:
    def __init__(self, config, options, device: str, dtype) -> None:
        from pipeline.families.base import base_sampler_kind
        from pipeline.families.slider import shared_sampler

        self.sampler = shared_sampler(config, base_sampler_kind(config), device, dtype)
        self.options = options
        self._embeds: dict[int, Any] = {}

    def _prompt_embeds(self, class_id: int, class_name: str):
        s = self.sampler
        if self.options.background_prompt is None:
            return s.prompt_embeds(class_id)
        if class_id not in self._embeds:
            prompt = self.options.background_prompt.format(token=s.tokens.get(class_id, class_name), class_name=class_name)
            pos, neg = s.pipe.encode_prompt(prompt, s.device, 1, True, negative_prompt=s.spec.negative_prompt)
            self._embeds[class_id] = (neg, pos)
        return self._embeds[class_id]

    def paint(self, ctx, image, mask: np.ndarray, scales: list[float]) -> Painted:
        import torch

        start = time.perf_counter()
        images = []
        with torch.inference_mode():
            s = self.sampler
            pipe, spec = s.pipe, s.spec
            s._evals = 0
            rgb = image.convert("RGB")
            work = rgb if rgb.size == (spec.resolution, spec.resolution) else rgb.resize((spec.resolution,) * 2, 3)
            x = pipe.image_processor.preprocess(work).to(s.device, pipe.vae.dtype)
            lat0 = pipe.vae.encode(x).latent_dist.mean * pipe.vae.config.scaling_factor
            lat0 = lat0.to(pipe.unet.dtype)
            m = torch.from_numpy(mask.astype(np.float32))[None, None]
            keep = (torch.nn.functional.interpolate(m, size=lat0.shape[-2:], mode="area") >= 0.5).to(lat0)
            gen = torch.Generator().manual_seed(int(ctx.seed) + self.options.generated_seed_offset)
            noise = torch.randn(lat0.shape, generator=gen, dtype=torch.float32).to(s.device, lat0.dtype)
            neg, pos = self._prompt_embeds(ctx.class_id, ctx.class_name)
            sched = s._timesteps()
            timesteps = sched.timesteps
            n = len(timesteps)
            orig = np.asarray(rgb)
            firsts = [start_step(v, n) for v in scales]
            rows, run = painted_rows(scales, n)
            painted: dict[int, Any] = {}
            if rows:
                # All strengths in one batch: a row joins at its start step; before that it
                # is held at the original latents noised to the current step.
                j0 = n - run
                started_at = torch.tensor([firsts[r] for r in rows]).view(-1, 1, 1, 1)
                csched = copy.deepcopy(sched)
                lat = sched.add_noise(lat0, noise, timesteps[j0 : j0 + 1]).expand(len(rows), -1, -1, -1).clone()
                cond = pos.expand(len(rows), -1, -1)
                ones = torch.ones_like(keep)
                for j in range(j0, n):
                    lat = s._step(csched, lat, timesteps[j], neg, cond)
                    known = sched.add_noise(lat0, noise, timesteps[j + 1 : j + 2]) if j + 1 < n else lat0
                    hold = torch.where(started_at <= j, keep, ones)
                    lat = hold * known + (1 - hold) * lat
                from PIL import Image

                for r, im in zip(rows, s.decode_latents(lat)):
                    im = im.convert("RGB")
                    if im.size != rgb.size:
                        im = im.resize(rgb.size, 3)
                    arr = np.array(im)
                    arr[mask] = orig[mask]  # the object stays byte-identical
                    painted[r] = Image.fromarray(arr)
            images = [painted.get(r, image) for r in range(len(scales))]
        return Painted(images, time.perf_counter() - start, {"steps": n}, s._evals)
