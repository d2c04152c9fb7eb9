"""Mask-blended denoising with gradient guidance: background complexity and inpainting.

ImageNet-E edits the background with a guided diffusion loop
(``editing_diffusion/optimization/image_editor.py``): start from the background image
noised part of the way (``skip_timesteps``), and at every step

* predict the clean image ``x0`` and compute the background-complexity objective, the
  mean amplitude of its 2-D Fourier transform (``utils/fft_pytorch.py``:
  ``abs(fftn(x, dim=(2, 3))).mean()`` on the image in [0, 1]);
* follow its gradient with respect to the noisy sample, signed: a positive level makes
  the background more complex, a negative one smoother (``--background_complex`` with
  ``--hard``; the release script passes ``--hard`` for every level, so the sign of the
  level alone decides);
* keep the object: inside its mask the sample is replaced by the (transformed) original
  noised to the current step, and at the end the object's pixels are pasted back.

Here the same loop runs on a latent diffusion model (SD2 or the miniature world's):
``x0`` is decoded by the VAE, the objective -- the original's divided by the pixel count
(:func:`complexity_objective`) -- is computed on the decoded image and its gradient flows
back through the VAE decoder and the UNet to the latent.  The level lambda is given in
the original's units and mapped to the strength used here by :func:`guidance_strength`,
whose two gains (positive and negative lambda) are calibrated so that lambda = +-20
changes the background's mean Fourier amplitude by as much as the original's formulas do
on the same reference images (:mod:`.calibration`).  The guided
noise prediction is ``eps - sqrt(1 - abar_t) * grad`` (score-function guidance, the
DDIM form of guided diffusion's ``cond_fn``), followed by a deterministic DDIM update
from ``abar_t`` to ``abar_prev``.  Both v-prediction (SD2) and epsilon models are
handled by converting the model output to (``x0``, ``eps``).  With every level 0 the
loop needs no gradients and is plain mask-blended denoising: the diffusion inpainting
that fills the background a geometry edit uncovers.

This path is separate from the slider family's inference-mode sampler
(:mod:`pipeline.models.sampler`), whose fast path stays untouched.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.errors import CnsbenchError
from pipeline.families.object_edit import denoise_steps


@dataclass
class DenoiseSettings:
    steps: int = 50  # timesteps of the full schedule
    strength: float = 0.5  # share of the schedule run, from the noised start image (1 = from noise)
    guidance_scale: float = 7.5  # classifier-free guidance of the text condition


def fourier_amplitude(images01: torch.Tensor) -> torch.Tensor:
    """ImageNet-E's background-complexity objective per image: mean |FFT2| over H, W (and channels).

    ``images01``: [B, C, H, W] in [0, 1].  Returns [B].
    """
    return torch.fft.fftn(images01, dim=(-2, -1)).abs().mean(dim=(1, 2, 3))


def complexity_objective(images01: torch.Tensor) -> torch.Tensor:
    """The guided objective: :func:`fourier_amplitude` divided by the pixel count H * W.  [B, C, H, W] -> [B]."""
    return fourier_amplitude(images01) / (images01.shape[-2] * images01.shape[-1])


def guidance_strength(lam: float, gain_complexity: float, gain_simplicity: float) -> float:
    """The strength applied to :func:`complexity_objective` for the original's lambda (gain per sign)."""
    return float(lam) * (gain_complexity if lam > 0 else gain_simplicity)


def high_frequency_energy(image: np.ndarray, region: np.ndarray | None = None, sigma: float = 1.0) -> float:
    """Mean squared high-pass residual (image minus its Gaussian blur) over ``region``.

    A measurement, not the guidance objective: the energy of detail finer than ``sigma``
    pixels, e.g. in the background (``region`` = background pixels away from the object).
    """
    from scipy import ndimage

    low = np.stack([ndimage.gaussian_filter(image[..., c], sigma, mode="reflect") for c in range(image.shape[-1])], -1)
    res = ((image - low) ** 2).mean(axis=-1)
    if region is not None:
        if not region.any():
            return 0.0
        res = res[region]
    return float(res.mean())


