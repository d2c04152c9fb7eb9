"""Mask provider ``ink``: the true object mask of an image of the miniature world.

The world's images are light digits on a black canvas (docs/world.md), so the object is
exactly its ink: a pixel is object when its grey value is at least ``ink_threshold``.
The mask then goes through the common quality check (:mod:`pipeline.sources.mask_quality`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.errors import CnsbenchError
from pipeline.families.base import UnitContext
from pipeline.sources.base import MaskProvider
from pipeline.sources.mask_quality import MaskBounds, assess


class QualityOptions(BaseModel):
    """The mask-quality bounds every provider of this package accepts."""

    model_config = ConfigDict(extra="forbid")
    min_area: float = Field(0.02, ge=0, le=1, description="smallest usable object share of the image")
    max_area: float = Field(0.9, ge=0, le=1, description="largest usable object share of the image")
    min_main_share: float = Field(0.9, ge=0, le=1, description="share of the mask its largest component must hold")

    @property
    def bounds(self) -> MaskBounds:
        return MaskBounds(self.min_area, self.max_area, self.min_main_share)


class InkOptions(QualityOptions):
    ink_threshold: int = Field(64, ge=1, le=255, description="grey value (0..255) from which a pixel is ink")


def parse_options(model: type[BaseModel], options: dict[str, Any], kind: str) -> BaseModel:
    """Validate ``source.masks.options`` for mask provider ``kind``; ValueError naming the key."""
    try:
        return model.model_validate(options)
    except ValidationError as err:
        detail = "; ".join(f"source.masks.options.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise CnsbenchError(f"mask provider {kind!r}: {detail}") from None


def ink_mask(image: Any, threshold: int) -> "Any":
    import numpy as np

    grey = np.asarray(image.convert("L"))
    return grey >= threshold


class CheckedMasks(MaskProvider):
    """A mask provider whose ``source.masks.options`` are its typed ``Options`` (quality bounds
    included): checked before the build starts, parsed into ``self.options`` by ``setup``."""

    Options: type[BaseModel] = QualityOptions

    @classmethod
    def parsed(cls, config) -> Any:
        """The config's ``source.masks.options`` as ``Options``; ValueError naming the key."""
        return parse_options(cls.Options, config.source.masks.options, cls.kind)

    @classmethod
    def missing_files(cls, config) -> list[str]:
        try:
            cls.parsed(config)
        except ValueError as err:
            return [str(err)]
        return []

    def setup(self) -> None:
        self.options = self.parsed(self.config)


class InkMasks(CheckedMasks):
    kind = "ink"
    Options = InkOptions

    def mask(self, ctx: UnitContext, image: Any, info: dict[str, Any]):
        if not hasattr(self, "options"):
            self.setup()
        m = ink_mask(image, self.options.ink_threshold)
        info.update(assess(m, self.options.bounds), mask_kind=self.kind)
        return m
