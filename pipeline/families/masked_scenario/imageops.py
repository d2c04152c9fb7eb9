"""The image operations of the XIMAGENET-12 scripts, in NumPy, on uint8 RGB arrays.

The published images were made with OpenCV; these functions follow OpenCV's definitions
so that the published parameters mean the same here:

* :func:`gaussian_blur` -- ``cv2.GaussianBlur(img, (k, k), sigma)``: separable kernel
  ``exp(-(i - (k-1)/2)^2 / (2 sigma^2))`` normalised, border ``BORDER_REFLECT_101``;
  ``sigma = 0`` takes OpenCV's default ``0.3 ((k-1)/2 - 1) + 0.8``.
* :func:`rgb_to_hsv` / :func:`hsv_to_rgb` -- OpenCV's 8-bit HSV: H in 0..179 (degrees / 2),
  S and V in 0..255.
* :func:`add_weighted` -- ``cv2.addWeighted(a, alpha, b, beta, gamma)``: saturated
  ``a alpha + b beta + gamma``.
* :func:`to_grey` -- ``cv2.cvtColor(img, COLOR_RGB2GRAY)`` replicated to three channels.

OpenCV computes 8-bit results with fixed-point arithmetic; these use float64 and round
half to even, so single pixels may differ from OpenCV's by one grey level.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import CnsbenchError


def saturate(x: np.ndarray) -> np.ndarray:
    """Round and clip to uint8 (OpenCV's ``saturate_cast<uchar>``)."""
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def gaussian_kernel(ksize: int, sigma: float) -> np.ndarray:
    """OpenCV's 1-D Gaussian kernel (``cv2.getGaussianKernel``) for an odd ``ksize``."""
    if ksize < 1 or ksize % 2 == 0:
        raise CnsbenchError(f"Gaussian kernel size must be odd and positive, got {ksize}")
    if sigma <= 0:
        sigma = 0.3 * ((ksize - 1) * 0.5 - 1) + 0.8
    x = np.arange(ksize, dtype=np.float64) - (ksize - 1) / 2
    k = np.exp(-(x**2) / (2 * sigma**2))
    return k / k.sum()


def gaussian_blur(img: np.ndarray, ksize: int, sigma: float) -> np.ndarray:
    """``cv2.GaussianBlur(img, (ksize, ksize), sigma)`` on an HxWxC uint8 array."""
    k = gaussian_kernel(ksize, sigma)
    r = ksize // 2
    x = img.astype(np.float64)
    # BORDER_REFLECT_101 is numpy's 'reflect'; it needs the padding to be < the side.
    pad_h, pad_w = min(r, img.shape[0] - 1), min(r, img.shape[1] - 1)
    if pad_h < r or pad_w < r:
        raise CnsbenchError(f"image {img.shape[:2]} is too small for a {ksize}x{ksize} blur")
    x = np.pad(x, ((r, r), (r, r), (0, 0)), mode="reflect")
    h, w = img.shape[:2]
    rows = sum(k[i] * x[i : i + h, :, :] for i in range(ksize))
    out = sum(k[i] * rows[:, i : i + w, :] for i in range(ksize))
    return saturate(out)


def add_weighted(a: np.ndarray, alpha: float, b: np.ndarray, beta: float, gamma: float) -> np.ndarray:
    return saturate(a.astype(np.float64) * alpha + b.astype(np.float64) * beta + gamma)


def to_grey(img: np.ndarray) -> np.ndarray:
    x = img.astype(np.float64)
    y = saturate(0.299 * x[..., 0] + 0.587 * x[..., 1] + 0.114 * x[..., 2])
    return np.repeat(y[..., None], 3, axis=2)


def rgb_to_hsv(img: np.ndarray) -> np.ndarray:
    """uint8 RGB -> uint8 HSV with H in 0..179 (OpenCV's 8-bit convention)."""
    x = img.astype(np.float64)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    v = x.max(axis=-1)
    diff = v - x.min(axis=-1)
    s = np.where(v > 0, 255.0 * diff / np.maximum(v, 1e-12), 0.0)
    safe = np.maximum(diff, 1e-12)
    h = np.where(
        v == r, 60.0 * (g - b) / safe, np.where(v == g, 120.0 + 60.0 * (b - r) / safe, 240.0 + 60.0 * (r - g) / safe)
    )
    h = np.where(diff == 0, 0.0, h)
    h = np.where(h < 0, h + 360.0, h)
    hh = np.rint(h / 2.0) % 180
    return np.stack([hh, np.rint(s), v], axis=-1).astype(np.uint8)


def hsv_to_rgb(hsv: np.ndarray) -> np.ndarray:
    """uint8 HSV (H in 0..179, values of 180 and more wrap) -> uint8 RGB."""
    x = hsv.astype(np.float64)
    h = (x[..., 0] * 2.0) % 360.0 / 60.0
    s = x[..., 1] / 255.0
    v = x[..., 2]
    i = np.floor(h).astype(int) % 6
    f = h - np.floor(h)
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    choices_r = [v, q, p, p, t, v]
    choices_g = [t, v, v, q, p, p]
    choices_b = [p, p, t, v, v, q]
    r = np.choose(i, choices_r)
    g = np.choose(i, choices_g)
    b = np.choose(i, choices_b)
    return saturate(np.stack([r, g, b], axis=-1))


def set_hue(img: np.ndarray, hue: int) -> np.ndarray:
    """Every pixel's hue set to ``hue`` (OpenCV units), saturation and value kept."""
    hsv = rgb_to_hsv(img)
    hsv[..., 0] = hue % 180
    return hsv_to_rgb(hsv)


def shift_hue(img: np.ndarray, delta: int) -> np.ndarray:
    """Every pixel's hue shifted by ``delta`` as ``Color_image.py`` does: ``(h + delta) % 180`` on a uint8 array.

    The sum wraps at 256 before the ``% 180`` (a hue of 170 shifted by 90 gives 260 -> 4,
    not 80), so hues near the top of the range land near red instead of rotating on.
    """
    hsv = rgb_to_hsv(img)
    hsv[..., 0] = ((hsv[..., 0].astype(int) + delta) % 256) % 180
    return hsv_to_rgb(hsv)
