"""Mask provider ``ink_threshold``: the object is the bright ink on a dark background.

For images whose object is drawn light on a dark, plain background -- the miniature
world's digits (``docs/world.md``) -- the true object mask is a threshold of the grey
value: a pixel is object when ``mean(R, G, B) / 255 >= threshold``.  With
``largest_component`` only the largest 8-connected blob is kept (stray bright specks of
a generated image are not the object).  Options (``source.masks.options``) are checked
by ``cnsbench validate`` before any model loads.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.families.base import UnitContext
from pipeline.sources.base import MaskProvider


class InkOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    threshold: float = Field(0.5, gt=0.0, lt=1.0, description="grey level (0..1) at and above which a pixel is ink")
    largest_component: bool = Field(True, description="keep only the largest 8-connected blob")


def ink_mask(image: Any, threshold: float = 0.5, largest_component: bool = True):
    """Boolean [H, W] mask of the ink of a PIL image (see the module docstring)."""
    import numpy as np
    from scipy import ndimage

    grey = np.asarray(image.convert("RGB"), dtype=np.float32).mean(axis=-1) / 255.0
    mask = grey >= threshold
    if largest_component and mask.any():
        labels, n = ndimage.label(mask, structure=np.ones((3, 3), bool))
        if n > 1:
            sizes = ndimage.sum(mask, labels, index=np.arange(1, n + 1))
            mask = labels == (1 + int(np.argmax(sizes)))
    return mask


class InkThresholdMasks(MaskProvider):
    kind = "ink_threshold"

    @classmethod
    def missing_files(cls, config) -> list[str]:
        try:
            InkOptions.model_validate(config.source.masks.options)
        except ValidationError as err:
            return [
                f"source.masks.options.{'.'.join(map(str, e['loc']))}: {e['msg']} (mask kind 'ink_threshold')"
                for e in err.errors()
            ]
        return []

    def setup(self) -> None:
        self.opts = InkOptions.model_validate(self.spec.options)

    def mask(self, ctx: UnitContext, image: Any, info: dict[str, Any]):
        return ink_mask(image, self.opts.threshold, self.opts.largest_component)
