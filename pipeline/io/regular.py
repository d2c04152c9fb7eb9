"""Reading files that come from users without hanging on what is not a file.

A path a user names (a checkpoint, a card, a weight directory) may be a FIFO, a device, a
socket, or a symlink to one of them: opening a FIFO blocks until a writer comes, reading
``/dev/zero`` never ends.  Every read of such a path goes through here: the path is
resolved (symlinks followed), checked to be a regular file with ``stat`` before it is
opened, opened with ``O_NONBLOCK`` (so a FIFO swapped in after the check cannot block
the open either), checked again on the open descriptor, and read with a size bound.
Each refusal is a :class:`NotRegularFile` (a ``ValueError``) naming the path.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Iterator

from pipeline.errors import CnsbenchError

MAX_HASHED_FILES = 100_000  # files of one hashed directory (a hub snapshot holds tens)


class NotRegularFile(CnsbenchError):
    """A path that is not a regular file (or too large) where one was expected."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def regular_file(path: str | os.PathLike, what: str = "file") -> Path:
    """``path`` resolved, when it is a regular file; else :class:`NotRegularFile` naming it
    (and the symlink's target) or FileNotFoundError."""
    p = Path(path)
    try:
        real = p.resolve(strict=True)
        st = os.stat(real)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {p}") from None
    except (OSError, RuntimeError) as err:  # a symlink loop, a permission error
        raise NotRegularFile(f"{what} {p}: cannot be read ({err})") from None
    if not stat.S_ISREG(st.st_mode):
        via = f" (a symlink to {real})" if real != p.absolute() else ""
        raise NotRegularFile(f"{what} {p}{via} is {_kind(st.st_mode)}, not a regular file; refused")
    return real


def _open(path: str | os.PathLike, what: str, limit: int | None) -> tuple[int, Path]:
    real = regular_file(path, what)
    fd = os.open(real, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # swapped between the check and the open
        os.close(fd)
        raise NotRegularFile(f"{what} {path} is {_kind(st.st_mode)}, not a regular file; refused")
    if limit is not None and st.st_size > limit:
        os.close(fd)
        raise NotRegularFile(f"{what} {path}: {st.st_size} bytes; at most {limit} are read")
    return fd, real


def read_bounded(path: str | os.PathLike, limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``; a larger file is refused)."""
    fd, _ = _open(path, what, limit)
    chunks, total = [], 0
    with os.fdopen(fd, "rb") as fh:  # in blocks: a large limit is not allocated up front
        while total <= limit:
            block = fh.read(min(1 << 24, limit + 1 - total))
            if not block:
                break
            chunks.append(block)
            total += len(block)
    data = b"".join(chunks)
    if len(data) > limit:  # grew while read
        raise NotRegularFile(f"{what} {path}: more than {limit} bytes; refused")
    return data


def file_sha256(path: str | os.PathLike, what: str = "file") -> str:
    """SHA-256 of a regular file, read in blocks (no size bound: weights are large)."""
    fd, _ = _open(path, what, None)
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def walk_regular(root: str | os.PathLike, what: str = "directory") -> Iterator[tuple[str, Path]]:
    """(relative path, resolved path) of every file under ``root``, sorted; a FIFO, device,
    socket or a symlink to one anywhere under it is refused naming it, and so is a symlink
    to a directory (a loop could make the walk endless)."""
    root = Path(root)
    count = 0
    for dirpath, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        for d in dirs:
            full = Path(dirpath) / d
            if full.is_symlink():
                raise NotRegularFile(f"{what} {root}: {full} is a symlink to a directory; refused")
        for f in sorted(files):
            full = Path(dirpath) / f
            count += 1
            if count > MAX_HASHED_FILES:
                raise NotRegularFile(f"{what} {root}: more than {MAX_HASHED_FILES} files; refused")
            yield os.path.relpath(full, root), regular_file(full, f"{what} {root}: file")


def dir_sha256(root: str | os.PathLike, what: str = "directory") -> str:
    """SHA-256 over a directory's files (relative path and each file's SHA-256, sorted)."""
    h = hashlib.sha256()
    for rel, real in walk_regular(root, what):
        h.update(f"{rel}\0{file_sha256(real, what)}\n".encode())
    return h.hexdigest()
