"""Noise and blur corruptions of ImageNet-C, batched on tensors.

Every function takes ``x`` (B, 3, H, W) in [0, 1], ``params`` (one parameter tuple per
row, see :mod:`.params`) and ``fields`` (one :class:`~.ops.Fields` per row; rows of the
same image share one, so their random draws are the same at every severity) and returns
the corrupted batch, clipped to [0, 1].  Where the release draws random numbers, the
same distribution is drawn from the fields, transformed so that a field is reused at
every severity (e.g. Poisson counts by inverse CDF of one uniform field).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from pipeline.families.corruption.ops import (
    Fields,
    clipped_zoom,
    column,
    filter2d,
    gaussian_filter,
    gaussian_kernel1d,
    stack_field,
)
from pipeline.families.corruption.ops import (
    motion_blur as _motion,
)

Params = Sequence[tuple[float, ...]]


def _shape(x: torch.Tensor) -> tuple[int, int, int]:
    return tuple(x.shape[1:])  # type: ignore[return-value]


# --------------------------------------------------------------------------- noise
def gaussian_noise(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    n = stack_field(fields, "normal", "noise", _shape(x), x.device)
    return (x + n * column([p[0] for p in params], x)).clamp(0, 1)


def speckle_noise(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    n = stack_field(fields, "normal", "noise", _shape(x), x.device)
    return (x + x * n * column([p[0] for p in params], x)).clamp(0, 1)


def poisson_from_uniform(lam: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Poisson(``lam``) counts as the inverse CDF at ``u``, so one uniform field serves every rate.

    Counts beyond mean + 8 sd + 8 (probability < 1e-12) are capped there.
    """
    lam = lam.float()
    u = u.float()
    top = float(lam.max())
    kmax = int(math.ceil(top + 8.0 * math.sqrt(top) + 8.0))
    p = torch.exp(-lam)
    cdf = p.clone()
    count = torch.zeros_like(lam)
    for k in range(kmax):
        count += (u > cdf).float()
        p = p * lam / (k + 1)
        cdf = cdf + p
    return count


def _poisson_levels(x: torch.Tensor, c: Sequence[float], u: torch.Tensor) -> torch.Tensor:
    """:func:`poisson_from_uniform` of ``x * c`` for 8-bit images, by table look-up.

    An 8-bit image has 256 intensities per row, so the CDF of Poisson(level / 255 * c) is
    tabulated once per (row, level) and every pixel's count is one ``searchsorted`` in
    the concatenated tables (each offset by twice its table index to keep them sorted).
    """
    b = x.shape[0]
    levels = torch.round(x.clamp(0, 1) * 255.0).long()  # (B, 3, H, W)
    lam = torch.arange(256, dtype=torch.float64).view(1, 256) / 255.0 * torch.as_tensor(list(c), dtype=torch.float64).view(b, 1)
    top = float(lam.max())
    kmax = int(math.ceil(top + 8.0 * math.sqrt(top) + 8.0))
    k = torch.arange(kmax + 1, dtype=torch.float64)
    logp = k * torch.log(lam.clamp_min(1e-300)).unsqueeze(-1) - lam.unsqueeze(-1) - torch.lgamma(k + 1)
    pmf = torch.where(lam.unsqueeze(-1) > 0, torch.exp(logp), (k == 0).double().expand(b, 256, -1))
    cdf = torch.cumsum(pmf, dim=-1).clamp(max=1.0)  # (B, 256, K)
    table = (cdf + 2.0 * torch.arange(b * 256, dtype=torch.float64).view(b, 256, 1)).reshape(-1).to(x.device)
    idx = torch.arange(b, device=x.device).view(b, 1, 1, 1) * 256 + levels
    pos = torch.searchsorted(table, u.double() + 2.0 * idx, right=False)
    return (pos - idx * (kmax + 1)).clamp(max=kmax).to(x.dtype)


