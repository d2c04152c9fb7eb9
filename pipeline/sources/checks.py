"""Checks of what a released layout lists, each failing with a :class:`~pipeline.sources.common.SourceError`
that names the file and the value: class ids inside the label space, shift names, image files
that exist, local paths that stay inside the source, numbers that are finite, file names
the output can store.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from pipeline.config import SHIFT_NAME
from pipeline.io.files import is_local
from pipeline.io.fs import PathEscape, confined_local
from pipeline.labels import LabelSpace
from pipeline.sources.common import SourceError

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.sources.common import Source


def check_class(class_id: int, labels: LabelSpace, where: str) -> None:
    """A class id of ``labels``."""
    if not 0 <= class_id < len(labels):
        raise SourceError(f"{where}: class id {class_id} is outside the label space {labels.key!r} (0..{len(labels) - 1})")


def check_shift(shift: str, where: str) -> None:
    """A shift name a build can store (:data:`pipeline.config.SHIFT_NAME`)."""
    if not SHIFT_NAME.fullmatch(shift):
        raise SourceError(f"{where}: shift {shift!r} must match {SHIFT_NAME.pattern}")


def check_files_exist(rows: list[dict[str, Any]], source: str) -> None:
    """Fail before any worker starts when local image files are missing (lists a few)."""
    missing = [p for r in rows for p in r["paths"] if is_local(p) and not os.path.isfile(p)]
    if missing:
        shown = "\n  ".join(sorted(set(missing))[:5])
        raise SourceError(f"{source}: {len(set(missing))} image file(s) listed but not found, e.g.\n  {shown}")


def inside_source(path: str, root: str, location: str, what: str, follow_symlinks: bool) -> None:
    """SourceError when a listed local ``path`` resolves outside the source ``root`` (a symlink)."""
    if follow_symlinks or not is_local(location):
        return
    try:
        confined_local(root, path, what)
    except PathEscape:
        raise SourceError(
            f"{what}: {path} is a symbolic link leading outside the source {location} "
            "(pass --follow-symlinks / source.follow_symlinks: true to allow it)"
        ) from None


def finite_number(value: Any) -> bool:
    """A real, finite number (not a bool, NaN or infinity)."""
    import math

    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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
