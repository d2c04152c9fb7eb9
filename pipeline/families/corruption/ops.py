"""Batched tensor operators the corruptions share: filters, resampling, random fields.

Images are float tensors ``(B, C, H, W)`` in [0, 1] on any device.  Boundary modes use
scipy's names: ``nearest`` (edge replicated), ``reflect`` (half-sample symmetric,
``d c b a | a b c d``), ``mirror`` (whole-sample, ``d c b | a b c d``; OpenCV's default
``BORDER_REFLECT_101``).  Per-row parameters are 1-D tensors of length B.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.errors import CnsbenchError


# --------------------------------------------------------------------------- random fields
class Fields:
    """Random fields of one (image, seed, corruption), drawn once and reused across severities.

    Each named field has its own NumPy generator (PCG64) seeded from (``seed``, name and
    shape), so a field does not depend on which other fields were drawn before it, nor
    on the severity.  Fields are float32 tensors on the CPU.
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._cache: dict[tuple, torch.Tensor] = {}

    def _rng(self, name: str) -> np.random.Generator:
        h = hashlib.sha256(f"{self.seed}/{name}".encode()).digest()
        return np.random.default_rng(int.from_bytes(h[:16], "little"))

    def generator(self, name: str) -> torch.Generator:
        """A torch generator for procedural textures (seeded like the fields)."""
        h = hashlib.sha256(f"{self.seed}/{name}".encode()).digest()
        return torch.Generator().manual_seed(int.from_bytes(h[:8], "little") & ((1 << 63) - 1))

    def _get(self, kind: str, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        key = (kind, name, shape)
        if key not in self._cache:
            rng = self._rng(f"{kind}/{name}/{'x'.join(map(str, shape))}")
            arr = rng.standard_normal(shape, dtype=np.float32) if kind == "normal" else rng.random(shape, dtype=np.float32)
            self._cache[key] = torch.from_numpy(arr)
        return self._cache[key]

    def normal(self, name: str, shape: Sequence[int]) -> torch.Tensor:
        """N(0, 1), float32."""
        return self._get("normal", name, tuple(int(v) for v in shape))

    def uniform(self, name: str, shape: Sequence[int]) -> torch.Tensor:
        """U[0, 1), float32."""
        return self._get("uniform", name, tuple(int(v) for v in shape))


def stack_field(fields: Sequence[Fields], kind: str, name: str, shape: Sequence[int], device) -> torch.Tensor:
    """``(B, *shape)`` float32 tensor of one field per row (rows sharing a Fields share the draw)."""
    cache: dict[int, torch.Tensor] = {}
    out = []
    for f in fields:
        if id(f) not in cache:
            cache[id(f)] = getattr(f, kind)(name, shape)
        out.append(cache[id(f)])
    return torch.stack(out).to(device=device, dtype=torch.float32)


def column(values: Sequence[float], x: torch.Tensor) -> torch.Tensor:
    """Per-row values as a ``(B, 1, 1, 1)`` tensor on ``x``'s device."""
    return torch.as_tensor(list(values), dtype=x.dtype, device=x.device).view(-1, 1, 1, 1)


# --------------------------------------------------------------------------- boundaries
def boundary_index(n: int, before: int, after: int, mode: str) -> torch.Tensor:
    """Source indices of a length-``n`` axis padded by ``before``/``after`` (any pad size)."""
    i = torch.arange(-before, n + after)
    if mode == "nearest":
        return i.clamp(0, n - 1)
    if mode == "reflect":  # half-sample symmetric, period 2n
        j = torch.remainder(i, 2 * n)
        return torch.where(j >= n, 2 * n - 1 - j, j)
    if mode == "mirror":  # whole-sample symmetric, period 2n - 2
        if n == 1:
            return torch.zeros_like(i)
        j = torch.remainder(i, 2 * n - 2)
        return torch.where(j >= n, 2 * n - 2 - j, j)
    raise CnsbenchError(f"unknown boundary mode {mode!r}")


def pad(x: torch.Tensor, py: int, px: int, mode: str) -> torch.Tensor:
    h, w = x.shape[-2:]
    iy = boundary_index(h, py, py, mode).to(x.device)
    ix = boundary_index(w, px, px, mode).to(x.device)
    return x.index_select(-2, iy).index_select(-1, ix)


# --------------------------------------------------------------------------- filters
def gaussian_kernel1d(sigma: float, truncate: float = 4.0) -> np.ndarray:
    """scipy.ndimage's sampled Gaussian: radius ``int(truncate * sigma + 0.5)``, normalised."""
    if sigma <= 0:
        return np.ones(1)
    r = int(truncate * float(sigma) + 0.5)
    t = np.arange(-r, r + 1, dtype=np.float64)
    k = np.exp(-0.5 * t * t / (float(sigma) ** 2))
    return k / k.sum()


def _stack_kernels(kernels: Sequence[np.ndarray]) -> np.ndarray:
    """Centre odd 1-D kernels of different lengths in one zero-padded array."""
    n = max(len(k) for k in kernels)
    out = np.zeros((len(kernels), n))
    for i, k in enumerate(kernels):
        o = (n - len(k)) // 2
        out[i, o : o + len(k)] = k
    return out


def separable(x: torch.Tensor, kernels: Sequence[np.ndarray], mode: str) -> torch.Tensor:
    """Correlate every row of ``x`` with its own odd 1-D kernel along H, then W."""
    b, c, h, w = x.shape
    k = torch.as_tensor(_stack_kernels(kernels), dtype=x.dtype, device=x.device)
    r = (k.shape[1] - 1) // 2
    if r == 0:
        return x * k[:, 0].view(b, 1, 1, 1)
    weight = k.repeat_interleave(c, dim=0)  # (B*C, K)
    y = pad(x, r, 0, mode).reshape(1, b * c, h + 2 * r, w)
    y = F.conv2d(y, weight.view(b * c, 1, -1, 1), groups=b * c)
    y = pad(y.view(b, c, h, w), 0, r, mode).reshape(1, b * c, h, w + 2 * r)
    y = F.conv2d(y, weight.view(b * c, 1, 1, -1), groups=b * c)
    return y.view(b, c, h, w)


def gaussian_filter(x: torch.Tensor, sigmas: Sequence[float], mode: str = "nearest", truncate: float = 4.0) -> torch.Tensor:
    """Per-row ``scipy.ndimage.gaussian_filter`` over H and W (skimage's default mode is 'nearest')."""
    return separable(x, [gaussian_kernel1d(s, truncate) for s in sigmas], mode)


def filter2d(x: torch.Tensor, kernels: Sequence[np.ndarray], mode: str = "mirror") -> torch.Tensor:
    """Per-row 2-D correlation with odd square kernels (``cv2.filter2D`` with its default border)."""
    b, c, h, w = x.shape
    n = max(k.shape[0] for k in kernels)
    stacked = np.zeros((b, n, n))
    for i, k in enumerate(kernels):
        o = (n - k.shape[0]) // 2
        stacked[i, o : o + k.shape[0], o : o + k.shape[0]] = k
    weight = torch.as_tensor(stacked, dtype=x.dtype, device=x.device).repeat_interleave(c, dim=0).unsqueeze(1)
    r = (n - 1) // 2
    y = pad(x, r, r, mode).reshape(1, b * c, h + 2 * r, w + 2 * r)
    return F.conv2d(y, weight, groups=b * c).view(b, c, h, w)


def box_blur3(x: torch.Tensor) -> torch.Tensor:
    """``cv2.blur(x, (3, 3))``: 3x3 mean, border reflect-101."""
    return filter2d(x, [np.full((3, 3), 1.0 / 9.0)] * x.shape[0], "mirror")


# --------------------------------------------------------------------------- resampling
def _linear_axis(n: int, zoom: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``clipped_zoom`` along one axis: for each output pixel, two source indices and a weight.

    The release crops the central ``ceil(n / zoom)`` pixels, zooms them with
    ``scipy.ndimage.zoom(order=1)`` (output length ``round(ch * zoom)``, corner-aligned
    coordinates) and trims the result back to ``n`` centred pixels.
    """
    ch = int(np.ceil(n / zoom))
    top = (n - ch) // 2
    out_len = int(round(ch * zoom))
    trim = (out_len - n) // 2
    j = np.arange(n) + trim
    coord = j * (ch - 1) / (out_len - 1) if out_len > 1 else np.zeros(n)
    i0 = np.floor(coord).astype(np.int64)
    i0 = np.clip(i0, 0, ch - 1)
    i1 = np.clip(i0 + 1, 0, ch - 1)
    wt = coord - i0
    return torch.as_tensor(i0 + top), torch.as_tensor(i1 + top), torch.as_tensor(wt)


def clipped_zoom(x: torch.Tensor, zoom: float) -> torch.Tensor:
    """Zoom ``x`` (..., H, W) about its centre by ``zoom`` >= 1, keeping the size (ImageNet-C ``clipped_zoom``)."""
    h, w = x.shape[-2:]
    y0, y1, wy = (t.to(x.device) for t in _linear_axis(h, zoom))
    x0, x1, wx = (t.to(x.device) for t in _linear_axis(w, zoom))
    wy = wy.to(x.dtype).view(-1, 1)
    wx = wx.to(x.dtype)
    rows = x.index_select(-2, y0) * (1 - wy) + x.index_select(-2, y1) * wy
    return rows.index_select(-1, x0) * (1 - wx) + rows.index_select(-1, x1) * wx


def box_resize_ranges(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """PIL's ``Image.BOX`` resampling (Pillow's ``precompute_coeffs``) as input ranges [lo, hi) per output pixel.

    The box filter gives weight 1 to the input pixels whose centres fall in the output
    pixel's footprint (normalised), a contiguous range, so a resize is a difference of
    cumulative sums.
    """
    scale = n_in / n_out
    filterscale = max(scale, 1.0)
    support = 0.5 * filterscale
    lo = np.zeros(n_out, dtype=np.int64)
    hi = np.zeros(n_out, dtype=np.int64)
    for xx in range(n_out):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), n_in)
        t = (np.arange(xmin, xmax) - center + 0.5) / filterscale
        on = np.nonzero((t > -0.5) & (t <= 0.5))[0]
        lo[xx], hi[xx] = xmin + on[0], xmin + on[-1] + 1
    return lo, hi


def box_resize(x: torch.Tensor, n_out: int, dim: int) -> torch.Tensor:
    """Resize ``x`` along ``dim`` with PIL's BOX filter (mean of a contiguous input range)."""
    n_in = x.shape[dim]
    lo, hi = (torch.as_tensor(v, device=x.device) for v in box_resize_ranges(n_in, n_out))
    c = torch.cumsum(x.double(), dim=dim)
    zero = torch.zeros_like(c.narrow(dim, 0, 1))
    c = torch.cat([zero, c], dim=dim)
    total = c.index_select(dim, hi) - c.index_select(dim, lo)
    shape = [1] * x.dim()
    shape[dim] = n_out
    return (total / (hi - lo).double().view(shape)).to(x.dtype)


def bilinear_sample(x: torch.Tensor, ys: torch.Tensor, xs: torch.Tensor, mode: str) -> torch.Tensor:
    """Sample ``x`` (B, C, H, W) at per-row pixel coordinates ``ys``/``xs`` (B, H, W), order 1.

    Out-of-range coordinates are folded back with the boundary ``mode`` (scipy's
    ``map_coordinates`` semantics for 'reflect' / 'mirror' / 'nearest').
    """
    b, c, h, w = x.shape
    y0 = torch.floor(ys)
    x0 = torch.floor(xs)
    wy = (ys - y0).unsqueeze(1)
    wx = (xs - x0).unsqueeze(1)
    y0 = y0.long()
    x0 = x0.long()

    def fold(i: torch.Tensor, n: int) -> torch.Tensor:
        if mode == "nearest":
            return i.clamp(0, n - 1)
        if mode == "reflect":
            j = torch.remainder(i, 2 * n)
            return torch.where(j >= n, 2 * n - 1 - j, j)
        j = torch.remainder(i, max(2 * n - 2, 1))
        return torch.where(j >= n, 2 * n - 2 - j, j)

    flat = x.reshape(b, c, h * w)

    def gather(yy: torch.Tensor, xx: torch.Tensor) -> torch.Tensor:
        idx = (fold(yy, h) * w + fold(xx, w)).view(b, 1, h * w).expand(b, c, h * w)
        return flat.gather(2, idx).view(b, c, h, w)

    return (
        gather(y0, x0) * (1 - wy) * (1 - wx)
        + gather(y0, x0 + 1) * (1 - wy) * wx
        + gather(y0 + 1, x0) * wy * (1 - wx)
        + gather(y0 + 1, x0 + 1) * wy * wx
    )


def motion_blur(x: torch.Tensor, radius: Sequence[float], sigma: Sequence[float], angle: Sequence[float]) -> torch.Tensor:
    """ImageMagick ``MotionBlurImage`` per row: a one-sided Gaussian along ``angle`` (degrees).

    Kernel width ``2 ceil(radius) + 1``, weights ``exp(-i^2 / (2 sigma^2))`` normalised,
    tap ``i`` reads the pixel at ``(x + ceil(i cos a - 0.5), y + ceil(i sin a - 0.5))``,
    edge pixels repeated outside the image (ImageMagick's default virtual pixels).
    """
    b, c, h, w = x.shape
    widths = [int(2 * math.ceil(r) + 1) for r in radius]
    p = max(widths)
    padded = pad(x, p, p, "nearest")
    out = torch.zeros_like(x)
    for row in range(b):
        width, s, a = widths[row], float(sigma[row]), math.radians(float(angle[row]))
        i = np.arange(width, dtype=np.float64)
        k = np.exp(-(i * i) / (2.0 * s * s))
        k /= k.sum()
        # ImageMagick: point = (width sin a, width cos a); offsets from the unit direction.
        hyp = math.hypot(width * math.sin(a), width * math.cos(a))
        ox = np.ceil(i * (width * math.cos(a)) / hyp - 0.5).astype(int)
        oy = np.ceil(i * (width * math.sin(a)) / hyp - 0.5).astype(int)
        acc = torch.zeros((c, h, w), dtype=x.dtype, device=x.device)
        for j in range(width):
            acc += float(k[j]) * padded[row, :, p + oy[j] : p + oy[j] + h, p + ox[j] : p + ox[j] + w]
        out[row] = acc
    return out


def quantize(x: torch.Tensor) -> torch.Tensor:
    """Round to 8-bit levels (where the release passes through uint8 images)."""
    return torch.round(x.clamp(0, 1) * 255.0) / 255.0


def gray(x: torch.Tensor) -> torch.Tensor:
    """``cv2.COLOR_RGB2GRAY`` weights, (B, 1, H, W)."""
    return 0.299 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3]
