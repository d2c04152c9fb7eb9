"""Family ``masked_scenario``: the XIMAGENET-12 scenarios at continuous strength.

XIMAGENET-12 keeps an image's object and changes what surrounds it (or the object
alone): blurred background or object, background colour (R/G/B hue, rainbow, grey),
overexposure of background or object, the object on black (segmented) or transparent,
another real image as background, a generated background.  Here each scenario is a
shift whose scale is a strength in [0, 1]: 0 is the unit's original image, 1 the
published transform with the published parameters (:mod:`.scenarios` documents each,
:mod:`.generated` the generated background).  The original image and its object mask
come from the build's image source and mask provider (``source.masks``).

Random parameters of a scenario (a hue, a hue shift, which image is the random
background) are drawn from the coordinates (class, seed, scenario), so a trajectory's
strengths share them and a rebuild gets the same images.

The random background comes, as in ``generated_background.py``, from a class outside the
benchmark (``background_class``, default ``n02123159``, tiger cat, outside the 12), so no
competing benchmark label enters the image; the unit's image and mask are resized to the
background's size (the script resizes the segmented object to the background), so the
scenario image has the background's size.  ``background_class: null`` takes another class
of the build instead (``background_classes``), a deviation kept as an option.
"""

from __future__ import annotations

import re
import zlib
from collections import OrderedDict
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline.errors import CnsbenchError
from pipeline.families.base import CardHeadline, Family, ShiftImages, UnitContext
from pipeline.families.masked_scenario.scenarios import ALL_NAMES, GENERATED, SCENARIOS
from pipeline.perf import evals
from pipeline.perf.evals import UnetCost

MAX_BACKGROUND_BYTES = 256 * 2**20  # originals kept per worker for random backgrounds


class MaskedScenarioOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    random_background_mode: Literal["add", "paste"] = Field(
        "add",
        description="add: the published addWeighted(background, 1, segmented object, 1, 0) (the background also "
        "shows under the object); paste: object pixels kept",
    )
    background_class: int | str | None = Field(
        "n02123159",
        description="random background: the class its images come from, outside the benchmark (an ImageNet "
        "WordNet id, a class index or name of the label space; default n02123159 as generated_background.py); "
        "null: a class of the build (background_classes)",
    )
    background_classes: Literal["others", "any"] = Field(
        "others",
        description="with background_class null: an image of another class of the build (others) or of any class",
    )
    background_prompt: str | None = Field(
        None,
        description="generated_background: prompt for the repainted background ({token}, {class_name}); "
        "default generator.prompt (the class prompt)",
    )
    generated_seed_offset: int = Field(1, description="generated_background: noise seed = unit seed + offset")


def resolve_background_class(value: int | str, labels: Any) -> int:
    """Class id of ``background_class`` in the label space (a WordNet id on ImageNet-1k, an index or a name)."""
    from pipeline.labels.imagenet import wnid_index

    if isinstance(value, str) and re.fullmatch(r"n\d{8}", value):
        if len(labels) != 1000:
            raise CnsbenchError(f"background_class {value!r} is an ImageNet WordNet id, but the label space is not ImageNet-1k")
        cid = wnid_index(value)
        if cid is None:
            raise CnsbenchError(f"background_class {value!r} is not an ImageNet-1k WordNet id")
        return cid
    return labels.resolve(value)


def scenario_seed(class_id: int, seed: int, scenario: str) -> list[int]:
    """Seed sequence of a trajectory's random draws, from its coordinates only."""
    return [int(class_id), int(seed), zlib.crc32(scenario.encode())]


