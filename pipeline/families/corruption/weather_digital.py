"""Weather and digital corruptions of ImageNet-C, batched on tensors (same contract as :mod:`.noise_blur`).

Frost overlays frost photographs in the release; they cannot be shipped, so
:func:`procedural_frost` draws an ice texture from the image's random fields (or the
family reads a folder of frost images, option ``frost_dir``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.families.corruption.ops import (
    Fields,
    bilinear_sample,
    box_blur3,
    box_resize,
    clipped_zoom,
    column,
    filter2d,
    gaussian_filter,
    gray,
    quantize,
    stack_field,
)
from pipeline.families.corruption.ops import (
    motion_blur as _motion,
)

Params = Sequence[tuple[float, ...]]


# --------------------------------------------------------------------------- snow
def snow(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    b, _, h, w = x.shape
    n = stack_field(fields, "normal", "snow", (1, h, w), x.device)
    out = torch.empty_like(x)
    for row, p in enumerate(params):
        loc, scale, zoom, thr, radius, sigma, keep = p
        layer = clipped_zoom(loc + scale * n[row : row + 1], zoom)
        layer = torch.where(layer < thr, torch.zeros_like(layer), layer)
        layer = torch.floor(layer.clamp(0, 1) * 255.0) / 255.0  # .astype(np.uint8) truncates
        angle = float(fields[row].uniform("snow_angle", (1,))[0]) * 90.0 - 135.0  # U(-135, -45)
        layer = quantize(_motion(layer, [radius], [sigma], [angle]))  # 8-bit PNG through ImageMagick
        xi = x[row : row + 1]
        xi = keep * xi + (1 - keep) * torch.maximum(xi, gray(xi) * 1.5 + 0.5)
        out[row] = (xi + layer + torch.flip(layer, dims=(-2, -1)))[0]
    return out.clamp(0, 1)


# --------------------------------------------------------------------------- frost
def _smooth_noise(g: torch.Generator, cells: int, h: int, w: int) -> torch.Tensor:
    grid = torch.rand((1, 1, cells + 1, cells + 1), generator=g)
    return F.interpolate(grid, size=(h, w), mode="bicubic", align_corners=True)[0, 0].clamp(0, 1)


def procedural_frost(fields: Fields, h: int, w: int) -> torch.Tensor:
    """An ice texture (3, H, W) in [0, 1]: ridged multi-octave noise plus crystal streaks, blue-white.

    Not the release's photographs: a stand-in with their look (bright, bluish, fine
    crystalline structure over a cloudy base, mean grey level about 0.45).
    """
    g = fields.generator("frost")
    base = torch.zeros((h, w))
    amp, total = 1.0, 0.0
    for octave in range(5):
        n = _smooth_noise(g, 2 ** (octave + 2), h, w)
        base += amp * (1.0 - (2.0 * n - 1.0).abs()) ** 3  # ridges where the noise crosses 0.5
        total += amp
        amp *= 0.6
    base = base / total
    # Crystal streaks: sparse bright seeds smeared along a few random directions.
    seeds = (torch.rand((1, 1, h, w), generator=g) > 0.985).float()
    streaks = torch.zeros((1, 1, h, w))
    for _ in range(3):
        angle = float(torch.rand((1,), generator=g)) * 360.0
        streaks = torch.maximum(streaks, _motion(seeds, [max(h, w) / 16.0], [max(h, w) / 48.0], [angle]))
    streaks = streaks[0, 0] / streaks.max().clamp_min(1e-6)
    t = (0.75 * base + 0.6 * streaks).clamp(0, 1)
    t = t / t.max().clamp_min(1e-6)
    tint = torch.tensor([0.82, 0.9, 1.0]).view(3, 1, 1)
    return (t.unsqueeze(0) * tint).clamp(0, 1)


def folder_frost(fields: Fields, h: int, w: int, folder: str) -> torch.Tensor:
    """A random crop (H, W) of a random image of ``folder`` (resized up when smaller), as in the release."""
    from PIL import Image

    files = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
    if not files:
        raise FileNotFoundError(f"families[corruption].options.frost_dir: no .png/.jpg images in {folder}")
    u = fields.uniform("frost_pick", (3,)).numpy()
    img = Image.open(files[int(u[0] * len(files))]).convert("RGB")
    if img.width < w or img.height < h:
        f = max(w / img.width, h / img.height)
        img = img.resize((math.ceil(img.width * f), math.ceil(img.height * f)), Image.BILINEAR)
    arr = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
    y0 = int(u[1] * (arr.shape[1] - h + 1))
    x0 = int(u[2] * (arr.shape[2] - w + 1))
    return arr[:, y0 : y0 + h, x0 : x0 + w]


def frost(x: torch.Tensor, params: Params, fields: Sequence[Fields], frost_dir: str | None = None) -> torch.Tensor:
    h, w = x.shape[-2:]
    cache: dict[int, torch.Tensor] = {}
    layers = []
    for f in fields:
        if id(f) not in cache:
            cache[id(f)] = folder_frost(f, h, w, frost_dir) if frost_dir else procedural_frost(f, h, w)
        layers.append(cache[id(f)])
    layer = torch.stack(layers).to(x.device, x.dtype)
    return (column([p[0] for p in params], x) * x + column([p[1] for p in params], x) * layer).clamp(0, 1)


# --------------------------------------------------------------------------- fog
def plasma_fractal(fields: Sequence[Fields], decay: Sequence[float], mapsize: int, device) -> torch.Tensor:
    """The release's diamond-square height map (B, M, M) in [0, 1], one per row, wibble decay per row.

    Its uniform draws come from the fields (one per step and grid), so every decay of an
    image uses the same draws.
    """
    b = len(fields)
    a = torch.zeros((b, mapsize, mapsize), dtype=torch.float32, device=device)
    wibble = torch.full((b, 1, 1), 100.0, dtype=torch.float32, device=device)
    dec = torch.as_tensor(list(decay), dtype=torch.float32, device=device).view(b, 1, 1)
    step = mapsize
    level = 0

    def draw(name: str, n: int) -> torch.Tensor:
        u = stack_field(fields, "uniform", f"plasma/{level}/{name}", (n, n), device)
        return wibble * wibble * (2.0 * u - 1.0)  # wibble * U(-wibble, wibble)

    while step >= 2:
        half = step // 2
        n = mapsize // step
        corner = a[:, 0::step, 0::step]
        sq = corner + torch.roll(corner, -1, dims=1)
        sq = sq + torch.roll(sq, -1, dims=2)
        a[:, half::step, half::step] = sq / 4 + draw("squares", n)
        dr = a[:, half::step, half::step]
        ul = a[:, 0::step, 0::step]
        lt = dr + torch.roll(dr, 1, dims=1) + ul + torch.roll(ul, -1, dims=2)
        a[:, 0::step, half::step] = lt / 4 + draw("lt", n)
        tt = dr + torch.roll(dr, 1, dims=2) + ul + torch.roll(ul, -1, dims=1)
        a[:, half::step, 0::step] = tt / 4 + draw("tt", n)
        step //= 2
        wibble = wibble / dec
        level += 1
    a = a - a.amin(dim=(1, 2), keepdim=True)
    return a / a.amax(dim=(1, 2), keepdim=True)


def fog(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    h, w = x.shape[-2:]
    mapsize = 1 << max(1, math.ceil(math.log2(max(h, w))))  # 256 for the release's 224 px
    plasma = plasma_fractal(fields, [p[1] for p in params], mapsize, x.device)[:, :h, :w].to(x.dtype)
    c = column([p[0] for p in params], x)
    max_val = x.amax(dim=(1, 2, 3), keepdim=True)
    y = x + c * plasma.unsqueeze(1)
    return (y * max_val / (max_val + c)).clamp(0, 1)


# --------------------------------------------------------------------------- spatter
def _canny(img: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Edges of an 8-bit image (1, 1, H, W) in 0..255: Sobel (L1 magnitude), non-maximum suppression,
    hysteresis approximated by one 3x3 neighbourhood of a strong edge (OpenCV's Canny follows chains)."""
    sx = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], dtype=np.float64)
    gx = filter2d(img, [sx], "mirror")
    gy = filter2d(img, [sx.T], "mirror")
    mag = gx.abs() + gy.abs()
    ang = torch.remainder(torch.rad2deg(torch.atan2(gy, gx)), 180.0)
    p = F.pad(mag, (1, 1, 1, 1))
    h, w = mag.shape[-2:]

    def nb(dy: int, dx: int) -> torch.Tensor:
        return p[..., 1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w]

    horiz = (ang < 22.5) | (ang >= 157.5)
    diag1 = (ang >= 22.5) & (ang < 67.5)
    vert = (ang >= 67.5) & (ang < 112.5)
    n1 = torch.where(horiz, nb(0, -1), torch.where(diag1, nb(-1, -1), torch.where(vert, nb(-1, 0), nb(-1, 1))))
    n2 = torch.where(horiz, nb(0, 1), torch.where(diag1, nb(1, 1), torch.where(vert, nb(1, 0), nb(1, -1))))
    peak = (mag > low) & (mag >= n1) & (mag > n2)
    strong = (peak & (mag > high)).float()
    near_strong = F.max_pool2d(strong, 3, stride=1, padding=1) > 0
    return peak & near_strong


