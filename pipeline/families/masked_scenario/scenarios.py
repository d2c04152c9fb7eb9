"""The XIMAGENET-12 scenarios at continuous strength, as pure functions on arrays.

Each scenario takes the unit's original image (uint8 RGB, HxWx3), its object mask
(bool HxW, True on the object), a strength ``s`` in [0, 1] and the scenario's random
draws, and returns the new image.  ``s = 0`` returns the original unchanged (byte for
byte), ``s = 1`` is the published transform with the published parameters (the
repository's scripts ``utils.py``, ``Color_image.py``, ``generated_background.py``,
``Segmentbackground.py``, ``transparent.py``).  In between:

=====================  ============  ===========================================================
scenario               region        published transform (s = 1) / in between
=====================  ============  ===========================================================
blur_background        background    GaussianBlur 15x15, sigma 3 / sigma ramps 0 -> 3
blur_object            object        GaussianBlur 15x15, sigma 3 / sigma ramps 0 -> 3
image_r, _g, _b        background    HSV hue set to one value drawn from R [0, 29] or [150, 180]
                                     (either half with p = 1/2), G [30, 89], B [90, 149] (OpenCV
                                     hue units, degrees / 2) / pixel blend with the original
image_rainbow          background    hue shifted by d ~ U{0..90}: (h + d) wrapped in uint8, then
                                     % 180 / shift round(s d)
image_grey             background    grey (ITU-R 601 luma) / pixel blend
bright_background      background    unsharp mask addWeighted(img, 1.5, GaussianBlur 9x9 sigma 4,
                                     0.9, 1.9) / weights ramp (1 + 0.5 s, 0.9 s, 1.9 s)
bright_object          object        the same on the object
segmented_image        background    set to (0, 0, 0) / background scaled by (1 - s)
transparent_image      background    RGBA with alpha 0 on the background, RGB kept / alpha
                                     255 (1 - s)
random_background      image         an image B of a class outside the benchmark; this image and
                                     its mask resized to B's size, addWeighted(B, 1, segmented,
                                     1, 0): background = B, object = saturate(object + B) /
                                     background (1-s) I + s B, object saturate(I + s B).
                                     ``paste`` mode: object kept.
=====================  ============  ===========================================================

(``generated_background`` needs the text-to-image model: :mod:`.generated`.)

Quirks of the scripts kept on purpose: the overexposure blur passes ``cv2.BORDER_DEFAULT``
(= 4) where the sigma goes, so its sigma is 4; the R/G/B scenarios *set* the hue rather
than shift it; the rainbow shift wraps in uint8 before its ``% 180``; the random-background
blend adds the background under the object too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from pipeline.errors import CnsbenchError, UnknownKey
from pipeline.families.masked_scenario import imageops

BLUR_KERNEL = 15  # utils.blur: cv2.GaussianBlur(image, (15, 15), 3)
BLUR_SIGMA = 3.0
BRIGHT_KERNEL = 9  # Color_image.py: cv2.GaussianBlur(orig_img, (9, 9), cv2.BORDER_DEFAULT)
BRIGHT_SIGMA = 4.0  # cv2.BORDER_DEFAULT == 4, passed as sigmaX
BRIGHT_WEIGHTS = (1.5, 0.9, 1.9)  # cv2.addWeighted(orig, 1.5, blur, 0.9, 1.9)
HUE_RANGES: dict[str, tuple[tuple[int, int], ...]] = {  # Color_image.py hue_value, inclusive
    "image_r": ((0, 29), (150, 180)),
    "image_g": ((30, 89),),
    "image_b": ((90, 149),),
}
RAINBOW_MAX_SHIFT = 90  # random.randint(0, 90)


@dataclass(frozen=True)
class Scenario:
    name: str
    region: str  # "background", "object" or "image": the pixels the scenario may change
    apply: Callable[..., np.ndarray]
    doc: str


def _where(mask: np.ndarray, region: str, new: np.ndarray, old: np.ndarray) -> np.ndarray:
    sel = mask if region == "object" else ~mask
    out = old.copy()
    out[sel] = new[sel]
    return out


def _blend(old: np.ndarray, new: np.ndarray, s: float) -> np.ndarray:
    if s <= 0:
        return old.copy()
    if s >= 1:
        return new.copy()
    return imageops.saturate(old.astype(np.float64) * (1 - s) + new.astype(np.float64) * s)


def _blur(region: str):
    def apply(img, mask, s, draws, opts):
        if s <= 0:
            return img.copy()
        blurred = imageops.gaussian_blur(img, opts.get("blur_kernel", BLUR_KERNEL), s * opts.get("blur_sigma", BLUR_SIGMA))
        return _where(mask, region, blurred, img)

    return apply


def _hue_set(img, mask, s, draws, opts):
    return _where(mask, "background", _blend(img, imageops.set_hue(img, draws["hue"]), s), img)


def _rainbow(img, mask, s, draws, opts):
    delta = int(round(s * draws["hue_shift"]))
    if s <= 0:
        return img.copy()
    return _where(mask, "background", imageops.shift_hue(img, delta), img)


def _grey(img, mask, s, draws, opts):
    return _where(mask, "background", _blend(img, imageops.to_grey(img), s), img)


def _bright(region: str):
    def apply(img, mask, s, draws, opts):
        if s <= 0:
            return img.copy()
        a, b, g = opts.get("bright_weights", BRIGHT_WEIGHTS)
        blurred = imageops.gaussian_blur(img, opts.get("bright_kernel", BRIGHT_KERNEL), opts.get("bright_sigma", BRIGHT_SIGMA))
        usm = imageops.add_weighted(img, 1 + (a - 1) * s, blurred, b * s, g * s)
        return _where(mask, region, usm, img)

    return apply


def _segmented(img, mask, s, draws, opts):
    return _where(mask, "background", _blend(img, np.zeros_like(img), s), img)


def _transparent(img, mask, s, draws, opts):
    alpha = np.full(img.shape[:2], 255, dtype=np.uint8)
    alpha[~mask] = imageops.saturate(np.array(255.0 * (1 - s)))
    return np.concatenate([img, alpha[..., None]], axis=2)


def _random_background(img, mask, s, draws, opts):
    bg = draws.get("background")
    if bg is None:
        raise CnsbenchError("random_background needs a background image (draws['background'])")
    if s <= 0:
        return img.copy()
    x, b = img.astype(np.float64), bg.astype(np.float64)
    out = (1 - s) * x + s * b
    if opts.get("random_background_mode", "add") == "add":
        out[mask] = x[mask] + s * b[mask]
        return imageops.saturate(out)
    out = imageops.saturate(out)
    out[mask] = img[mask]
    return out


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("blur_background", "background", _blur("background"), "Gaussian blur 15x15 sigma 3 of the background"),
        Scenario("blur_object", "object", _blur("object"), "Gaussian blur 15x15 sigma 3 of the object"),
        Scenario("image_r", "background", _hue_set, "background hue set to a red hue"),
        Scenario("image_g", "background", _hue_set, "background hue set to a green hue"),
        Scenario("image_b", "background", _hue_set, "background hue set to a blue hue"),
        Scenario("image_rainbow", "background", _rainbow, "background hue shifted by 0..90 (OpenCV units, uint8 wrap)"),
        Scenario("image_grey", "background", _grey, "background in grey"),
        Scenario("bright_background", "background", _bright("background"), "overexposed background (unsharp mask)"),
        Scenario("bright_object", "object", _bright("object"), "overexposed object (unsharp mask)"),
        Scenario("segmented_image", "background", _segmented, "background set to black"),
        Scenario("transparent_image", "background", _transparent, "RGBA, background alpha 0 (RGB kept)"),
        Scenario("random_background", "image", _random_background, "another image blended in as background"),
    ]
}
GENERATED = "generated_background"  # needs the text-to-image model (pipeline.families.masked_scenario.generated)
ALL_NAMES = [*SCENARIOS, GENERATED]


def draws_for(name: str, rng: np.random.Generator) -> dict[str, Any]:
    """The scenario's random parameters (as the scripts' ``random.randint`` calls), from ``rng``."""
    if name in HUE_RANGES:
        ranges = HUE_RANGES[name]
        lo, hi = ranges[int(rng.integers(0, len(ranges)))] if len(ranges) > 1 else ranges[0]
        return {"hue": int(rng.integers(lo, hi + 1))}
    if name == "image_rainbow":
        return {"hue_shift": int(rng.integers(0, RAINBOW_MAX_SHIFT + 1))}
    return {}


def apply(name: str, img: np.ndarray, mask: np.ndarray, strength: float, draws: dict[str, Any], opts: dict[str, Any] | None = None) -> np.ndarray:
    """Scenario ``name`` at ``strength`` (0..1) on ``img`` with object ``mask``."""
    if name not in SCENARIOS:
        raise UnknownKey(f"unknown scenario {name!r}; known: {', '.join(ALL_NAMES)}")
    if not 0.0 <= strength <= 1.0:
        raise CnsbenchError(f"scenario strength must be in [0, 1], got {strength}")
    if mask.shape != img.shape[:2]:
        raise CnsbenchError(f"mask {mask.shape} does not match image {img.shape[:2]}")
    return SCENARIOS[name].apply(img, mask.astype(bool), float(strength), draws, opts or {})