class MaskedDenoiser:
    """The guided, mask-blended denoising loop on a diffusers text-to-image pipeline."""

    def __init__(self, pipe: Any, settings: DenoiseSettings) -> None:
        self.pipe = pipe
        self.settings = settings
        self.unet_evals = 0

    # ------------------------------------------------------------------ VAE
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] in [-1, 1] at the model's resolution -> scaled latents (posterior mean)."""
        vae = self.pipe.vae
        posterior = vae.encode(images.to(vae.dtype)).latent_dist
        return posterior.mean * vae.config.scaling_factor

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        return vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0]

    # ------------------------------------------------------------------ model
    def _predict(self, z: torch.Tensor, t: torch.Tensor, neg: torch.Tensor, pos: torch.Tensor, abar: torch.Tensor):
        """(x0, eps) of the CFG-combined model output at timestep ``t``."""
        n = z.shape[0]
        cfg = self.settings.guidance_scale > 1.0
        model_in = torch.cat([z, z]) if cfg else z
        embeds = torch.cat([neg.expand(n, -1, -1), pos.expand(n, -1, -1)]) if cfg else pos.expand(n, -1, -1)
        out = self.pipe.unet(model_in, t, encoder_hidden_states=embeds, return_dict=False)[0]
        self.unet_evals += model_in.shape[0]
        if cfg:
            uncond, cond = out.chunk(2)
            out = uncond + self.settings.guidance_scale * (cond - uncond)
        a, s = abar.sqrt(), (1 - abar).sqrt()
        kind = self.pipe.scheduler.config.prediction_type
        if kind == "v_prediction":
            return a * z - s * out, a * out + s * z
        if kind == "epsilon":
            return (z - s * out) / a, out
        raise CnsbenchError(f"unsupported prediction type {kind!r} (expected 'v_prediction' or 'epsilon')")

    # ------------------------------------------------------------------ loop
    def run(
        self,
        start: torch.Tensor,
        keep: torch.Tensor,
        keep_alpha: torch.Tensor,
        levels: Sequence[float],
        embeds: tuple[torch.Tensor, torch.Tensor],
        seed: int,
    ) -> torch.Tensor:
        """Denoise ``start`` while keeping ``keep`` where ``keep_alpha`` is 1; guidance level per row.

        ``start``, ``keep``: [B, 3, H, W] in [-1, 1] at the model's resolution (``start`` is
        the image the edited region starts from, e.g. the background with the object
        removed; ``keep`` the image whose content is preserved); ``keep_alpha``:
        [B, 1, H, W] in [0, 1].  ``levels``: the signed guidance strength of each row
        (:func:`guidance_strength` of its lambda), 0 for plain inpainting.  The same noise
        (from ``seed``) is used for every row, so rows that differ only in their level
        differ only by the guidance.  Returns
        [B, 3, H, W] in [-1, 1], with the kept region pasted back exactly.
        """
        pipe = self.pipe
        dev, dtype = pipe.unet.device, pipe.unet.dtype
        sched = copy.deepcopy(pipe.scheduler)
        sched.set_timesteps(self.settings.steps, device=dev)
        n_run = denoise_steps(self.settings.steps, self.settings.strength)
        timesteps = sched.timesteps[len(sched.timesteps) - n_run :]
        abars = sched.alphas_cumprod.to(dev, torch.float32)
        final_abar = torch.as_tensor(float(sched.final_alpha_cumprod), device=dev)
        neg, pos = embeds
        lam = torch.tensor([float(v) for v in levels], device=dev, dtype=torch.float32)
        guided = bool((lam != 0).any())
        b = start.shape[0]

        with torch.no_grad():
            z_start = self.encode(start.to(dev))
            z_keep = self.encode(keep.to(dev))
        # A latent cell is regenerated when any pixel in it is to be regenerated.
        factor = start.shape[-1] // z_start.shape[-1]
        regen = F.max_pool2d(1.0 - keep_alpha.to(dev, torch.float32), factor)
        regen = (regen > 1e-3).to(z_start.dtype)
        gen = torch.Generator().manual_seed(int(seed))
        noise = torch.randn(z_start.shape[1:], generator=gen, dtype=torch.float32).to(dev, z_start.dtype)
        noise = noise.expand(b, -1, -1, -1)
        z = sched.add_noise(z_start, noise, timesteps[:1])

        for i, t in enumerate(timesteps):
            known = sched.add_noise(z_keep, noise, t.reshape(1))
            z = (z * regen + known * (1 - regen)).detach()
            abar = abars[int(t)]
            if guided:
                with torch.enable_grad():
                    z_in = z.clone().requires_grad_(True)
                    x0, eps = self._predict(z_in, t, neg, pos, abar)
                    img = (self.decode(x0.to(dtype)).float().clamp(-1, 1) + 1) / 2
                    objective = (lam * complexity_objective(img)).sum()
                    grad = torch.autograd.grad(objective, z_in)[0]
                eps = eps.detach() - (1 - abar).sqrt() * grad.to(eps.dtype)
                x0 = (z - (1 - abar).sqrt() * eps) / abar.sqrt()
            else:
                with torch.no_grad():
                    x0, eps = self._predict(z, t, neg, pos, abar)
            prev = int(timesteps[i + 1]) if i + 1 < len(timesteps) else -1
            abar_prev = abars[prev] if prev >= 0 else final_abar
            z = (abar_prev.sqrt() * x0 + (1 - abar_prev).sqrt() * eps).detach()

        with torch.no_grad():
            out = self.decode(z.to(dtype)).float().clamp(-1, 1)
        alpha = keep_alpha.to(dev, torch.float32)
        return out * (1 - alpha) + keep.to(dev, torch.float32) * alpha


def to_tensor(arrays: Sequence[np.ndarray], size: int, signed: bool = True) -> torch.Tensor:
    """[H, W] or [H, W, C] arrays in [0, 1] -> [B, C, size, size] (bilinear when resized).

    ``signed``: map [0, 1] to the model's [-1, 1] (images); False keeps [0, 1] (alphas).
    """
    x = torch.from_numpy(np.stack([a if a.ndim == 3 else a[..., None] for a in arrays]).astype(np.float32))
    x = x.permute(0, 3, 1, 2)
    if x.shape[-1] != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x * 2 - 1 if signed else x


def from_tensor(x: torch.Tensor, size: int) -> list[np.ndarray]:
    """[B, 3, H, W] in [-1, 1] -> [H, W, 3] arrays in [0, 1] at ``size``."""
    x = (x.float().clamp(-1, 1) + 1) / 2
    if x.shape[-1] != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return [a for a in x.permute(0, 2, 3, 1).cpu().numpy()]