def _distance_to_edges(edges: torch.Tensor, cap: float) -> torch.Tensor:
    """Chamfer (1, 1.4) distance of every pixel to the nearest edge pixel, capped at ``cap``."""
    d = torch.where(edges, torch.zeros_like(edges, dtype=torch.float32), torch.full_like(edges, 1e6, dtype=torch.float32))
    for _ in range(int(cap) + 2):
        p = F.pad(d, (1, 1, 1, 1), value=1e6)
        h, w = d.shape[-2:]
        best = d
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                if dy or dx:
                    cost = 1.4 if dy and dx else 1.0
                    best = torch.minimum(best, p[..., 1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w] + cost)
        d = best
    return d.clamp(max=cap)


def _equalize_hist(img: torch.Tensor) -> torch.Tensor:
    """``cv2.equalizeHist`` of an 8-bit image (values 0..255 as floats)."""
    v = img.flatten().long()
    hist = torch.bincount(v, minlength=256).double().cpu()
    total = float(v.numel())
    first = int(torch.nonzero(hist)[0])
    if hist[first] == total:
        return torch.full_like(img, float(first))
    scale = 255.0 / (total - float(hist[first]))
    lut = torch.zeros(256, dtype=torch.float64)
    lut[first + 1 :] = torch.round(torch.cumsum(hist[first + 1 :], 0) * scale).clamp(0, 255)
    return lut.to(img.device)[v].view_as(img).to(img.dtype)


