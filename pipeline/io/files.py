"""Files named by location: a local path or a URL (``s3://``, ``gs://``, ``file://``, ...).

The one set of helpers every layer uses to reach a file outside an output store
(:class:`pipeline.io.store.OutputStore` has its own, relative to the output's root):
the filesystem behind a location, whether it is local, whether it exists, and writing
it atomically, so that a reader sees the old file or the whole new one, never a part.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any


def filesystem(location: str) -> tuple[Any, str]:
    """``(fsspec filesystem, path on it)`` of ``location``."""
    import fsspec

    return fsspec.core.url_to_fs(location)


def is_local(location: str) -> bool:
    """True for a path on this machine (a plain path or a ``file://`` URL)."""
    return "://" not in location or location.startswith("file://")


def local_path(location: str) -> str:
    """A local location as a plain path (``file://`` stripped)."""
    return location[len("file://"):] if location.startswith("file://") else location


def exists(location: str) -> bool:
    """Whether the file or directory at ``location`` exists."""
    if is_local(location):
        return os.path.exists(local_path(location))
    fs, path = filesystem(location)
    return fs.exists(path)


def as_location(fs: Any, path: str, like: str) -> str:
    """A path that ``fs`` returned, spelt as a location of the same kind as ``like``
    (a URL when ``like`` is one, else the plain path)."""
    return fs.unstrip_protocol(path) if "://" in like else path


def write_atomic(location: str, data: bytes) -> None:
    """Write ``data`` to ``location`` so that readers never see a part of it.

    Locally: a temporary file in the same directory, flushed to disk, readable by others
    (0644), then renamed over the target; on failure the temporary file is removed.  On an
    object store a single PUT is already atomic, so the object is written directly.
    """
    if not is_local(location):
        fs, path = filesystem(location)
        fs.pipe_file(path, data)
        return
    path = local_path(location)
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these files are meant to be read by others
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(location: str, text: str) -> None:
    """:func:`write_atomic` of ``text`` in UTF-8."""
    write_atomic(location, text.encode("utf-8"))
