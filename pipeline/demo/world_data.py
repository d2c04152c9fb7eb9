"""The data of the miniature world: scikit-learn's 8x8 digits, upsampled, with graded shifts.

Role: everything :mod:`pipeline.demo.train_world` trains on comes from here, and nothing
is downloaded -- ``sklearn.datasets.load_digits`` ships its 1,797 images inside the
package.

* **Images.**  Each 8x8 digit (16 grey levels, white ink on black) is upsampled
  bilinearly to 24x24 and centred on a 32x32 black canvas (4 px margin, so rotation and
  thicker strokes stay inside the frame).  Tensors are ``[N, 1, 32, 32]`` in ``[0, 1]``;
  :func:`to_rgb` / :func:`to_pil` render them as grey RGB, which is what the pipeline's
  models see.
* **Labels.**  :data:`DIGIT_NAMES` (``zero`` .. ``nine``) is the label space of the world
  (``benchmark.labels`` in ``configs/demo.yaml``); class id = the digit.
* **Shifts.**  :data:`SHIFTS` maps a shift name (as used in configs and prompts) to an
  image-space operation with a continuous strength ``s`` in ``[0, 1]`` (0 = identity):
  ``thick_strokes`` (grey-level dilation with a soft disk of radius ``2 s`` px),
  ``rotation`` (counter-clockwise by ``60 s`` degrees), ``blur`` (Gaussian, sigma
  ``2.2 s`` px).  Training captions name the shift with its words (``thick strokes``),
  exactly as the pipeline turns shift names into prompt words.
* **Captions.**  :func:`caption` gives the diffusion captions (``a picture of a three``,
  ``three, in thick strokes`` ...; the ``{token}`` forms used by the slider objective and
  the generator are among them); :func:`clip_caption` the contrastive captions, whose two
  main forms are exactly the filter's prompts (``a photo of a three`` / ``a photo of a
  three in blur``).
* **Split.**  :func:`split` is a fixed stratified 80/20 split; every model trains on the
  train part, held-out numbers in ``assets/world/world.json`` are on the test part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SIZE = 32  # image side in pixels
INNER = 24  # the digit's side inside the canvas
SHIFTS = ("thick_strokes", "rotation", "blur")
# Strength -> parameter of each shift (see the module docstring).
MAX_RADIUS = 2.0  # thick_strokes: dilation radius in px at s = 1
MAX_ANGLE = 60.0  # rotation: degrees counter-clockwise at s = 1
MAX_SIGMA = 2.2  # blur: Gaussian sigma in px at s = 1


def shift_words(shift: str) -> str:
    """``thick_strokes`` -> ``thick strokes`` (the pipeline's rule for prompts)."""
    return shift.replace("_", " ")


# --------------------------------------------------------------------------- images
def load_digits_tensor() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 digits as ``[N, 1, 32, 32]`` float32 in ``[0, 1]`` and labels ``[N]``."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("retraining the demo world needs scikit-learn: pip install -e .[world]") from None

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(INNER, INNER), mode="bilinear", align_corners=False).clamp(0, 1)
    pad = (SIZE - INNER) // 2
    x = F.pad(x, (pad, pad, pad, pad))
    return x, torch.tensor(d.target, dtype=torch.long)


