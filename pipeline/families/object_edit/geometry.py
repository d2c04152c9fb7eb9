"""Geometry edits of an object with its mask: scale to a target area share, move, rotate.

Arrays: an image is ``float32 [H, W, 3]`` in [0, 1], a mask ``bool [H, W]`` (True on the
object).  Every edit transforms the object's pixels *and* its mask with the same
map, returns the moved object layer (its pixels, a soft alpha and the hard mask) and
leaves filling the uncovered background to the caller (:func:`classical_fill` here, or
mask-blended denoising in :mod:`pipeline.families.object_edit.guidance`).

ImageNet-E (``resize_obj.py``) measures size as the *object pixel rate*: mask pixels
over image pixels, and rescales around the object until the rate is within 0.015 of
the target.  :func:`scale_to_share` does the same with a secant search on the scale
factor, re-rendering from the original each time (no accumulated blur).  Rotation in
the original turns the whole object image and mask about the image centre (PIL
``rotate``, counter-clockwise for positive angles); :func:`rotate_object` does that by
default and can turn about the object's centroid instead.  Position moves the object
by whole pixels, as the original's box copy does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.errors import CnsbenchError

SIZE_TOLERANCE = 0.015  # ImageNet-E: |rate - target| <= 0.015 ends the rescaling loop


@dataclass
class Layer:
    """An object moved onto an empty canvas: pixels, soft alpha in [0, 1], hard mask."""

    pixels: np.ndarray  # float32 [H, W, 3]
    alpha: np.ndarray  # float32 [H, W]
    mask: np.ndarray  # bool [H, W], alpha >= 0.5
    info: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- measures
def area_share(mask: np.ndarray) -> float:
    """Object pixel rate: object pixels / image pixels."""
    return float(np.count_nonzero(mask)) / float(mask.size)


def centroid(mask: np.ndarray) -> tuple[float, float]:
    """(row, column) of the mask's centre of mass; ValueError on an empty mask."""
    ys, xs = np.nonzero(mask)
    if ys.size == 0:
        raise CnsbenchError("empty object mask")
    return float(ys.mean()), float(xs.mean())


def bbox(mask: np.ndarray) -> tuple[int, int, int, int]:
    """(top, left, bottom, right), bottom/right exclusive; ValueError on an empty mask."""
    ys, xs = np.nonzero(mask)
    if ys.size == 0:
        raise CnsbenchError("empty object mask")
    return int(ys.min()), int(xs.min()), int(ys.max()) + 1, int(xs.max()) + 1


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.count_nonzero(a | b)
    return float(np.count_nonzero(a & b)) / union if union else 1.0


def to_array(image: Any) -> np.ndarray:
    """PIL image -> float32 [H, W, 3] in [0, 1]."""
    return np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0


def to_image(array: np.ndarray):
    from PIL import Image

    return Image.fromarray(np.clip(np.rint(array * 255.0), 0, 255).astype(np.uint8))


# --------------------------------------------------------------------------- affine core
def _warp(image: np.ndarray, mask: np.ndarray, inverse: np.ndarray, offset: np.ndarray) -> Layer:
    """Output pixel p takes input ``inverse @ p + offset`` (row, column), bilinear; outside = empty."""
    from scipy import ndimage

    alpha = ndimage.affine_transform(mask.astype(np.float32), inverse, offset=offset, order=1, mode="constant", cval=0.0)
    premult = image * mask[..., None]
    pix = np.stack(
        [
            ndimage.affine_transform(premult[..., c], inverse, offset=offset, order=1, mode="constant", cval=0.0)
            for c in range(3)
        ],
        axis=-1,
    )
    # Un-premultiply: pixels of the object only, never the background blended at its edge.
    safe = np.where(alpha > 1e-4, alpha, 1.0)
    pix = np.where(alpha[..., None] > 1e-4, pix / safe[..., None], 0.0)
    alpha = np.clip(alpha, 0.0, 1.0)
    return Layer(pix.astype(np.float32), alpha.astype(np.float32), alpha >= 0.5)


