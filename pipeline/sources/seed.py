"""Source ``seed``: the scale-0 image generated from the unit's seed.

It is the image the slider family makes at scale 0 (plain prompt, slider off), from the
same per-process sampler, so a corruption of a build is a matched baseline of its slider
trajectories.  When the slider family is part of the build it shares its scale 0 through
the unit context and this source is not asked at all.
"""

from __future__ import annotations

from pipeline.families.base import BaseImage, UnitContext
from pipeline.sources.base import ImageSource


class SeedSource(ImageSource):
    kind = "seed"

    def setup(self) -> None:
        from pipeline.families.base import base_sampler_kind
        from pipeline.families.slider import shared_sampler

        self.sampler = shared_sampler(self.config, base_sampler_kind(self.config), self.device, self.dtype)

    def load(self, ctx: UnitContext) -> BaseImage:
        result = self.sampler.generate_group(ctx.class_id, ctx.seed, [], [0.0])
        return BaseImage(image=result.images[(None, 0.0)], info={"source": "seed"})
