"""Object-mask statistics and the quality check that marks a unit unusable.

A mask is usable when its object covers a share of the image within
``[min_area, max_area]`` and it is one main component: the largest 4-connected component
holds at least ``min_main_share`` of the object pixels.  A mask that fails is not an
error: the unit's trajectories are filtered out (``unusable``) and the reason recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class MaskBounds:
    min_area: float = 0.02
    max_area: float = 0.9
    min_main_share: float = 0.9


def components(mask: np.ndarray) -> np.ndarray:
    """4-connected component labels of a boolean mask (0 = background, 1.. = components)."""
    try:
        from scipy import ndimage

        labels, _ = ndimage.label(mask)
        return labels
    except ImportError:  # pragma: no cover - scipy ships with the project's dependencies
        return _label_bfs(mask)


def _label_bfs(mask: np.ndarray) -> np.ndarray:
    labels = np.zeros(mask.shape, dtype=np.int32)
    h, w = mask.shape
    current = 0
    for y0, x0 in zip(*np.nonzero(mask)):
        if labels[y0, x0]:
            continue
        current += 1
        stack = [(y0, x0)]
        labels[y0, x0] = current
        while stack:
            y, x = stack.pop()
            for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                ny, nx = y + dy, x + dx
                if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not labels[ny, nx]:
                    labels[ny, nx] = current
                    stack.append((ny, nx))
    return labels


def main_component(mask: np.ndarray) -> np.ndarray:
    """The largest 4-connected component of ``mask`` (empty mask -> empty)."""
    labels = components(mask)
    if labels.max() == 0:
        return np.zeros_like(mask, dtype=bool)
    sizes = np.bincount(labels.ravel())
    sizes[0] = 0
    return labels == int(sizes.argmax())


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def assess(mask: np.ndarray, bounds: MaskBounds = MaskBounds()) -> dict[str, Any]:
    """Area share, component count, main-component share and the verdict of one mask."""
    area = float(mask.mean()) if mask.size else 0.0
    labels = components(mask)
    n = int(labels.max())
    main = 0.0
    if n:
        sizes = np.bincount(labels.ravel())[1:]
        main = float(sizes.max() / sizes.sum())
    reason = None
    if area < bounds.min_area:
        reason = f"mask area share {area:.3f} < {bounds.min_area}"
    elif area > bounds.max_area:
        reason = f"mask area share {area:.3f} > {bounds.max_area}"
    elif main < bounds.min_main_share:
        reason = f"main component holds {main:.2f} of the mask < {bounds.min_main_share} ({n} components)"
    return {"mask_area": round(area, 6), "mask_components": n, "mask_main_share": round(main, 6), "mask_unusable": reason}
