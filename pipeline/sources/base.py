"""The contract of a build-side image source and of a mask provider.

A build's transforming families (corruptions, masked scenarios, attribute edits) start
from a scale-0 image per (class, seed) unit.  ``source.kind`` picks where it comes from:
``seed`` generates it with the text-to-image model (the same image as the slider
trajectories' scale 0), a collection reads the ``seed``-th image of the class.  A mask
provider (``source.masks.kind``) adds the object mask when a family needs one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from pipeline.config import BuildConfig
    from pipeline.families.base import BaseImage, UnitContext
    from pipeline.perf.evals import UnetCost


class SourcePart:
    """What an image source and a mask provider share: the config, the device and dtype of a
    worker, the files it needs (checked before the build starts), a once-per-worker setup."""

    kind = ""

    def __init__(self, config: "BuildConfig", device: str = "cpu", dtype: Any = None) -> None:
        self.config = config
        self.device = device
        self.dtype = dtype

    @classmethod
    def missing_files(cls, config: "BuildConfig") -> list[str]:
        """One line per missing file, each naming its config key (:mod:`pipeline.assets`)."""
        return []

    def setup(self) -> None:
        """Load what reading needs (models, an index); once per worker."""


class ImageSource(SourcePart):
    """Base class: ``load(ctx)`` returns the unit's :class:`~pipeline.families.base.BaseImage`."""

    @classmethod
    def unet_cost(cls, config: "BuildConfig") -> "UnetCost | None":
        """What loading one unit's base image costs the UNet, as its ``BaseImage.unet_evals``
        records it (:mod:`pipeline.perf.evals`); None: it runs none (a collection's file)."""
        return None

    def load(self, ctx: "UnitContext") -> "BaseImage":
        raise NotImplementedError


class MaskProvider(SourcePart):
    """Base class: ``mask(ctx, image)`` returns a boolean HxW array (True on the object) or None."""

    def __init__(self, config: "BuildConfig", device: str = "cpu", dtype: Any = None) -> None:
        super().__init__(config, device, dtype)
        self.spec = config.source.masks

    def mask(self, ctx: "UnitContext", image: Any, info: dict[str, Any]) -> "np.ndarray | None":
        raise NotImplementedError