def scale_object(image: np.ndarray, mask: np.ndarray, factor: float, center: tuple[float, float] | None = None) -> Layer:
    """The object scaled by ``factor`` (linear) about ``center`` (default: its centroid)."""
    if factor <= 0:
        raise CnsbenchError(f"scale factor must be > 0, got {factor}")
    c = np.asarray(center if center is not None else centroid(mask), dtype=np.float64)
    inverse = np.eye(2) / factor
    layer = _warp(image, mask, inverse, c - inverse @ c)
    layer.info = {"factor": float(factor)}
    return layer


def rotation_center(mask: np.ndarray, about: str) -> tuple[float, float]:
    if about == "image_center":
        h, w = mask.shape
        return (h - 1) / 2.0, (w - 1) / 2.0
    if about == "object_center":
        return centroid(mask)
    raise CnsbenchError(f"rotation centre must be 'image_center' or 'object_center', got {about!r}")


def rotate_object(image: np.ndarray, mask: np.ndarray, degrees: float, about: str = "image_center") -> Layer:
    """The object turned by ``degrees`` counter-clockwise (as PIL ``rotate``) about a centre."""
    c = np.asarray(rotation_center(mask, about), dtype=np.float64)
    a = math.radians(degrees)
    # Counter-clockwise on screen (rows grow downwards) maps an offset (dr, dc) from the
    # centre to (dr cos a - dc sin a, dr sin a + dc cos a); each output pixel samples the
    # input through the inverse (the transpose).
    inverse = np.array([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]])
    layer = _warp(image, mask, inverse, c - inverse @ c)
    layer.info = {"degrees": float(degrees), "center": [float(c[0]), float(c[1])]}
    return layer


def translate_object(image: np.ndarray, mask: np.ndarray, dy: int, dx: int) -> Layer:
    """The object moved by whole pixels (rows ``dy``, columns ``dx``); parts leaving the image are cut."""
    h, w = mask.shape
    pix = np.zeros_like(image)
    alpha = np.zeros(mask.shape, np.float32)
    ys, yd = (slice(0, h - dy), slice(dy, h)) if dy >= 0 else (slice(-dy, h), slice(0, h + dy))
    xs, xd = (slice(0, w - dx), slice(dx, w)) if dx >= 0 else (slice(-dx, w), slice(0, w + dx))
    if abs(dy) < h and abs(dx) < w:
        alpha[yd, xd] = mask[ys, xs]
        pix[yd, xd] = image[ys, xs] * mask[ys, xs][..., None]
    return Layer(pix, alpha, alpha >= 0.5, {"dy": int(dy), "dx": int(dx)})


# --------------------------------------------------------------------------- size
def scale_to_share(
    image: np.ndarray, mask: np.ndarray, target: float, tolerance: float = SIZE_TOLERANCE, max_steps: int = 30
) -> Layer:
    """Scale the object about its centroid until its area share is within ``tolerance`` of ``target``.

    Starts from ``sqrt(target / share)`` (area grows with the square of the factor) and
    refines on the measured share, re-rendering from the original every time.  The
    result's ``info`` holds the factor, the reached share and ``reached`` (False when the
    object cannot reach the target inside the image, e.g. enlarged past its borders).
    """
    if not 0 < target < 1:
        raise CnsbenchError(f"target area share must be in (0, 1), got {target}")
    share0 = area_share(mask)
    if share0 == 0:
        raise CnsbenchError("empty object mask")
    c = centroid(mask)
    want = tolerance / 4.0  # aim well inside the band; pixel quantisation keeps a residual
    best: Layer | None = None
    best_err = math.inf
    lo, hi = 0.0, math.inf  # bracket of factors: share(lo) < target < share(hi)
    factor = math.sqrt(target / share0)
    for _ in range(max_steps):
        layer = scale_object(image, mask, factor, c)
        share = area_share(layer.mask)
        err = share - target
        if abs(err) < best_err:
            best, best_err = layer, abs(err)
        if abs(err) <= want:
            break
        if err < 0:
            lo = max(lo, factor)
        else:
            hi = min(hi, factor)
        step = factor * math.sqrt(target / share) if share > 0 else factor * 2.0
        if not (lo < step < hi):
            step = (lo + hi) / 2.0 if math.isfinite(hi) else max(step, lo * 1.5)
        if abs(step - factor) < 1e-6:
            break
        factor = step
    assert best is not None
    reached = area_share(best.mask)
    best.info = {
        "factor": best.info["factor"],
        "share_before": share0,
        "target_share": float(target),
        "share": reached,
        "reached": bool(abs(reached - target) <= tolerance),
    }
    return best


