"""Mask providers ``none`` and ``folder``.

``folder``: ``{source.masks.path}/<class folder>/<image stem>.png`` beside a collection's
``<class folder>/<image>``; a pixel is object when its value (any channel) is non-zero, as in the
XIMAGENET-12 scripts (``Color_image.py`` tests ``mask == 0`` for background,
``MaskStandardization.py`` maps every non-zero value to 255), so the release's ``masks/``
and ``standard_masks/`` give the same objects.  ``path`` may also be a released XIMAGENET-12
tree's root: each image's mask is then ``standard_masks/<class folder>/<image stem>.png``, else
the same file in ``masks/``; without a ``path``, a ``source.path`` that is a release's
originals folder (``ROOT/image``) reads the masks of that release.
"""

from __future__ import annotations

import os
from typing import Any

from pipeline.errors import CnsbenchError
from pipeline.families.base import UnitContext
from pipeline.sources.base import MaskProvider


class NoMasks(MaskProvider):
    kind = "none"

    def mask(self, ctx: UnitContext, image: Any, info: dict[str, Any]):
        return None


class FolderMasks(MaskProvider):
    kind = "folder"

    @staticmethod
    def folders(config) -> list[str]:
        """Where masks are looked up, in order (see the module docstring); empty when nothing names a folder."""
        from fsspec.implementations.local import LocalFileSystem

        from pipeline.sources.ximagenet import ORIGINAL_FOLDERS, mask_folders, normalise

        path, images = config.source.masks.path, getattr(config.source, "path", None)
        if path:
            return (os.path.isdir(path) and mask_folders(LocalFileSystem(), path)) or [path]
        if images and "://" not in images:
            release, name = os.path.split(os.path.normpath(images))
            if normalise(name) in ORIGINAL_FOLDERS and os.path.isdir(release):
                return mask_folders(LocalFileSystem(), release)
        return []

    @classmethod
    def missing_files(cls, config) -> list[str]:
        folders = cls.folders(config)
        if not folders:
            why = "reads masks from a folder, or from the masks of the XIMAGENET-12 release whose originals are source.path"
            return [f"source.masks.path: not set (mask kind 'folder' {why})"]
        if not os.path.isdir(folders[0]):
            return [f"source.masks.path: not a directory: {folders[0]}"]
        return []

    def setup(self) -> None:
        self._folders = self.folders(self.config)

    def mask(self, ctx: UnitContext, image: Any, info: dict[str, Any]):
        import numpy as np
        from PIL import Image

        from pipeline.io.fs import safe_relpath

        rel = info.get("relpath")
        if not rel:
            raise CnsbenchError("mask kind 'folder' needs a collection source (no image path for this unit)")
        stem = os.path.splitext(rel)[0] + ".png"
        folders = getattr(self, "_folders", None) or self.folders(self.config)
        if not folders:
            raise CnsbenchError(self.missing_files(self.config)[0])
        paths = [safe_relpath(folder, stem, what="source.masks.path") for folder in folders]
        path = next((p for p in paths if os.path.isfile(p)), paths[0])
        with Image.open(path) as m:
            plane = m.convert("L") if m.mode in ("1", "L", "I", "I;16", "F") else m.convert("RGB")
            arr = np.asarray(plane.resize(image.size, Image.NEAREST))
        return arr > 0 if arr.ndim == 2 else (arr > 0).any(axis=-1)