def split(labels: torch.Tensor, test_fraction: float = 0.2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Stratified (train indices, test indices), fixed by ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    train, test = [], []
    for c in range(int(labels.max()) + 1):
        idx = torch.nonzero(labels == c).flatten()
        idx = idx[torch.randperm(len(idx), generator=gen)]
        n_test = int(round(len(idx) * test_fraction))
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    return torch.cat(train).sort().values, torch.cat(test).sort().values


def to_rgb(x: torch.Tensor) -> torch.Tensor:
    """``[N, 1, H, W]`` grey -> ``[N, 3, H, W]``."""
    return x.expand(-1, 3, -1, -1)


def to_pil(x: torch.Tensor) -> list:
    """``[N, 1 or 3, H, W]`` in ``[0, 1]`` -> RGB PIL images (as PNG files would hold them)."""
    from PIL import Image

    if x.shape[1] == 1:
        x = to_rgb(x)
    arr = (x.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    return [Image.fromarray(a, mode="RGB") for a in arr]


def from_pil(images) -> torch.Tensor:
    """RGB PIL images -> ``[N, 1, H, W]`` grey in ``[0, 1]`` (channel mean)."""
    import numpy as np

    arr = np.stack([np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0 for im in images])
    return torch.from_numpy(arr).permute(0, 3, 1, 2).mean(dim=1, keepdim=True)


# --------------------------------------------------------------------------- shifts
def _per_sample(strength: torch.Tensor | float, n: int) -> torch.Tensor:
    s = torch.as_tensor(strength, dtype=torch.float32)
    return s.expand(n).clone() if s.dim() == 0 else s.float()


def thick_strokes(x: torch.Tensor, strength) -> torch.Tensor:
    """Grey-level dilation with a soft disk of radius ``MAX_RADIUS * s`` (continuous in ``s``).

    Each offset ``(dy, dx)`` within the largest radius contributes the shifted image weighted
    by ``clamp(r + 0.5 - |offset|, 0, 1)``; the dilation is the max over offsets.
    """
    n = x.shape[0]
    r = _per_sample(strength, n).clamp(min=0) * MAX_RADIUS
    k = int(math.ceil(float(r.max()) + 0.5)) if n else 0
    if k == 0:
        return x.clone()
    padded = F.pad(x, (k, k, k, k))
    h, w = x.shape[-2:]
    out = x.clone()
    for dy in range(-k, k + 1):
        for dx in range(-k, k + 1):
            dist = math.hypot(dy, dx)
            if dist == 0:
                continue
            wgt = (r + 0.5 - dist).clamp(0, 1).view(n, 1, 1, 1)
            if float(wgt.max()) == 0:
                continue
            shifted = padded[..., k + dy : k + dy + h, k + dx : k + dx + w]
            out = torch.maximum(out, shifted * wgt)
    return out


def rotation(x: torch.Tensor, strength) -> torch.Tensor:
    """Rotate counter-clockwise about the centre by ``MAX_ANGLE * s`` degrees (bilinear)."""
    n = x.shape[0]
    a = _per_sample(strength, n) * (MAX_ANGLE * math.pi / 180.0)
    cos, sin = torch.cos(a), torch.sin(a)
    # affine_grid maps output coords to input coords; this theta turns the content CCW.
    theta = torch.stack([torch.stack([cos, sin, torch.zeros_like(a)], -1),
                         torch.stack([-sin, cos, torch.zeros_like(a)], -1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def blur(x: torch.Tensor, strength) -> torch.Tensor:
    """Gaussian blur with sigma ``MAX_SIGMA * s`` px, per sample (separable, zero padding)."""
    n = x.shape[0]
    sigma = _per_sample(strength, n).clamp(min=0) * MAX_SIGMA
    k = int(math.ceil(3 * float(sigma.max()))) if n else 0
    if k == 0:
        return x.clone()
    offs = torch.arange(-k, k + 1, dtype=torch.float32)
    safe = sigma.clamp(min=1e-3).view(n, 1)
    kern = torch.exp(-0.5 * (offs.view(1, -1) / safe) ** 2)
    kern = torch.where(sigma.view(n, 1) > 1e-3, kern, (offs.view(1, -1) == 0).float())
    kern = kern / kern.sum(dim=1, keepdim=True)  # [n, 2k+1]
    c = x.shape[1]
    # Grouped conv: each sample (and channel) with its own kernel.
    xs = x.reshape(1, n * c, *x.shape[-2:])
    kh = kern.repeat_interleave(c, 0).view(n * c, 1, 1, -1)
    xs = F.conv2d(F.pad(xs, (k, k, 0, 0)), kh, groups=n * c)
    xs = F.conv2d(F.pad(xs, (0, 0, k, k)), kh.transpose(-1, -2), groups=n * c)
    return xs.view_as(x)


SHIFT_FUNCS = {"thick_strokes": thick_strokes, "rotation": rotation, "blur": blur}


def apply_shift(x: torch.Tensor, shift: str | None, strength) -> torch.Tensor:
    if shift is None:
        return x.clone()
    return SHIFT_FUNCS[shift](x, strength).clamp(0, 1)


# --------------------------------------------------------------------------- variants
@dataclass
class Variants:
    """Shifted copies of a set of digits: images, labels, shift index (-1 = clean), strength."""

    images: torch.Tensor  # [M, 1, 32, 32]
    labels: torch.Tensor  # [M]
    shift: torch.Tensor  # [M] index into SHIFTS, -1 for clean
    strength: torch.Tensor  # [M] in [0, 1]


def make_variants(
    x: torch.Tensor, y: torch.Tensor, copies_per_shift: int, seed: int, low: float = 0.15, high: float = 1.0
) -> Variants:
    """Every image clean once plus ``copies_per_shift`` copies per shift at strengths ~ U(low, high)."""
    gen = torch.Generator().manual_seed(seed)
    imgs, labels, shift_ids, strengths = [x], [y], [torch.full_like(y, -1)], [torch.zeros(len(y))]
    for i, name in enumerate(SHIFTS):
        for _ in range(copies_per_shift):
            s = low + (high - low) * torch.rand(len(y), generator=gen)
            imgs.append(apply_shift(x, name, s))
            labels.append(y)
            shift_ids.append(torch.full_like(y, i))
            strengths.append(s)
    return Variants(torch.cat(imgs), torch.cat(labels), torch.cat(shift_ids), torch.cat(strengths))


# --------------------------------------------------------------------------- captions
# Diffusion captions.  "{n}" is the class word or token; the slider objective uses the bare
# token and "{token}, in {shift words}", the generator "a picture of a {token}".
CLEAN_TEMPLATES = ("a picture of a {n}", "{n}", "a picture of a {n}", "a photo of a {n}")
SHIFT_TEMPLATES = ("a picture of a {n}, in {w}", "{n}, in {w}", "a picture of a {n} in {w}", "{n} in {w}")
# Contrastive (CLIP) captions: the first of each is the filter's prompt form.
CLIP_CLEAN_TEMPLATES = ("a photo of a {n}", "a photo of a {n}.", "{n}", "a picture of a {n}")
CLIP_SHIFT_TEMPLATES = ("a photo of a {n} in {w}", "a photo of a {n}, in {w}", "{n} in {w}")


def caption(name: str, shift: str | None, pick: int) -> str:
    """Diffusion caption number ``pick`` (any int; wrapped) for class word ``name``."""
    if shift is None:
        return CLEAN_TEMPLATES[pick % len(CLEAN_TEMPLATES)].format(n=name)
    return SHIFT_TEMPLATES[pick % len(SHIFT_TEMPLATES)].format(n=name, w=shift_words(shift))


def clip_caption(name: str, shift: str | None, pick: int) -> str:
    if shift is None:
        return CLIP_CLEAN_TEMPLATES[pick % len(CLIP_CLEAN_TEMPLATES)].format(n=name)
    return CLIP_SHIFT_TEMPLATES[pick % len(CLIP_SHIFT_TEMPLATES)].format(n=name, w=shift_words(shift))
