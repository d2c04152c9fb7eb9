"""Families ``slider`` (CNS-Bench concept sliders) and ``prompt`` (the prompt-only baseline).

Both generate every image of a (class, seed) unit from its seed with the text-to-image
model (:mod:`pipeline.models.sampler`): scale 0 and the steps before the LoRA window are
computed once per unit and shared by all shifts.  Their scale-0 image is handed to the
unit's context, so transforming families of the same build start from the same image.
"""

from __future__ import annotations

from typing import Any

from pipeline.families.base import BaseImage, CardHeadline, Family, ShiftImages, UnitContext
from pipeline.perf import evals
from pipeline.perf.evals import UnetCost


def shared_sampler(config: Any, kind: str, device: str, dtype: Any):
    """The build's sampler of ``kind`` ('slider' or 'prompt', :func:`pipeline.models.sampler.get_sampler`):
    over the benchmark's classes and those a family reads images of."""
    from pipeline.families.base import extra_source_classes
    from pipeline.models.sampler import get_sampler

    classes = [*config.benchmark.classes, *extra_source_classes(config)]
    return get_sampler(kind, config.generator, classes, config.benchmark.label_space, device, dtype)


class SliderFamily(Family):
    kind = "slider"
    continuous_scale = True  # the slider's multiplier
    scale_meaning = "slider multiplier (LoRA on while t <= generator.lora_timestep_threshold)"
    generates_base = True
    sampler_kind = "slider"
    headline = CardHeadline("cns", "pipeline.card.headline:cns", {"accuracy_drop": False})

    @classmethod
    def unet_cost(cls, config, group) -> UnetCost:
        """The count of ``SliderSampler.generate_group``: the pre-window steps once, then scale 0
        and every (shift, non-zero scale) branch through the window (every image over every
        step without ``generator.share_prefix``)."""
        gen = config.generator
        e = evals.unet_evals_per_unit(gen.steps, gen.lora_timestep_threshold, len(group.shifts), list(group.scales),
                                      gen.guidance_scale)
        return UnetCost(_unshared(e) if not gen.share_prefix else e, hooked=True)

    @classmethod
    def slider_count(cls, config, group) -> int:
        return len(config.benchmark.classes) * len(group.shifts)

    @classmethod
    def missing_files(cls, config, group, pairs) -> list[str]:
        """The slider file of every (class id, shift) pair of the group that is not in ``generator.slider_store``."""
        from pipeline.io.files import exists
        from pipeline.models.diffusion import slider_path

        gen = config.generator
        if not gen.slider_store:
            return ["generator.slider_store: not set (the slider family needs one slider per class/shift)"]
        missing = []
        for class_id, shift in sorted({(c, s) for c, s in pairs if s in group.shifts}):
            path = slider_path(gen, class_id, shift, config.benchmark.class_name(class_id))
            if not exists(path):
                missing.append(f"generator.slider_store: missing slider for class {class_id}, shift {shift}: {path}")
        return missing

    def setup(self) -> None:
        self.sampler = shared_sampler(self.config, self.sampler_kind, self.device, self.dtype)

    def generate(self, ctx: UnitContext, shifts: list[str], scales: list[float]) -> dict[str, ShiftImages]:
        if self.config.generator.share_prefix:
            result = self.sampler.generate_group(ctx.class_id, ctx.seed, list(shifts), list(scales))
        else:
            result = self.sampler.reference_group(ctx.class_id, ctx.seed, list(shifts), list(scales))
        ctx.set_base(BaseImage(image=result.image(shifts[0], 0.0)))
        n = len(shifts)
        return {
            shift: ShiftImages(
                images=[result.image(shift, s) for s in scales],
                unet_evals=result.unet_evals / n,
                seconds=result.seconds / n,
            )
            for shift in shifts
        }


class PromptFamily(SliderFamily):
    kind = "prompt"
    continuous_scale = False  # every scale > 0 is the same prompt
    scale_meaning = "binary: 0 plain prompt, > 0 the shift prompt over all steps"
    sampler_kind = "prompt"

    @classmethod
    def unet_cost(cls, config, group) -> UnetCost:
        e = prompt_evals(config, group)
        return UnetCost(e if config.generator.share_prefix else _unshared(e))

    @classmethod
    def slider_count(cls, config, group) -> int:
        return 0

    @classmethod
    def missing_files(cls, config, group, pairs) -> list[str]:
        return []


def _unshared(e: dict) -> dict:
    """The counts of ``reference_group``: every image over every step (``share_prefix: false``)."""
    return {**e, "prefix_steps": 0, "evals": e["evals_unshared"]}


def prompt_evals(config: Any, group: Any) -> dict:
    """The count of ``PromptSampler.generate_group`` (the ``prompt`` and ``prompt_nuisance``
    families): the plain prompt and each shift's prompt over every step."""
    gen = config.generator
    return evals.prompt_evals_per_unit(gen.steps, len(group.shifts), list(group.scales), gen.guidance_scale)
