"""The published ImageNet-C parameter tables and their continuous-severity interpolation.

Facts from the ImageNet-C release (Hendrycks & Dietterich, ICLR 2019, public code
``make_imagenet_c.py``): per corruption one parameter tuple per severity 1..5, applied
to 224x224 images (resize 256, centre crop 224).  The 15 benchmark corruptions are
followed by the 4 extra ones (speckle noise, gaussian blur, spatter, saturate).

Continuous severity ``s`` in [0, 5] (:func:`severity_plan`):

* ``s = 0``: the input, unchanged;
* integer ``s``: the table's row ``s``;
* ``1 < s < 5`` between integers: each parameter interpolated linearly between the two
  rows (for corruptions whose parameters are all continuous, :data:`BLEND` lists the
  others);
* ``0 < s < 1``, and fractional ``s`` of the :data:`BLEND` corruptions (integer pixel
  shuffles, a mode switch, a list of zoom factors): the output is the linear blend of
  the outputs at ``floor(s)`` and ``ceil(s)`` (severity 0 = the input).  For additive
  corruptions (gaussian / speckle noise, contrast, frost) this equals interpolating the
  parameter from its identity value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.errors import CnsbenchError, UnknownKey

# name -> rows for severities 1..5 (each a tuple of parameters, as in the release).
TABLES: dict[str, list[tuple[float, ...]]] = {
    # noise
    "gaussian_noise": [(0.08,), (0.12,), (0.18,), (0.26,), (0.38,)],  # std of N(0, c) added in [0, 1]
    "shot_noise": [(60,), (25,), (12,), (5,), (3,)],  # photons: Poisson(x c) / c
    "impulse_noise": [(0.03,), (0.06,), (0.09,), (0.17,), (0.27,)],  # salt-and-pepper amount
    # blur
    "defocus_blur": [(3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)],  # disk radius, alias blur
    "glass_blur": [(0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)],  # sigma, max delta, iterations
    "motion_blur": [(10, 3), (15, 5), (15, 8), (15, 12), (20, 15)],  # ImageMagick radius, sigma
    "zoom_blur": [(1.11, 0.01), (1.16, 0.01), (1.21, 0.02), (1.26, 0.02), (1.31, 0.03)],  # np.arange(1, stop, step)
    # weather
    "snow": [
        (0.1, 0.3, 3, 0.5, 10, 4, 0.8),
        (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
        (0.55, 0.3, 4, 0.9, 12, 8, 0.7),
        (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
        (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55),
    ],  # loc, scale, zoom, threshold, motion radius, motion sigma, image weight
    "frost": [(1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75)],  # image weight, frost weight
    "fog": [(1.5, 2), (2, 2), (2.5, 1.7), (2.5, 1.5), (3, 1.4)],  # fog weight, plasma wibble decay
    # digital
    "brightness": [(0.1,), (0.2,), (0.3,), (0.4,), (0.5,)],  # added to HSV value
    "contrast": [(0.4,), (0.3,), (0.2,), (0.1,), (0.05,)],  # factor around the per-channel mean
    "elastic_transform": [  # alpha, sigma, affine jitter in pixels (the release's 244 is kept)
        (244 * 2, 244 * 0.7, 244 * 0.1),
        (244 * 2, 244 * 0.08, 244 * 0.2),
        (244 * 0.05, 244 * 0.01, 244 * 0.02),
        (244 * 0.07, 244 * 0.01, 244 * 0.02),
        (244 * 0.12, 244 * 0.01, 244 * 0.02),
    ],
    "pixelate": [(0.6,), (0.5,), (0.4,), (0.3,), (0.25,)],  # BOX down to int(size c), BOX back up
    "jpeg_compression": [(25,), (18,), (15,), (10,), (7,)],  # JPEG quality
    # extra
    "speckle_noise": [(0.15,), (0.2,), (0.35,), (0.45,), (0.6,)],  # x + x N(0, c)
    "gaussian_blur": [(1,), (2,), (3,), (4,), (6,)],  # sigma
    "spatter": [
        (0.65, 0.3, 4, 0.69, 0.6, 0),
        (0.65, 0.3, 3, 0.68, 0.6, 0),
        (0.65, 0.3, 2, 0.68, 0.5, 0),
        (0.65, 0.3, 1, 0.65, 1.5, 1),
        (0.67, 0.4, 1, 0.65, 1.5, 1),
    ],  # loc, scale, sigma, threshold, intensity / mud sigma, mode (0 water, 1 mud)
    "saturate": [(0.3, 0), (0.1, 0), (2, 0), (5, 0.1), (20, 0.2)],  # HSV saturation * a + b
}

BENCHMARK = (
    "gaussian_noise", "shot_noise", "impulse_noise",
    "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
    "snow", "frost", "fog",
    "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression",
)  # fmt: skip
EXTRA = ("speckle_noise", "gaussian_blur", "spatter", "saturate")
ALL = BENCHMARK + EXTRA

CATEGORY = {
    **dict.fromkeys(("gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise"), "noise"),
    **dict.fromkeys(("defocus_blur", "glass_blur", "motion_blur", "zoom_blur", "gaussian_blur"), "blur"),
    **dict.fromkeys(("snow", "frost", "fog", "spatter"), "weather"),
    **dict.fromkeys(("brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression", "saturate"), "digital"),
}

# Corruptions whose fractional severities blend the outputs of the neighbouring integer
# severities (their parameters include integers, a mode switch or a list).
BLEND = frozenset({"glass_blur", "zoom_blur", "spatter"})

MAX_SEVERITY = 5.0


def params_at(name: str, severity: float) -> tuple[float, ...]:
    """The parameter tuple at severity ``severity`` in [1, 5], linear between table rows."""
    rows = TABLES[name]
    if not 1.0 <= severity <= MAX_SEVERITY:
        raise CnsbenchError(f"{name}: parameters exist for severities 1..5, got {severity}")
    lo = int(math.floor(severity))
    w = severity - lo
    if w == 0.0:
        return tuple(float(v) for v in rows[lo - 1])
    a, b = rows[lo - 1], rows[lo]
    return tuple(float(x) + w * (float(y) - float(x)) for x, y in zip(a, b))


@dataclass(frozen=True)
class Step:
    """How the image at one severity is made: ``weight`` x corrupt(``hi``) + (1 - weight) x corrupt(``lo``).

    ``lo``/``hi`` are severities at which the corruption is computed with :func:`params_at`
    (0 = the input itself).  ``weight`` is 1 when no blend is needed.
    """

    severity: float
    lo: float
    hi: float
    weight: float


def severity_plan(name: str, severity: float) -> Step:
    """How severity ``severity`` in [0, 5] of corruption ``name`` is realised (see the module docstring)."""
    if name not in TABLES:
        raise UnknownKey(f"unknown corruption {name!r}; known: {', '.join(ALL)}")
    s = float(severity)
    if not 0.0 <= s <= MAX_SEVERITY:
        raise CnsbenchError(f"{name}: severity must be in [0, 5], got {severity}")
    if s == 0.0:
        return Step(s, 0.0, 0.0, 1.0)
    if s < 1.0:
        return Step(s, 0.0, 1.0, s)
    if name in BLEND and s != math.floor(s):
        lo = math.floor(s)
        return Step(s, float(lo), float(lo + 1), s - lo)
    return Step(s, s, s, 1.0)


def names_of(spec: str) -> list[str]:
    """Corruption names of a group name ('all', 'benchmark', 'extra', 'noise', 'blur', ...) or of one name."""
    if spec == "all":
        return list(ALL)
    if spec == "benchmark":
        return list(BENCHMARK)
    if spec == "extra":
        return list(EXTRA)
    if spec in set(CATEGORY.values()):
        return [n for n in ALL if CATEGORY[n] == spec]
    if spec in TABLES:
        return [spec]
    raise KeyError(spec)