def shot_noise(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    """Poisson(x c) / c with one uniform field per image (counts by inverse CDF, 8-bit intensities)."""
    u = stack_field(fields, "uniform", "poisson", _shape(x), x.device)
    c = [p[0] for p in params]
    return (_poisson_levels(x, c, u) / column(c, x)).clamp(0, 1)


def impulse_noise(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    """skimage ``random_noise(mode='s&p')``: each value flipped with probability ``amount``, half salt, half pepper."""
    flip = stack_field(fields, "uniform", "flip", _shape(x), x.device) < column([p[0] for p in params], x)
    salt = stack_field(fields, "uniform", "salt", _shape(x), x.device) < 0.5
    out = torch.where(flip & salt, torch.ones_like(x), x)
    return torch.where(flip & ~salt, torch.zeros_like(x), out)


# --------------------------------------------------------------------------- blur
def gaussian_blur(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    return gaussian_filter(x, [p[0] for p in params], "nearest").clamp(0, 1)


def disk_kernel(radius: float, alias_blur: float) -> np.ndarray:
    """The release's anti-aliased disk: a 17x17 (radius <= 8) or (2r+1)^2 disk, Gaussian-smoothed.

    The smoothing is ``cv2.GaussianBlur`` (kernel 3x3, or 5x5 beyond radius 8, border
    reflect-101).  A fractional radius above 8 uses the integer grid of ``ceil(radius)``.
    """
    if radius <= 8:
        grid, ksize = np.arange(-8, 9), 3
    else:
        r = int(math.ceil(radius))
        grid, ksize = np.arange(-r, r + 1), 5
    xx, yy = np.meshgrid(grid, grid)
    disk = ((xx**2 + yy**2) <= radius**2).astype(np.float64)
    disk /= disk.sum()
    t = np.arange(ksize) - (ksize - 1) / 2.0
    g = np.exp(-(t * t) / (2.0 * alias_blur * alias_blur))
    g /= g.sum()
    n = disk.shape[0]
    half = ksize // 2
    idx = np.abs(np.arange(-half, n + half))
    idx = np.where(idx >= n, 2 * n - 2 - idx, idx)  # reflect-101
    padded = disk[np.ix_(idx, idx)]
    rows = sum(g[i] * padded[i : i + n, :] for i in range(ksize))
    return sum(g[i] * rows[:, i : i + n] for i in range(ksize))


def defocus_blur(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    kernels = [disk_kernel(p[0], p[1]) for p in params]
    return filter2d(x, kernels, "mirror").clamp(0, 1)


def glass_shuffle_index(h: int, w: int, delta: int, iterations: int, draws: np.ndarray) -> np.ndarray:
    """Flat source index of every pixel after the release's local pixel "swaps".

    ``draws[i, y, x] = (dx, dy)`` in [-delta, delta).  The release visits rows and
    columns from the far end and writes ``x[h, w], x[h', w'] = x[h', w'], x[h, w]`` on
    NumPy views, which copies ``x[h', w']`` into ``x[h, w]`` and leaves ``x[h', w']`` as
    it is; the published images were made that way, so this does the same.

    Vectorised: a visited pixel p reads q = p + offset, already rewritten in this pass
    when q comes later in raster order (it was visited before p) and original otherwise,
    so p's value is found by following such reads to the first original one (pointer
    jumping, log2 of the longest chain rounds).
    """
    n = h * w
    idx = np.arange(n, dtype=np.int64)
    yy, xx = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    visited = (yy > delta) & (yy <= h - delta) & (xx > delta) & (xx <= w - delta)
    flat = np.arange(n).reshape(h, w)
    for it in range(iterations):
        q = (yy + draws[it, :, :, 1]) * w + (xx + draws[it, :, :, 0])
        q = np.where(visited, q, flat).ravel()
        p = flat.ravel()
        vis = visited.ravel()
        chained = vis & (q > p) & vis[np.clip(q, 0, n - 1)]
        nxt = np.where(chained, q, -1)
        val = np.where(chained, -1, idx[q])  # the original value read at the end of the chain
        while (nxt >= 0).any():
            follow = nxt >= 0
            tgt = nxt[follow]
            val_new = val.copy()
            nxt_new = nxt.copy()
            val_new[follow] = val[tgt]
            nxt_new[follow] = nxt[tgt]
            val, nxt = val_new, nxt_new
        idx = val
    return idx


def glass_draws(fields: Fields, h: int, w: int, delta: int) -> np.ndarray:
    """(3, H, W, 2) integer offsets in [-delta, delta) from one uniform field (shared by all deltas)."""
    u = fields.uniform("glass", (3, h, w, 2)).numpy()
    return np.floor(u * 2 * delta).astype(np.int64) - delta


def glass_blur(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    b, c, h, w = x.shape
    sigmas = [p[0] for p in params]
    # np.uint8(...) truncates.
    y = torch.floor(gaussian_filter(x, sigmas, "nearest").clamp(0, 1) * 255.0) / 255.0
    out = torch.empty_like(y)
    for row, p in enumerate(params):
        delta, iterations = int(round(p[1])), int(round(p[2]))
        idx = glass_shuffle_index(h, w, delta, iterations, glass_draws(fields[row], h, w, delta))
        flat = y[row].reshape(c, h * w)
        out[row] = flat[:, torch.as_tensor(idx, device=x.device)].view(c, h, w)
    return gaussian_filter(out, sigmas, "nearest").clamp(0, 1)


def motion_blur(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    angles = [float(f.uniform("angle", (1,))[0]) * 90.0 - 45.0 for f in fields]  # U(-45, 45)
    return _motion(x, [p[0] for p in params], [p[1] for p in params], angles).clamp(0, 1)


def zoom_factors(stop: float, step: float) -> list[float]:
    """The release's ``np.arange(1, stop, step)`` (its float end point included where NumPy includes it)."""
    return [float(v) for v in np.arange(1, stop, step)]


def zoom_blur(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    out = torch.empty_like(x)
    groups: dict[tuple[float, float], list[int]] = {}
    for row, p in enumerate(params):
        groups.setdefault((round(p[0], 6), round(p[1], 6)), []).append(row)
    for (stop, step), rows in groups.items():
        sel = x[rows]
        zs = zoom_factors(stop, step)
        acc = sel.clone()
        for z in zs:
            acc += clipped_zoom(sel, z)
        out[rows] = acc / (len(zs) + 1)
    return out.clamp(0, 1)


__all__ = [
    "defocus_blur",
    "disk_kernel",
    "gaussian_blur",
    "gaussian_kernel1d",
    "gaussian_noise",
    "glass_blur",
    "glass_draws",
    "glass_shuffle_index",
    "impulse_noise",
    "motion_blur",
    "poisson_from_uniform",
    "shot_noise",
    "speckle_noise",
    "zoom_blur",
]  # fmt: skip
