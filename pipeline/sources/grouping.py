"""A layout's images grouped into trajectory rows (:data:`pipeline.sources.common.SOURCE_ROW`).

A loader collects ``{(shift, class id, seed): {scale: ImageRef}}`` while it reads its
layout, then :func:`share_scale0` completes trajectories stored without their own scale-0
image, :func:`group_rows` turns the groups into pointer rows (ids and seeds from
:mod:`pipeline.plan`) and :func:`dominant_format` picks the format the output stores.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pipeline import plan


@dataclass(frozen=True)
class ImageRef:
    """Where one image is: a whole file (``offset`` < 0), or ``size`` bytes from ``offset`` of a file (a tar member)."""

    path: str
    offset: int = -1
    size: int = -1
    fmt: str = ""  # from the file extension; the loader checks the bytes


def group_rows(
    groups: dict[tuple[str, int, int], dict[float, ImageRef]], class_names: dict[int, str]
) -> list[dict[str, Any]]:
    """One pointer row per (shift, class, seed) group, its scales ascending; sorted by trajectory id."""
    rows = []
    for (shift, class_id, seed), by_scale in groups.items():
        scales = sorted(by_scale)
        images = [by_scale[s] for s in scales]
        rows.append(
            {
                "trajectory_id": plan.trajectory_id(shift, class_id, seed),
                "unit_id": plan.unit_id(class_id, seed),
                "class_id": class_id,
                "class_name": class_names[class_id],
                "seed": seed,
                "shift": shift,
                "scales": scales,
                "sample_ids": [plan.sample_id(shift, class_id, seed, s) for s in scales],
                "paths": [im.path for im in images],
                "offsets": [im.offset for im in images],
                "sizes": [im.size for im in images],
            }
        )
    return sorted(rows, key=lambda r: r["trajectory_id"])


def dominant_format(formats: Iterable[str]) -> str:
    """The format the output stores the source's images in: ``jpg`` when every image is a JPEG
    (passed through byte for byte), else ``png``.  Re-encoding a PNG (or WebP, BMP) to JPEG
    would change the pixels a classifier sees; a JPEG's decoded pixels survive PNG exactly."""
    seen = set(formats)
    return "jpg" if seen == {"jpg"} else "png"


def share_scale0(groups: dict[tuple[str, int, int], dict[float, ImageRef]]) -> int:
    """Give trajectories without a scale-0 image the one of another shift of their (class, seed).

    CNS-Bench generates scale 0 without the slider, so it is the same image for every
    shift; a dataset that stores it once per (class, seed) still yields complete
    trajectories.  Returns how many trajectories borrowed their reference.
    """
    zero: dict[tuple[int, int], ImageRef] = {}
    for (shift, class_id, seed), by_scale in sorted(groups.items()):
        if 0.0 in by_scale:
            zero.setdefault((class_id, seed), by_scale[0.0])
    n = 0
    for (shift, class_id, seed), by_scale in groups.items():
        if 0.0 not in by_scale and (class_id, seed) in zero:
            by_scale[0.0] = zero[(class_id, seed)]
            n += 1
    return n
