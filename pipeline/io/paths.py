"""Confining paths that come from data (manifests, annotations, label maps) to their root.

Kept for its callers; the checks themselves live in :mod:`pipeline.io.fs`.
"""

from __future__ import annotations

from pipeline.io.fs import PathEscape, safe_relpath

__all__ = ["PathEscape", "confined"]


def confined(root: str, rel: str, what: str = "path", follow_symlinks: bool = False) -> str:
    """``root/rel`` when it stays inside ``root`` (after resolving ``..`` and symlinks), else raise."""
    return safe_relpath(root, rel, what=what, follow_symlinks=follow_symlinks)
