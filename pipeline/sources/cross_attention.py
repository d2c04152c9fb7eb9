"""Mask provider ``cross_attention``: object masks of generated images from the model itself.

For an image the build generated from (class, seed), the text-to-image model's
cross-attention to the class token (:mod:`pipeline.sources.attention_maps`, aggregated
over layers and steps) is scaled to [0, 1], thresholded at ``threshold`` and cleaned to its
largest connected component, after a guided-filter refinement with the image as guide
(``refine``; see :mod:`pipeline.sources.attention_maps` for the aggregation).  It is computed once per (class, seed), from the scale-0
generation, and the whole trajectory reuses it.  The common quality check
(:mod:`pipeline.sources.mask_quality`) marks units whose mask is unusable.

``reference`` names another mask provider whose masks are the truth (e.g. ``ink`` on the
miniature world): the IoU of the attention mask against it is recorded (``mask_iou``),
and ``use: reference`` applies the reference mask to the scenarios while the attention
mask is only measured.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pipeline.families.base import UnitContext
from pipeline.sources.mask_quality import assess, iou, main_component
from pipeline.sources.world_ink import CheckedMasks, QualityOptions


class CrossAttentionOptions(QualityOptions):
    threshold: float = Field(0.5, gt=0, lt=1, description="level of the [0, 1]-scaled map from which a pixel is object")
    from_step: float = Field(0.5, ge=0, lt=1, description="share of the first denoising steps whose maps are skipped")
    layers: Literal["finest", "all"] = Field("finest", description="cross-attention layers aggregated")
    refine: Literal["guided", "none"] = Field("guided", description="guided-filter refinement with the image as guide")
    guided_radius: float = Field(0.125, gt=0, le=0.5, description="guided-filter radius as a share of the image side")
    guided_eps: float = Field(1e-3, gt=0)
    reference: str | None = Field(None, description="mask provider whose masks are the truth for mask_iou (e.g. 'ink')")
    reference_options: dict[str, Any] = Field(default_factory=dict, description="options of the reference provider")
    use: Literal["attention", "reference"] = Field("attention", description="which mask the scenarios use")


class CrossAttentionMasks(CheckedMasks):
    kind = "cross_attention"
    Options = CrossAttentionOptions

    @classmethod
    def missing_files(cls, config) -> list[str]:
        from pipeline.registry import MASKS

        problems = super().missing_files(config)
        if problems:
            return problems
        opts = cls.parsed(config)
        if config.source.kind != "seed":
            problems.append(
                f"source.masks.kind: 'cross_attention' masks images the build generates (source.kind 'seed'), "
                f"not {config.source.kind!r}"
            )
        if opts.use == "reference" and not opts.reference:
            problems.append("source.masks.options.use: 'reference' needs source.masks.options.reference")
        if opts.reference:
            try:
                MASKS.check(opts.reference)
            except KeyError as err:
                problems.append(f"source.masks.options.reference: {err.args[0]}")
            if opts.reference == cls.kind:
                problems.append("source.masks.options.reference: cannot be 'cross_attention' itself")
        return problems

    def setup(self) -> None:
        from pipeline.families.base import base_sampler_kind
        from pipeline.families.slider import shared_sampler

        super().setup()
        self.sampler = shared_sampler(self.config, base_sampler_kind(self.config), self.device, self.dtype)
        from pipeline.sources.attention_maps import recorder_for

        recorder_for(self.sampler, self.options.from_step, self.options.layers == "finest")  # records every scale-0 generation
        self.reference = None
        if self.options.reference:
            from pipeline.registry import MASKS

            ref_config = self.config.model_copy(deep=True)
            ref_config.source.masks.kind = self.options.reference
            ref_config.source.masks.options = dict(self.options.reference_options)
            self.reference = MASKS.get(self.options.reference)(ref_config, self.device, self.dtype)
            self.reference.setup()

    def attention_mask(self, ctx: UnitContext, image: Any):
        """(mask, attention map) of (class, seed) for its scale-0 ``image``."""
        import numpy as np
        from PIL import Image

        from pipeline.sources.attention_maps import recorder_for, refine

        o = self.options
        amap = recorder_for(self.sampler, o.from_step, o.layers == "finest").map_for(ctx.class_id, ctx.seed)
        if amap.shape != (image.size[1], image.size[0]):
            amap = np.asarray(Image.fromarray(amap.astype(np.float32)).resize(image.size, Image.BILINEAR))
        if o.refine == "guided":
            amap = refine(amap, image, max(1, int(round(o.guided_radius * min(image.size)))), o.guided_eps)
        return main_component(amap >= o.threshold), amap

    def mask(self, ctx: UnitContext, image: Any, info: dict[str, Any]):
        if not hasattr(self, "options"):
            self.setup()
        att, _ = self.attention_mask(ctx, image)
        used = att
        if self.reference is not None:
            ref_info: dict[str, Any] = {}
            truth = self.reference.mask(ctx, image, ref_info)
            info["mask_iou"] = round(iou(att, truth), 6)
            if self.options.use == "reference":
                used = truth
        info.update(assess(used, self.options.bounds), mask_kind=self.kind if self.options.use == "attention" else self.options.reference)
        info["attention_area"] = round(float(att.mean()), 6)
        return used
