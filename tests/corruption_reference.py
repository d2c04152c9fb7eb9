"""Per-image NumPy / SciPy / PIL implementations of ImageNet-C corruption formulas (test reference).

Written from the published formulas independently of :mod:`pipeline.families.corruption`:
one HxWx3 float image in [0, 1] at a time, random inputs passed in explicitly so that a
test can feed the same draws as the batched implementation.  ``bench/corruptions.py``
times them as the straightforward per-image baseline.
"""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image
from scipy import ndimage


def to_pil(x: np.ndarray) -> Image.Image:
    return Image.fromarray(np.uint8(np.round(np.clip(x, 0, 1) * 255)))


def from_pil(img: Image.Image) -> np.ndarray:
    return np.asarray(img, dtype=np.float64) / 255.0


def gaussian_noise(x, c, noise):
    return np.clip(x + noise * c, 0, 1)


def speckle_noise(x, c, noise):
    return np.clip(x + x * noise * c, 0, 1)


def shot_noise(x, c, rng):
    return np.clip(rng.poisson(x * c) / c, 0, 1)


def impulse_noise(x, amount, u_flip, u_salt):
    out = x.copy()
    flip = u_flip < amount
    out[flip & (u_salt < 0.5)] = 1.0
    out[flip & (u_salt >= 0.5)] = 0.0
    return out


def gaussian_blur(x, sigma):
    # skimage.filters.gaussian(multichannel=True): scipy gaussian_filter, mode 'nearest', truncate 4.
    return np.clip(ndimage.gaussian_filter(x, sigma=(sigma, sigma, 0), mode="nearest", truncate=4.0), 0, 1)


def _cv2_gaussian_kernel(ksize, sigma):
    t = np.arange(ksize) - (ksize - 1) / 2
    g = np.exp(-t * t / (2 * sigma * sigma))
    return g / g.sum()


def disk(radius, alias_blur):
    if radius <= 8:
        grid, ksize = np.arange(-8, 9), 3
    else:
        grid, ksize = np.arange(-radius, radius + 1), 5
    xx, yy = np.meshgrid(grid, grid)
    d = np.array((xx**2 + yy**2) <= radius**2, dtype=np.float64)
    d /= d.sum()
    g = _cv2_gaussian_kernel(ksize, alias_blur)
    d = ndimage.correlate1d(d, g, axis=0, mode="mirror")
    return ndimage.correlate1d(d, g, axis=1, mode="mirror")


def defocus_blur(x, radius, alias_blur):
    k = disk(radius, alias_blur)
    return np.clip(np.stack([ndimage.correlate(x[..., ch], k, mode="mirror") for ch in range(3)], -1), 0, 1)


def glass_blur(x, sigma, delta, iterations, draws):
    """``draws[it, h, w] = (dx, dy)``; the release's in-place "swap" on views, which copies."""
    h, w = x.shape[:2]
    y = np.uint8(gaussian_blur(x, sigma) * 255)
    for it in range(iterations):
        for hh in range(h - delta, delta, -1):
            for ww in range(w - delta, delta, -1):
                dx, dy = draws[it, hh, ww]
                hp, wp = hh + dy, ww + dx
                y[hh, ww], y[hp, wp] = y[hp, wp], y[hh, ww]
    return gaussian_blur(y / 255.0, sigma)


def motion_blur(x, radius, sigma, angle):
    """ImageMagick MotionBlurImage: one-sided Gaussian taps along ``angle``, edge pixels repeated."""
    width = int(2 * math.ceil(radius) + 1)
    i = np.arange(width)
    k = np.exp(-(i**2) / (2.0 * sigma * sigma))
    k /= k.sum()
    a = math.radians(angle)
    h, w = x.shape[:2]
    out = np.zeros_like(x)
    ys, xs = np.mgrid[0:h, 0:w]
    for j in range(width):
        ox = math.ceil(j * math.cos(a) - 0.5)
        oy = math.ceil(j * math.sin(a) - 0.5)
        out += k[j] * x[np.clip(ys + oy, 0, h - 1), np.clip(xs + ox, 0, w - 1)]
    return np.clip(out, 0, 1)


def clipped_zoom(img, zoom_factor):
    h = img.shape[0]
    ch = int(np.ceil(h / zoom_factor))
    top = (h - ch) // 2
    img = ndimage.zoom(img[top : top + ch, top : top + ch], (zoom_factor, zoom_factor, 1), order=1)
    trim = (img.shape[0] - h) // 2
    return img[trim : trim + h, trim : trim + h]


