"""Mask providers ``none`` and ``folder``.

``folder``: ``{source.masks.path}/<class folder>/<image stem>.png`` beside a collection's
``<class folder>/<image>``; a pixel is object when its grey value is >= 128.
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
            arr = np.asarray(m.convert("L").resize(image.size, Image.NEAREST)) >= 128
        return arr
