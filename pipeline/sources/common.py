"""What every released-image layout shares: the pointer-row schema (:data:`SOURCE_ROW`), :class:`Source`, :class:`SourceError` and the helpers that group images into trajectories."""

from __future__ import annotations

import logging
import os
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import fsspec
import pyarrow as pa

from pipeline import plan
from pipeline.config import SHIFT_NAME
from pipeline.io.fs import PathEscape, confined_local
from pipeline.labels import LabelSpace
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


class SourceError(ValueError):
    """A source that cannot be evaluated; the message names the file and the problem."""


@dataclass(frozen=True)
class _Image:
    path: str
    offset: int = -1
    size: int = -1
    fmt: str = ""  # from the file extension; the loader checks the bytes


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


def _fs(location: str) -> tuple[Any, str]:
    return fsspec.core.url_to_fs(location)


def _is_local(location: str) -> bool:
    return "://" not in location or location.startswith("file://")


def _inside_source(path: str, root: str, location: str, what: str, follow_symlinks: bool) -> None:
    """SourceError when a listed local ``path`` resolves outside the source ``root`` (a symlink)."""
    if follow_symlinks or not _is_local(location):
        return
    try:
        confined_local(root, path, what)
    except PathEscape:
        raise SourceError(
            f"{what}: {path} is a symbolic link leading outside the source {location} "
            "(pass --follow-symlinks / source.follow_symlinks: true to allow it)"
        ) from None


def leave_out_unencodable(src: "Source", shown: int = 10) -> None:
    """Drop the trajectories of images whose file names are not UTF-8, with a note naming each one.

    A local file system may hold names that are not valid UTF-8 (Linux stores bytes); Python
    lists them with surrogate escapes, which the output's Parquet and JSON cannot store.
    Such an image cannot be named in the output, so it is left out, and the note spells its
    path as bytes (``b'.../\\xffname.png'``) so the user can find and rename it; the rest of
    the source is evaluated.
    """
    bad: list[str] = []
    kept = []
    for row in src.rows:
        unencodable = [p for p in row["paths"] if not _encodes(p)]
        bad += unencodable
        if not unencodable:
            kept.append(row)
    if not bad:
        return
    src.rows[:] = kept
    names = ", ".join(repr(os.fsencode(p)) for p in bad[:shown])
    more = f" and {len(bad) - shown} more" if len(bad) > shown else ""
    src.notes.append(
        f"left out {len(bad)} image(s) whose file name is not UTF-8 (rename them to evaluate them): {names}{more}"
    )


def _encodes(path: str) -> bool:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _finite_number(value: Any) -> bool:
    import math

    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _url(fs: Any, path: str, like: str) -> str:
    """A path returned by ``fs`` as a location of the same kind as ``like`` (URL or local path)."""
    return fs.unstrip_protocol(path) if "://" in like else path


def _group_rows(
    groups: dict[tuple[str, int, int], dict[float, _Image]], class_names: dict[int, str]
) -> list[dict[str, Any]]:
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


def _dominant_format(formats: Iterable[str]) -> str:
    """The format the output stores the source's images in: ``jpg`` when every image is a JPEG
    (passed through byte for byte), else ``png``.  Re-encoding a PNG (or WebP, BMP) to JPEG
    would change the pixels a classifier sees; a JPEG's decoded pixels survive PNG exactly."""
    seen = set(formats)
    return "jpg" if seen == {"jpg"} else "png"


def _share_scale0(groups: dict[tuple[str, int, int], dict[float, _Image]]) -> int:
    """Give trajectories without a scale-0 image the one of another shift of their (class, seed).

    CNS-Bench generates scale 0 without the slider, so it is the same image for every
    shift; a dataset that stores it once per (class, seed) still yields complete
    trajectories.  Returns how many trajectories borrowed their reference.
    """
    zero: dict[tuple[int, int], _Image] = {}
    for (shift, class_id, seed), by_scale in sorted(groups.items()):
        if 0.0 in by_scale:
            zero.setdefault((class_id, seed), by_scale[0.0])
    n = 0
    for (shift, class_id, seed), by_scale in groups.items():
        if 0.0 not in by_scale and (class_id, seed) in zero:
            by_scale[0.0] = zero[(class_id, seed)]
            n += 1
    return n


def _check_class(class_id: int, labels: LabelSpace, where: str) -> None:
    if not 0 <= class_id < len(labels):
        raise SourceError(f"{where}: class id {class_id} is outside the label space {labels.key!r} (0..{len(labels) - 1})")


def _check_shift(shift: str, where: str) -> None:
    if not SHIFT_NAME.fullmatch(shift):
        raise SourceError(f"{where}: shift {shift!r} must match {SHIFT_NAME.pattern}")


def _check_files_exist(rows: list[dict[str, Any]], source: str) -> None:
    """Fail before any worker starts when local image files are missing (lists a few)."""
    missing = [p for r in rows for p in r["paths"] if _is_local(p) and not os.path.isfile(p)]
    if missing:
        shown = "\n  ".join(sorted(set(missing))[:5])
        raise SourceError(f"{source}: {len(set(missing))} image file(s) listed but not found, e.g.\n  {shown}")


def _tar_paths(fs: Any, root: str) -> list[str]:
    for base in (posixpath.join(root, "images"), root):
        if fs.isdir(base):
            tars = sorted(
                p
                for p in fs.ls(base, detail=False)
                if p.endswith(".tar") and not posixpath.basename(p).startswith(".tmp-")
            )
            if tars:
                return tars
    return []


# A class folder named by its index, optionally followed by its name: ``022_bald eagle``.
_CLASS_FOLDER = re.compile(r"(\d+)(?:[_\- ](.*))?")  # matched whole (fullmatch)
