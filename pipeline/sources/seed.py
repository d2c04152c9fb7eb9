"""Source ``seed``: the scale-0 image generated from the unit's seed.

It is the image the slider family makes at scale 0 (plain prompt, slider off), from the
same per-process sampler, so a corruption of a build is a matched baseline of its slider
trajectories.  When the slider family is part of the build it shares its scale 0 through
the unit context and this source is not asked at all.
"""

from __future__ import annotations

from pipeline.families.base import BaseImage, UnitContext
from pipeline.perf import evals
from pipeline.perf.evals import UnetCost
from pipeline.sources.base import ImageSource


class SeedSource(ImageSource):
    kind = "seed"

    @classmethod
    def unet_cost(cls, config) -> UnetCost:
        """One image of the plain prompt over every step (either sampler's ``generate_group``
        without shifts), with guidance x2."""
        gen = config.generator
        return UnetCost(evals.denoise_evals_per_unit([(1, gen.steps)], gen.guidance_scale > 1.0, 1))

    def setup(self) -> None:
        from pipeline.families.base import base_sampler_kind
        from pipeline.families.slider import shared_sampler

        self.sampler = shared_sampler(self.config, base_sampler_kind(self.config), self.device, self.dtype)

    def load(self, ctx: UnitContext) -> BaseImage:
        result = self.sampler.generate_group(ctx.class_id, ctx.seed, [], [0.0])
        return BaseImage(image=result.images[(None, 0.0)], info={"source": "seed"}, unet_evals=result.unet_evals)
