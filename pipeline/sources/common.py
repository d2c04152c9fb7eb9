"""What every released-image layout shares: the pointer-row schema (:data:`SOURCE_ROW`), :class:`Source` and :class:`SourceError`.

Grouping a layout's images into trajectory rows is :mod:`pipeline.sources.grouping`; the checks of
what a layout lists (class ids, shift names, paths inside the source) are :mod:`pipeline.sources.checks`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from pipeline.errors import CnsbenchError
from pipeline.plan.schema import TRAJECTORY

log = logging.getLogger(__name__)

ANNOTATIONS = "annotations_cns.json"
NO_SHIFT = "none"  # shift of images that are not part of a shift trajectory (folders)
IMAGE_EXTENSIONS = {".jpg": "jpg", ".jpeg": "jpg", ".png": "png", ".webp": "webp", ".bmp": "bmp"}

# One row per trajectory: the trajectory's columns (:data:`pipeline.plan.schema.TRAJECTORY`), then
# ``paths[i]`` holds the image at ``scales[i]``, read whole when ``offsets[i] < 0``, else
# ``sizes[i]`` bytes from ``offsets[i]`` (a member of a tar).
SOURCE_ROW = pa.schema(
    list(TRAJECTORY)
    + [
        ("paths", pa.list_(pa.string())),
        ("offsets", pa.list_(pa.int64())),
        ("sizes", pa.list_(pa.int64())),
    ]
)


class SourceError(CnsbenchError):
    """A source that cannot be evaluated; the message names the file and the problem."""


@dataclass
class Source:
    """An indexed source: pointer rows sorted by trajectory id, plus what describes them."""

    kind: str
    location: str
    rows: list[dict[str, Any]]
    image_format: str  # the most common of 'png' / 'jpg' (what the output stores unchanged)
    notes: list[str] = field(default_factory=list)
    analyses: list[str] = field(default_factory=list)  # analyses the layout calls for (added to the report)
    labels: str | None = None  # label space the class ids index (set by layouts with their own, e.g. imagenet_d)
    # True: ``labels`` is the layout's default only; a config that sets benchmark.labels keeps its own
    # (XIMAGENET-12: 12-way by default, 1000-way with ``labels: imagenet``).
    labels_unless_set: bool = False

    @property
    def scales(self) -> list[float]:
        return sorted({float(s) for r in self.rows for s in r["scales"]})

    @property
    def classes(self) -> list[int]:
        return sorted({int(r["class_id"]) for r in self.rows})

    @property
    def seeds(self) -> list[int]:
        return sorted({int(r["seed"]) for r in self.rows})

    @property
    def shifts(self) -> list[str]:
        return sorted({str(r["shift"]) for r in self.rows})

    @property
    def n_images(self) -> int:
        return sum(len(r["paths"]) for r in self.rows)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "location": self.location,
            "trajectories": len(self.rows),
            "images": self.n_images,
            "classes": len(self.classes),
            "shifts": self.shifts,
            "scales": self.scales,
            "image_format": self.image_format,
            "notes": self.notes,
        }


# A class folder named by its index, optionally followed by its name: ``022_bald eagle``.
CLASS_FOLDER = re.compile(r"(\d+)(?:[_\- ](.*))?")  # matched whole (fullmatch)
