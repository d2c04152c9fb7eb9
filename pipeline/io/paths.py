"""Confining paths that come from data (manifests, annotations, label maps) to their root."""

from __future__ import annotations

import os


class PathEscape(ValueError):
    """A path from data points outside the root it must stay in."""


def confined(root: str, rel: str, what: str = "path") -> str:
    """``root/rel`` when it stays inside ``root`` (after resolving ``..`` and symlinks), else raise."""
    if os.path.isabs(rel):
        raise PathEscape(f"{what}: absolute path {rel!r} is not allowed (paths are relative to {root})")
    base = os.path.realpath(root)
    full = os.path.realpath(os.path.join(base, rel))
    if full != base and not full.startswith(base + os.sep):
        raise PathEscape(f"{what}: {rel!r} leaves {root}")
    return full
