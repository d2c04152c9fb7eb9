"""Mask providers ``none`` and ``folder``.

``folder``: ``{source.masks.path}/<class folder>/<image stem>.png`` beside a collection's
``<class folder>/<image>``; a pixel is object when its value (any channel) is non-zero, as in the
XIMAGENET-12 scripts (``Color_image.py`` tests ``mask == 0`` for background,
``MaskStandardization.py`` maps every non-zero value to 255), so the release's ``masks/``
and ``standard_masks/`` give the same objects.
"""

from __future__ import annotations

import os
from typing import Any

from pipeline.families.base import UnitContext
from pipeline.sources.base import MaskProvider


class NoMasks(MaskProvider):
    kind = "none"

    def mask(self, ctx: UnitContext, image: Any, info: dict[str, Any]):
        return None


class FolderMasks(MaskProvider):
    kind = "folder"

    @classmethod
    def missing_files(cls, config) -> list[str]:
        path = config.source.masks.path
        if not path:
            return ["source.masks.path: not set (mask kind 'folder' reads masks from a folder)"]
        if not os.path.isdir(path):
            return [f"source.masks.path: not a directory: {path}"]
        return []

    def mask(self, ctx: UnitContext, image: Any, info: dict[str, Any]):
        import numpy as np
        from PIL import Image

        from pipeline.io.paths import confined

        rel = info.get("relpath")
        if not rel:
            raise ValueError("mask kind 'folder' needs a collection source (no image path for this unit)")
        stem = os.path.splitext(rel)[0] + ".png"
        path = confined(self.spec.path, stem, what="source.masks.path")
        with Image.open(path) as m:
            plane = m.convert("L") if m.mode in ("1", "L", "I", "I;16", "F") else m.convert("RGB")
            arr = np.asarray(plane.resize(image.size, Image.NEAREST))
        return arr > 0 if arr.ndim == 2 else (arr > 0).any(axis=-1)