class MaskedScenarioFamily(Family):
    kind = "masked_scenario"
    headline = CardHeadline("ximagenet", "pipeline.card.headline:ximagenet", {"robustness_score": True})
    continuous_scale = True  # the scenario's strength in [0, 1]
    Options = MaskedScenarioOptions
    scale_meaning = "strength: 0 original image, 1 the published XIMAGENET-12 transform"
    default_scales: ClassVar[list[float] | None] = [0.0, 0.25, 0.5, 0.75, 1.0]
    generates_base = False
    needs_mask = True
    analyses = ("robustness_score", "scenario_regression", "mask_quality")

    @classmethod
    def check_shifts(cls, shifts: list[str], options: BaseModel) -> list[str]:
        return [f"unknown scenario {s!r} (known: {', '.join(ALL_NAMES)})" for s in shifts if s not in ALL_NAMES]

    @classmethod
    def missing_files(cls, config, group, pairs) -> list[str]:
        problems = []
        bad = [s for s in group.scales if not 0.0 <= s <= 1.0]
        if bad:
            key = "benchmark.scales" if group.primary else f"{group.where}.scales"
            problems.append(f"{key}: masked_scenario strengths must be in [0, 1], got {bad}")
        if config.source.masks.kind == "none":
            problems.append("source.masks.kind: masked_scenario needs object masks (e.g. 'folder', 'cross_attention', 'ink')")
        where = "generator.options" if group.primary else f"{group.where}.options"
        if "random_background" in group.shifts and group.options.background_class is not None:
            try:
                cid = resolve_background_class(group.options.background_class, config.benchmark.label_space)
            except ValueError as err:
                problems.append(f"{where}.background_class: {err}")
            else:
                if cid in config.benchmark.classes:
                    problems.append(
                        f"{where}.background_class: class {cid} ({config.benchmark.class_name(cid)}) is a class of the "
                        "benchmark; the random background comes from a class outside it"
                    )
        if GENERATED in group.shifts and config.source.kind != "seed":
            import os

            from pipeline.models.diffusion import is_local_path

            model = config.generator.model
            if is_local_path(model) and not os.path.isdir(model):
                problems.append(f"generator.model: generated_background needs the text-to-image model, not found: {model}")
        return problems

    @classmethod
    def unet_cost(cls, config, group) -> UnetCost | None:
        """The count of :meth:`.generated.BackgroundPainter.paint` for a unit whose mask is usable:
        the strengths that start before the last step are rows of one batch, run from the
        earliest start step to the end (x2 with guidance); the other scenarios run no UNet.
        ``random_background`` reads other units' base images: from a source that generates them
        (the seed source), one its worker has not kept is generated again, which is not priced."""
        from pipeline.registry import SOURCES

        rereads = "random_background" in group.shifts and SOURCES.get(config.source.kind).unet_cost(config) is not None
        if GENERATED not in group.shifts and not rereads:
            return None
        from pipeline.families.masked_scenario.generated import painted_rows

        gen = config.generator
        rows, steps = painted_rows(list(group.scales), gen.steps) if GENERATED in group.shifts else ([], 0)
        e = evals.denoise_evals_per_unit([(len(rows), steps)], gen.guidance_scale > 1.0,
                                         len(group.shifts) * len(group.scales))
        notes = [f"{GENERATED}: an upper bound, every unit's object mask counted usable (a unit with an unusable "
                 "mask runs no UNet)"] * (GENERATED in group.shifts)
        notes += [f"random_background: the other units' base images it reads are generated again by source "
                  f"{config.source.kind} where a worker has not kept them, not priced"] * rereads
        return UnetCost(e, note="; ".join(notes))

    @classmethod
    def source_classes(cls, config, group) -> list[int]:
        """The random backgrounds' class, when it lies outside the benchmark."""
        if "random_background" not in group.shifts or group.options.background_class is None:
            return []
        try:
            return [resolve_background_class(group.options.background_class, config.benchmark.label_space)]
        except ValueError:
            return []  # validate names the problem (missing_files)

    def setup(self) -> None:
        self._backgrounds: OrderedDict[tuple[int, int], Any] = OrderedDict()
        self._painter = None

    # ------------------------------------------------------------------ backgrounds and the painter
    def _background(self, ctx: UnitContext, rng) -> tuple[Any, dict[str, Any]]:
        """The random real background: an image of ``background_class`` (or of a build class), chosen by ``rng``."""
        import numpy as np

        bench = self.config.benchmark
        if self.options.background_class is not None:
            classes = [resolve_background_class(self.options.background_class, bench.label_space)]
        else:
            classes = list(bench.classes)
            if self.options.background_classes == "others" and len(classes) > 1:
                classes = [c for c in classes if c != ctx.class_id]
        cid = int(classes[int(rng.integers(0, len(classes)))])
        seed = int(bench.seeds[int(rng.integers(0, len(bench.seeds)))])
        key = (cid, seed)
        if key not in self._backgrounds:
            other = ctx.sibling(cid, bench.class_name(cid), seed).base()
            self._remember(key, np.asarray(other.image.convert("RGB")))
        return self._backgrounds[key], {"background_class": cid, "background_seed": seed}

    def _remember(self, key: tuple[int, int], arr) -> None:
        self._backgrounds[key] = arr
        self._backgrounds.move_to_end(key)
        while sum(a.nbytes for a in self._backgrounds.values()) > MAX_BACKGROUND_BYTES and len(self._backgrounds) > 1:
            self._backgrounds.popitem(last=False)

    def _paint(self):
        if self._painter is None:
            from pipeline.families.masked_scenario.generated import BackgroundPainter

            self._painter = BackgroundPainter(self.config, self.options, self.device, self.dtype)
        return self._painter

    # ------------------------------------------------------------------ work
    def generate(self, ctx: UnitContext, shifts: list[str], scales: list[float]) -> dict[str, ShiftImages]:
        import numpy as np
        from PIL import Image

        from pipeline.families.masked_scenario import scenarios

        bad = [s for s in scales if not 0.0 <= s <= 1.0]
        if bad:
            raise CnsbenchError(f"masked_scenario strengths must be in [0, 1], got {bad}")
        if not hasattr(self, "_backgrounds"):
            self.setup()
        base = ctx.base()
        if base.mask is None:
            raise CnsbenchError("masked_scenario needs an object mask; set source.masks")
        img = np.asarray(base.image.convert("RGB"))
        mask = np.asarray(base.mask, dtype=bool)
        self._remember((ctx.class_id, ctx.seed), img)  # a later unit may draw this one as its background
        if mask.shape != img.shape[:2]:
            raise CnsbenchError(f"object mask {mask.shape} does not match the image {img.shape[:2]}")
        mask_info = {k: base.info[k] for k in ("mask_kind", "mask_area", "mask_components", "mask_main_share", "mask_iou", "attention_area", "mask_unusable") if k in base.info}
        unusable = base.info.get("mask_unusable") or base.unusable
        opts = {"random_background_mode": self.options.random_background_mode}
        out: dict[str, ShiftImages] = {}
        for shift in shifts:
            rng = np.random.default_rng(scenario_seed(ctx.class_id, ctx.seed, shift))
            draws = scenarios.draws_for(shift, rng) if shift in SCENARIOS else {}
            recorded: dict[str, Any] = dict(draws)
            seconds, unet_evals = 0.0, 0.0
            if unusable:
                images = [base.image for _ in scales]  # filtered out anyway; no work on a bad mask
            elif shift == GENERATED:
                painted = self._paint().paint(ctx, base.image, mask, scales)
                images, seconds, unet_evals = painted.images, painted.seconds, painted.unet_evals
                recorded.update(painted.params)
            else:
                fg, fg_mask = img, mask
                if shift == "random_background":
                    bg, where = self._background(ctx, rng)
                    if bg.shape[:2] != img.shape[:2]:  # the object resized to the background, as the script
                        size = (bg.shape[1], bg.shape[0])
                        fg = np.asarray(Image.fromarray(img).resize(size, Image.BILINEAR))
                        fg_mask = np.asarray(Image.fromarray(mask).resize(size, Image.NEAREST))
                    draws["background"] = bg
                    recorded.update(where)
                images = [
                    base.image if s == 0 else Image.fromarray(scenarios.apply(shift, fg, fg_mask, s, draws, opts))
                    for s in scales
                ]
            params = [{"scenario": shift, "strength": s, **recorded, **mask_info} for s in scales]
            out[shift] = ShiftImages(images=images, params=params, unet_evals=unet_evals, seconds=seconds,
                                     unusable=unusable)
        return out