def spatter(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    b, _, h, w = x.shape
    n = stack_field(fields, "normal", "liquid", (1, h, w), x.device)
    out = torch.empty_like(x)
    for row, p in enumerate(params):
        loc, scale, sigma, thr, inten, mode = p
        liquid = gaussian_filter(loc + scale * n[row : row + 1], [sigma], "nearest")
        liquid = torch.where(liquid < thr, torch.zeros_like(liquid), liquid)
        xi = x[row : row + 1]
        if round(mode) == 0:  # water drops
            l8 = torch.floor(liquid.clamp(0, 1) * 255.0)
            edges = _canny(l8, 50.0, 150.0)
            dist = _distance_to_edges(edges, 20.0)
            dist = torch.floor(box_blur3(dist))
            dist = _equalize_hist(dist)
            ker = np.array([[-2, -1, 0], [-1, 1, 1], [0, 1, 2]], dtype=np.float64)
            dist = torch.round(filter2d(dist, [ker], "mirror")).clamp(0, 255)
            dist = box_blur3(dist)
            m = liquid * dist
            m = m / m.max().clamp_min(1e-12) * inten
            color = torch.tensor([175.0, 238.0, 238.0], device=x.device).view(1, 3, 1, 1) / 255.0
            out[row] = (xi + m * color).clamp(0, 1)[0]
        else:  # mud
            m = gaussian_filter((liquid > thr).to(x.dtype), [inten], "nearest")
            m = torch.where(m < 0.8, torch.zeros_like(m), m)
            color = torch.tensor([63.0, 42.0, 20.0], device=x.device).view(1, 3, 1, 1) / 255.0
            out[row] = (xi * (1 - m) + color * m).clamp(0, 1)[0]
    return out


# --------------------------------------------------------------------------- digital
def contrast(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    means = x.mean(dim=(2, 3), keepdim=True)
    return ((x - means) * column([p[0] for p in params], x) + means).clamp(0, 1)


def _hsv_parts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    v = x.amax(dim=1, keepdim=True)
    delta = v - x.amin(dim=1, keepdim=True)
    s = torch.where(v > 0, delta / v.clamp_min(1e-12), torch.zeros_like(v))
    return v, s


def brightness(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    """HSV value + c (skimage rgb2hsv / hsv2rgb): hue and saturation kept, so RGB scales by v'/v."""
    v, _ = _hsv_parts(x)
    v2 = (v + column([p[0] for p in params], x)).clamp(0, 1)
    scaled = x * v2 / v.clamp_min(1e-12)
    return torch.where(v > 0, scaled, v2.expand_as(x)).clamp(0, 1)


def saturate(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    """HSV saturation * a + b: each channel moves along v - (v - channel) s'/s; grey pixels have hue 0 (red)."""
    v, s = _hsv_parts(x)
    s2 = (s * column([p[0] for p in params], x) + column([p[1] for p in params], x)).clamp(0, 1)
    coloured = v - (v - x) * s2 / s.clamp_min(1e-12)
    grey = torch.cat([v, v * (1 - s2), v * (1 - s2)], dim=1)  # hsv2rgb at hue 0
    return torch.where(s > 0, coloured, grey).clamp(0, 1)


def _affine_matrix(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """``cv2.getAffineTransform``: the 2x3 matrix mapping three points ``src`` onto ``dst``."""
    a = np.hstack([src, np.ones((3, 1))])
    return np.linalg.solve(a, dst).T


def elastic_transform(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    b, c, h, w = x.shape
    out = torch.empty_like(x)
    ys, xs = torch.meshgrid(torch.arange(h, dtype=x.dtype), torch.arange(w, dtype=x.dtype), indexing="ij")
    ys, xs = ys.to(x.device), xs.to(x.device)
    cs = np.array([h // 2, w // 2], dtype=np.float64)
    sq = min(h, w) // 3
    pts1 = np.array([cs + sq, [cs[0] + sq, cs[1] - sq], cs - sq], dtype=np.float64)
    for row, p in enumerate(params):
        alpha, sigma, jitter = p
        f = fields[row]
        pts2 = pts1 + (f.uniform("affine", (3, 2)).numpy() * 2 - 1) * jitter
        m = np.vstack([_affine_matrix(pts1, pts2), [0, 0, 1]])
        inv = np.linalg.inv(m)  # warpAffine samples the source at M^-1 (x, y)
        sx = inv[0, 0] * xs + inv[0, 1] * ys + inv[0, 2]
        sy = inv[1, 0] * xs + inv[1, 1] * ys + inv[1, 2]
        warped = bilinear_sample(x[row : row + 1], sy.unsqueeze(0), sx.unsqueeze(0), "mirror")
        dx = f.uniform("dx", (1, 1, h, w)).to(x.device, x.dtype) * 2 - 1
        dy = f.uniform("dy", (1, 1, h, w)).to(x.device, x.dtype) * 2 - 1
        dx = gaussian_filter(dx, [sigma], "reflect", truncate=3.0)[0, 0] * alpha
        dy = gaussian_filter(dy, [sigma], "reflect", truncate=3.0)[0, 0] * alpha
        out[row] = bilinear_sample(warped, (ys + dy).unsqueeze(0), (xs + dx).unsqueeze(0), "reflect")[0]
    return out.clamp(0, 1)


def pixelate(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    """PIL ``Image.BOX`` down to ``int(size c)`` and back, horizontal pass first, 8-bit after each pass."""
    b, c, h, w = x.shape
    out = torch.empty_like(x)
    groups: dict[tuple[int, int], list[int]] = {}
    for row, p in enumerate(params):
        groups.setdefault((max(1, int(h * p[0])), max(1, int(w * p[0]))), []).append(row)

    for (sh, sw), rows in groups.items():
        y = quantize(box_resize(x[rows], sw, 3))  # horizontal pass first, 8-bit image in between
        y = quantize(box_resize(y, sh, 2))
        y = quantize(box_resize(y, w, 3))
        out[rows] = quantize(box_resize(y, h, 2))
    return out


def jpeg_compression(x: torch.Tensor, params: Params, fields: Sequence[Fields]) -> torch.Tensor:
    """JPEG encode/decode (torchvision's libjpeg) at quality ``round(c)``."""
    from torchvision.io import decode_jpeg, encode_jpeg

    u8 = torch.round(x.clamp(0, 1) * 255.0).to(torch.uint8).cpu()
    out = []
    for row, p in enumerate(params):
        data = encode_jpeg(u8[row], quality=int(round(p[0])))
        out.append(decode_jpeg(data))
    return torch.stack(out).to(x.device, x.dtype) / 255.0