def zoom_blur(x, stop, step):
    zs = np.arange(1, stop, step)
    out = np.zeros_like(x)
    for z in zs:
        out += clipped_zoom(x, z)
    return np.clip((x + out) / (len(zs) + 1), 0, 1)


def contrast(x, c):
    m = x.mean(axis=(0, 1), keepdims=True)
    return np.clip((x - m) * c + m, 0, 1)


def _rgb_to_hsv(x):
    from matplotlib.colors import rgb_to_hsv

    return rgb_to_hsv(x)


def _hsv_to_rgb(x):
    from matplotlib.colors import hsv_to_rgb

    return hsv_to_rgb(x)


def brightness(x, c):
    hsv = _rgb_to_hsv(x)
    hsv[..., 2] = np.clip(hsv[..., 2] + c, 0, 1)
    return np.clip(_hsv_to_rgb(hsv), 0, 1)


def saturate(x, a, b):
    hsv = _rgb_to_hsv(x)
    hsv[..., 1] = np.clip(hsv[..., 1] * a + b, 0, 1)
    return np.clip(_hsv_to_rgb(hsv), 0, 1)


def pixelate(x, c):
    img = to_pil(x)
    w, h = img.size
    img = img.resize((int(w * c), int(h * c)), Image.BOX).resize((w, h), Image.BOX)
    return from_pil(img)


def jpeg_compression(x, quality):
    buf = io.BytesIO()
    to_pil(x).save(buf, "JPEG", quality=int(quality))
    return from_pil(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))


def elastic_transform(x, alpha, sigma, jitter, u_affine, u_dx, u_dy):
    """u_affine (3, 2), u_dx / u_dy (H, W) uniform [0, 1) draws."""
    h, w = x.shape[:2]
    cs = np.float64([h // 2, w // 2])
    sq = min(h, w) // 3
    pts1 = np.float64([cs + sq, [cs[0] + sq, cs[1] - sq], cs - sq])
    pts2 = pts1 + (u_affine * 2 - 1) * jitter
    # getAffineTransform: M (2x3) with M [p, 1] = q for the three point pairs.
    m = np.linalg.solve(np.hstack([pts1, np.ones((3, 1))]), pts2).T
    inv = np.linalg.inv(np.vstack([m, [0, 0, 1]]))
    # warpAffine (bilinear, reflect-101): dst(x, y) = src(inv [x, y, 1]); scipy works in (row, col).
    rc = np.array([[inv[1, 1], inv[1, 0]], [inv[0, 1], inv[0, 0]]])
    off = np.array([inv[1, 2], inv[0, 2]])
    warped = np.stack(
        [ndimage.affine_transform(x[..., ch], rc, offset=off, order=1, mode="mirror") for ch in range(3)], -1
    )
    dx = ndimage.gaussian_filter(u_dx * 2 - 1, sigma, mode="reflect", truncate=3) * alpha
    dy = ndimage.gaussian_filter(u_dy * 2 - 1, sigma, mode="reflect", truncate=3) * alpha
    yy, xx = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    out = np.stack(
        [ndimage.map_coordinates(warped[..., ch], [yy + dy, xx + dx], order=1, mode="reflect") for ch in range(3)], -1
    )
    return np.clip(out, 0, 1)


def plasma_fractal(rng, mapsize=256, wibbledecay=3.0):
    a = np.zeros((mapsize, mapsize))
    step, wibble = mapsize, 100.0

    def wm(arr):
        return arr / 4 + wibble * rng.uniform(-wibble, wibble, arr.shape)

    while step >= 2:
        half = step // 2
        corner = a[0:mapsize:step, 0:mapsize:step]
        sq = corner + np.roll(corner, -1, axis=0)
        sq += np.roll(sq, -1, axis=1)
        a[half:mapsize:step, half:mapsize:step] = wm(sq)
        dr = a[half:mapsize:step, half:mapsize:step]
        ul = a[0:mapsize:step, 0:mapsize:step]
        a[0:mapsize:step, half:mapsize:step] = wm(dr + np.roll(dr, 1, axis=0) + ul + np.roll(ul, -1, axis=1))
        a[half:mapsize:step, 0:mapsize:step] = wm(dr + np.roll(dr, 1, axis=1) + ul + np.roll(ul, -1, axis=0))
        step //= 2
        wibble /= wibbledecay
    a -= a.min()
    return a / a.max()


def fog(x, c, decay, rng):
    h, w = x.shape[:2]
    size = 1 << max(1, math.ceil(math.log2(max(h, w))))
    mx = x.max()
    y = x + c * plasma_fractal(rng, size, decay)[:h, :w][..., None]
    return np.clip(y * mx / (mx + c), 0, 1)