# --------------------------------------------------------------------------- position
def feasible_offset(mask: np.ndarray, dy: int, dx: int) -> bool:
    """True when the object's box stays inside the image after moving by (dy, dx)."""
    top, left, bottom, right = bbox(mask)
    h, w = mask.shape
    return 0 <= top + dy and bottom + dy <= h and 0 <= left + dx and right + dx <= w


def offset_for(mask: np.ndarray, distance: float, angle: float, tries: int = 24) -> tuple[int, int, float, bool]:
    """A whole-pixel offset of length ``distance`` px, in direction ``angle`` (radians) if it fits.

    ImageNet-E places the object's box at a random position inside the image; here the
    *distance* is the level and the direction comes from the unit's seed.  If the box
    would leave the image, the other directions are tried in steps of 360/``tries``
    degrees; if none fits, the longest fitting offset along the first direction is used
    and the returned flag is False.  Returns (dy, dx, direction used, fits).
    """
    for k in range(tries):
        a = angle + 2 * math.pi * k / tries
        dy, dx = round(-distance * math.sin(a)), round(distance * math.cos(a))
        if feasible_offset(mask, dy, dx):
            return dy, dx, a, True
    best = (0, 0)
    for step in np.linspace(distance, 0.0, 64).tolist():
        dy, dx = round(-step * math.sin(angle)), round(step * math.cos(angle))
        if feasible_offset(mask, dy, dx):
            best = (dy, dx)
            break
    return best[0], best[1], angle, False


# --------------------------------------------------------------------------- fills
def dilate(mask: np.ndarray, radius: int) -> np.ndarray:
    from scipy import ndimage

    if radius <= 0:
        return mask.copy()
    y, x = np.ogrid[-radius : radius + 1, -radius : radius + 1]
    return ndimage.binary_dilation(mask, structure=(x * x + y * y) <= radius * radius)


def classical_fill(image: np.ndarray, hole: np.ndarray) -> np.ndarray:
    """Fill ``hole`` from the known pixels by normalised convolution at growing widths.

    Each hole pixel takes the Gaussian-weighted mean of known pixels around it, with the
    smallest width (1, 2, 4, ... px) at which it has known neighbours -- a smooth, cheap
    stand-in for inpainting (the original uses a learned inpainter, TFill).
    """
    from scipy import ndimage

    out = image.copy()
    known = (~hole).astype(np.float32)
    if known.sum() == 0:
        return np.zeros_like(image)
    todo = hole.copy()
    sigma = 1.0
    while todo.any():
        weight = ndimage.gaussian_filter(known, sigma, mode="nearest")
        ok = todo & (weight > 1e-3)
        if ok.any():
            for c in range(3):
                num = ndimage.gaussian_filter(image[..., c] * known, sigma, mode="nearest")
                out[..., c] = np.where(ok, num / np.maximum(weight, 1e-8), out[..., c])
            todo &= ~ok
        sigma *= 2.0
        if sigma > 4 * max(image.shape[:2]):
            break
    return out


def composite(layer: Layer, background: np.ndarray) -> np.ndarray:
    """The object layer over a background, with its soft alpha."""
    a = layer.alpha[..., None]
    return layer.pixels * a + background * (1.0 - a)
