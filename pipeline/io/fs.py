"""Paths that come from data must stay inside their root.

A manifest's file list, an annotation's image path, a shard name in a ``samples`` table,
a slider file made from ``generator.slider_pattern``: each names a location *relative to
a root* (the output, the source, the slider store).  :func:`safe_relpath` is the one
check every such path goes through before anything is read, written or deleted:

- absolute paths (``/etc/passwd``, ``C:\\x``, ``s3://other/x``) are refused;
- ``..`` may not climb above the root (``a/../b`` is fine, ``../x`` is not);
- on local disk, a path that reaches outside the root through a symlink is refused
  unless ``follow_symlinks`` (a user's explicit opt-in; never for outputs).

The error is a :class:`PathEscape` (a ``ValueError``) naming ``what`` (the file and entry
the path came from), so the CLI reports it with exit code 2.
"""

from __future__ import annotations

import os
import posixpath
import re

from pipeline.errors import CnsbenchError

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")


class PathEscape(CnsbenchError):
    """A path from data points outside the root it must stay in."""


def is_url(location: str) -> bool:
    return bool(_SCHEME.match(location))


def normalize_relpath(entry: object, what: str = "path") -> str:
    """``entry`` as a normalised relative POSIX path, or :class:`PathEscape`.

    Only the text is checked here (no filesystem access): type, emptiness, NUL bytes,
    absolute paths, URLs, backslashes and ``..`` climbing above the start.
    """
    if not isinstance(entry, str):
        raise PathEscape(f"{what}: a path must be a string, got {type(entry).__name__} {entry!r}"[:300])
    if not entry or entry.strip() == "":
        raise PathEscape(f"{what}: empty path")
    if "\x00" in entry:
        raise PathEscape(f"{what}: path {entry!r} contains a NUL byte")
    if "\\" in entry:
        raise PathEscape(f"{what}: path {entry!r} contains a backslash (paths use '/')")
    if entry.startswith("/") or _DRIVE.match(entry) or is_url(entry) or entry.startswith("~"):
        raise PathEscape(f"{what}: absolute path {entry!r} is not allowed (paths are relative to their root)")
    norm = posixpath.normpath(entry)
    if norm == ".." or norm.startswith("../") or norm.startswith("/"):
        raise PathEscape(f"{what}: path {entry!r} leaves its root")
    if norm == ".":
        raise PathEscape(f"{what}: path {entry!r} names the root itself, not a file in it")
    return norm


def _inside(base: str, full: str) -> bool:
    return full == base or full.startswith(base.rstrip(os.sep) + os.sep)


def safe_relpath(root: str, entry: object, what: str = "path", follow_symlinks: bool = False) -> str:
    """The full location of ``entry`` under ``root``; :class:`PathEscape` when it would leave it.

    ``root`` is a local directory or a URL (``s3://bucket/prefix``).  For local roots the
    resolved path (symlinks followed) must also lie inside the resolved root, unless
    ``follow_symlinks``; the returned path is the unresolved ``root/entry`` so messages
    show what the user wrote.
    """
    rel = normalize_relpath(entry, what)
    if is_url(root) and not root.startswith("file://"):
        return posixpath.join(root.rstrip("/"), rel)
    local_root = root[len("file://") :] if root.startswith("file://") else root
    full = os.path.join(local_root, *rel.split("/"))
    if not follow_symlinks:
        base = os.path.realpath(local_root)
        if not _inside(base, os.path.realpath(full)):
            raise PathEscape(
                f"{what}: path {entry!r} leaves {root} through a symbolic link "
                "(pass --follow-symlinks / source.follow_symlinks: true to allow it)"
            )
    return full


def confined_local(root: str, path: str, what: str = "path") -> None:
    """Raise :class:`PathEscape` unless the local ``path`` resolves inside ``root``."""
    if not _inside(os.path.realpath(root), os.path.realpath(path)):
        raise PathEscape(f"{what}: {path} resolves outside {root}")


class PathKindError(CnsbenchError):
    """A path argument of the wrong kind: a file where a directory is expected, unwritable, ..."""


def check_writable_dir(path: str, what: str) -> None:
    """A local location that must be a writable directory, or creatable as one (URLs pass).

    Raises :class:`PathKindError` naming ``what`` and the path; creates nothing.
    """
    if is_url(path) and not path.startswith("file://"):
        return
    path = path[len("file://") :] if path.startswith("file://") else path
    if os.path.lexists(path) and not os.path.isdir(path):
        raise PathKindError(f"{what} {path}: exists and is not a directory")
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe.rstrip(os.sep)) or "."
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise PathKindError(f"{what} {path}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise PathKindError(f"{what} {path}: {probe} is not writable")
