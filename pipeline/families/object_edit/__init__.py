"""Family ``object_edit``: ImageNet-E attribute edits of the object at continuous levels.

One shift per attribute; a scale is a level in [0, 1] (0 = the unedited image) that the
family's options map to the physical parameter of the edit, recorded per image in the
``params`` column:

=========================  =====================================================  =========================
shift                      physical parameter at level ``s``                      options (defaults)
=========================  =====================================================  =========================
``size``                   target object pixel rate                               ``size.share_from`` 0.15,
                           ``share_from + (share_to - share_from) s``             ``size.share_to`` 0.05
``position``               offset of the object's centre, ``s * max_offset``       ``position.max_offset`` 0.25
                           image sides, direction from the unit's seed
``rotation``               ``s * max_degrees`` counter-clockwise                   ``rotation.max_degrees`` 90
``background_complexity``  lambda ``+s * max_lambda`` (the original's units,       ``background.max_lambda`` 20
                           mapped by calibrated gains, :mod:`.calibration`)
``background_simplicity``  lambda ``-s * max_lambda``                             (same)
=========================  =====================================================  =========================

With the default grid (0, 0.25, 0.5, 0.7, 1) the published ImageNet-E levels are
among the levels: object pixel rates 0.1, 0.08, 0.05 (levels 0.5, 0.7, 1) and
lambda = +-20 (level 1).  The signed guidance strength is split into two shifts so that
each trajectory grows monotonically in severity and its failure point stays "the first
wrong level".

Geometry edits (:mod:`.geometry`) move the object and its mask; the background they
uncover is filled by mask-blended denoising with the build's text-to-image model
(``fill.kind: diffusion``) or by a classical fill (``classical``).  Background edits run
the guided loop of :mod:`.guidance` from the background with the object removed, keeping
the object.  The object mask comes from ``source.masks`` (``needs_mask``).
"""

from __future__ import annotations

import math
import time
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipeline.errors import CnsbenchError
from pipeline.families.base import CardHeadline, Family, ShiftImages, UnitContext
from pipeline.perf import evals
from pipeline.perf.evals import UnetCost

GEOMETRY = ("size", "position", "rotation")
# Guidance strength per unit of lambda, calibrated on the world model (32 px) so that lambda
# = +20 / -20 changes the background's mean Fourier amplitude as the original's formulas do
# (pipeline/families/object_edit/calibration.py; docs/imagenet_e.md records the numbers).
GAIN_COMPLEXITY = 2.0e4  # the loop's plateau: the original's +88 % lies beyond its reach (+78 %)
GAIN_SIMPLICITY = 68.8  # -1.7 %, as the original's formulas
BACKGROUND = {"background_complexity": 1.0, "background_simplicity": -1.0}
ATTRIBUTES = GEOMETRY + tuple(BACKGROUND)
# Released ImageNet-E sets without a physical level: random position and random direction
# (a random box position / angle per image).  A released set of another name without a
# level must be called ``random_<something>`` (levels.json ``"level": null``).
NO_LEVEL = ("random_position", "random_direction")
# Released ImageNet-E sets without a counterpart here ("full" size, adversarial background,
# the random sets): valid shift names for evaluating released images, never made by a build.
RELEASE_ONLY = ("size_full", "background_complexity_adv", *NO_LEVEL)


def without_level(attribute: str) -> bool:
    """True for a released set that has no physical level (reported apart from the level curves)."""
    return attribute in NO_LEVEL or attribute.startswith("random_")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SizeOptions(_Strict):
    share_from: float = Field(0.15, gt=0, lt=1, description="object pixel rate as the level approaches 0")
    share_to: float = Field(0.05, gt=0, lt=1, description="object pixel rate at level 1")
    tolerance: float = Field(0.015, gt=0, lt=0.5, description="accepted |rate - target| (ImageNet-E: 0.015)")


class PositionOptions(_Strict):
    max_offset: float = Field(0.25, gt=0, le=1, description="centre offset at level 1, in image sides")


class RotationOptions(_Strict):
    max_degrees: float = Field(90.0, gt=0, le=360, description="counter-clockwise angle at level 1")
    about: Literal["image_center", "object_center"] = Field(
        "image_center", description="ImageNet-E turns object and mask about the image centre"
    )


class BackgroundOptions(_Strict):
    max_lambda: float = Field(20.0, gt=0, le=30, description="lambda at level 1, the original's units (ImageNet-E: 20)")
    gain_complexity: float = Field(
        GAIN_COMPLEXITY, gt=0, description="strength per unit of positive lambda (calibrated: docs/imagenet_e.md)"
    )
    gain_simplicity: float = Field(
        GAIN_SIMPLICITY, gt=0, description="strength per unit of negative lambda (calibrated: docs/imagenet_e.md)"
    )
    steps: int | None = Field(None, ge=1, description="schedule length; default generator.steps")
    strength: float = Field(0.5, gt=0, le=1, description="share of the schedule run from the noised background")


class FillOptions(_Strict):
    kind: Literal["diffusion", "classical"] = Field("diffusion", description="how uncovered background is filled")
    rerender_background: bool = Field(
        False,
        description="geometry edits: pass the whole background through the diffusion loop (lambda 0), as the "
        "original does for every set; false: only the uncovered region is regenerated",
    )
    dilation: int = Field(1, ge=0, le=64, description="pixels the old object region is grown before filling")
    steps: int | None = Field(None, ge=1, description="diffusion fill: schedule length; default generator.steps")
    strength: float = Field(0.6, gt=0, le=1, description="diffusion fill: share of the schedule run")


class ObjectEditOptions(_Strict):
    size: SizeOptions = SizeOptions()
    position: PositionOptions = PositionOptions()
    rotation: RotationOptions = RotationOptions()
    background: BackgroundOptions = BackgroundOptions()
    fill: FillOptions = FillOptions()
    condition: Literal["none", "class"] = Field(
        "none",
        description="text condition of the denoising loops: none (unconditional, as ImageNet-E's unconditional "
        "ImageNet model) or class (the generator's class prompt with classifier-free guidance)",
    )
    min_mask_share: float = Field(
        0.002, ge=0, lt=1, description="a unit whose object mask covers less is unusable (filtered out)"
    )

    @model_validator(mode="after")
    def _sizes(self) -> ObjectEditOptions:
        if self.size.tolerance >= min(self.size.share_from, self.size.share_to):
            raise CnsbenchError("size.tolerance must be smaller than both target shares")
        if self.fill.rerender_background and self.fill.kind != "diffusion":
            raise CnsbenchError("fill.rerender_background needs fill.kind: diffusion (the background passes through the model)")
        return self


def physical(attribute: str, level: float, opts: ObjectEditOptions) -> dict[str, float]:
    """The physical parameter of ``attribute`` at a level (see the module docstring)."""
    if attribute == "size":
        return {"target_share": opts.size.share_from + (opts.size.share_to - opts.size.share_from) * level}
    if attribute == "position":
        return {"offset": opts.position.max_offset * level}
    if attribute == "rotation":
        return {"degrees": opts.rotation.max_degrees * level}
    if attribute in BACKGROUND:
        return {"lambda": BACKGROUND[attribute] * opts.background.max_lambda * level}
    raise CnsbenchError(f"unknown attribute {attribute!r}; one of {', '.join(ATTRIBUTES)}")


def level_of(attribute: str, value: float, opts: ObjectEditOptions) -> float:
    """Inverse of :func:`physical`: the level at which ``attribute`` has the physical ``value``."""
    if attribute == "size":
        return (value - opts.size.share_from) / (opts.size.share_to - opts.size.share_from)
    if attribute == "position":
        return value / opts.position.max_offset
    if attribute == "rotation":
        return value / opts.rotation.max_degrees
    if attribute in BACKGROUND:
        return BACKGROUND[attribute] * value / opts.background.max_lambda
    raise CnsbenchError(f"unknown attribute {attribute!r}; one of {', '.join(ATTRIBUTES)}")


def denoise_steps(steps: int, strength: float) -> int:
    """The steps :class:`.guidance.MaskedDenoiser` runs per row: ``strength`` of a ``steps``-step
    schedule, at least one."""
    return max(1, round(steps * strength))


def direction(class_id: int, seed: int) -> float:
    """The unit's direction of movement (radians), a pure function of (class, seed)."""
    return float(np.random.default_rng([int(class_id), int(seed), 0x1E]).uniform(0.0, 2 * math.pi))


class ObjectEditFamily(Family):
    kind = "object_edit"
    headline = CardHeadline("imagenet_e", "pipeline.card.headline:imagenet_e",
                            {"mean_drop_published": False, "mean_drop_all_levels": False, "mean_drop": False})
    continuous_scale = True  # the attribute's strength (size, offset, angle, background level)
    Options = ObjectEditOptions
    scale_meaning = (
        "attribute level in [0, 1] mapped to the edit's physical parameter (size: object pixel rate, "
        "position: centre offset, rotation: degrees, background: guidance strength lambda)"
    )
    default_scales = [0.0, 0.25, 0.5, 0.7, 1.0]
    generates_base = False
    needs_mask = True
    analyses: ClassVar[tuple[str, ...]] = ("attributes",)

    @classmethod
    def check_shifts(cls, shifts: list[str], options: BaseModel) -> list[str]:
        known = ATTRIBUTES + RELEASE_ONLY
        return [
            f"unknown attribute {s!r} (object_edit shifts: {', '.join(ATTRIBUTES)})"
            for s in shifts
            if s not in known and not without_level(s)
        ]

    @classmethod
    def missing_files(cls, config, group, pairs) -> list[str]:
        problems = []
        release = sorted({s for _, s in pairs if s in RELEASE_ONLY or without_level(s)})
        if release:
            problems.append(
                f"{group.where}.shifts: {release} exist only as released ImageNet-E sets (cnsbench evaluate); "
                "a build cannot make them"
            )
        if pairs and config.source.masks.kind == "none":
            problems.append(f"source.masks.kind: family object_edit ({group.where}) needs object masks; set a mask provider")
        return problems

    @classmethod
    def unet_cost(cls, config, group) -> UnetCost | None:
        """The count of :class:`.guidance.MaskedDenoiser` over a unit: every background edit's
        level a row of the guided loop, and (``fill.kind: diffusion``) every geometry edit's
        level a row of the fill loop, each loop ``denoise_steps`` steps per row (whatever
        chunks of ``generator.branch_batch_size`` rows it runs in: none is padded), x2 when
        conditional with guidance.  A fill row runs only when the moved object leaves some of
        its hole uncovered (or ``rerender_background``), and a unit with an unusable mask runs
        none: the count is an upper bound, said in its note."""
        opts: ObjectEditOptions = group.options
        if not cls._uses_model(opts, group.shifts):
            return None
        gen = config.generator
        levels = sum(1 for s in group.scales if s != 0)
        on = set(group.shifts)
        fills = len(on & set(GEOMETRY)) * levels if opts.fill.kind == "diffusion" else 0
        guided = len(on & set(BACKGROUND)) * levels
        runs = [(fills, denoise_steps(opts.fill.steps or gen.steps, opts.fill.strength)),
                (guided, denoise_steps(opts.background.steps or gen.steps, opts.background.strength))]
        cfg = opts.condition == "class" and gen.guidance_scale > 1.0
        e = evals.denoise_evals_per_unit(runs, cfg, len(group.shifts) * len(group.scales))
        note = ("an upper bound, every unit's object mask counted usable (a unit with an unusable mask runs no "
                "UNet)" +
                (" and a diffusion fill for every geometry edit (an edit whose object covers its old hole runs none)"
                 if fills else "") +
                ("; a background edit's steps also back-propagate through the UNet and the VAE decoder, time the "
                 "forwards counted here do not include" if guided else ""))
        return UnetCost(e, note=note)

    # ---------------------------------------------------------------- setup
    @staticmethod
    def _uses_model(options: Any, shifts: list[str]) -> bool:
        on = set(shifts)
        return bool(on & set(BACKGROUND)) or (options.fill.kind == "diffusion" and bool(on & set(GEOMETRY)))

    def setup(self) -> None:
        self.sampler = None
        if self._uses_model(self.options, self.group.shifts):
            from pipeline.families.base import base_sampler_kind
            from pipeline.families.slider import shared_sampler

            self.sampler = shared_sampler(self.config, base_sampler_kind(self.config), self.device, self.dtype)

    def _empty_prompt(self):
        """Embedding of the empty prompt: the model's unconditional branch (CFG dropout caption)."""
        import torch

        if getattr(self, "_empty", None) is None:
            with torch.no_grad():
                self._empty = self.sampler.pipe.encode_prompt("", self.sampler.device, 1, False)[0]
        return self._empty

    def _denoise(self, class_id: int, seed: int, rows: list[tuple[np.ndarray, np.ndarray, np.ndarray, float]], steps, strength):
        """Run the guided loop on (start, keep, keep_alpha, lambda) rows; images at the saved size."""
        import torch

        from pipeline.families.object_edit.guidance import (
            DenoiseSettings,
            MaskedDenoiser,
            from_tensor,
            to_tensor,
        )

        gen = self.config.generator
        conditional = self.options.condition == "class"
        settings = DenoiseSettings(
            steps=steps or gen.steps, strength=strength, guidance_scale=gen.guidance_scale if conditional else 1.0
        )
        denoiser = MaskedDenoiser(self.sampler.pipe, settings)
        if conditional:
            neg, pos = self.sampler.prompt_embeds(class_id)
        else:
            neg = pos = self._empty_prompt()
        embeds = (neg.detach().clone(), pos.detach().clone())  # plain tensors: usable with autograd
        res, size = gen.resolution, gen.image_size
        out: list[np.ndarray] = []
        for lo in range(0, len(rows), gen.branch_batch_size):
            part = rows[lo : lo + gen.branch_batch_size]
            start = to_tensor([r[0] for r in part], res)
            keep = to_tensor([r[1] for r in part], res)
            alpha = to_tensor([r[2] for r in part], res, signed=False)
            result = denoiser.run(start.to(self.dtype or torch.float32), keep, alpha, [r[3] for r in part], embeds, seed)
            for r, img in zip(part, from_tensor(result, size)):
                # Exact object pixels at the saved size (the loop pasted them at the model's size).
                a = r[2][..., None]
                out.append(img * (1 - a) + r[1] * a)
        return out, denoiser.unet_evals

    # ---------------------------------------------------------------- work
    def generate(self, ctx: UnitContext, shifts: list[str], scales: list[float]) -> dict[str, ShiftImages]:
        from pipeline.families.object_edit import geometry as G
        from pipeline.families.object_edit.guidance import (
            guidance_strength,
            high_frequency_energy,
        )

        start_time = time.perf_counter()
        opts: ObjectEditOptions = self.options
        base = ctx.base()
        image = G.to_array(base.image)
        mask = base.mask
        share0 = G.area_share(mask) if mask is not None else 0.0
        common = {"mask_share": round(share0, 6)}
        if mask is None or share0 < max(opts.min_mask_share, 1e-9):
            reason = "no object mask" if mask is None else f"object mask covers {share0:.4f} < min_mask_share"
            return {
                s: ShiftImages(
                    images=[base.image] * len(scales),
                    params=[{"attribute": s, "level": lv, **common} for lv in scales],
                    unusable=reason,
                )
                for s in shifts
            }

        hole = G.dilate(mask, opts.fill.dilation)
        background = G.classical_fill(image, hole)  # the object removed (start of background edits)
        bg_region = ~G.dilate(mask, opts.fill.dilation + 1)
        images: dict[tuple[str, float], np.ndarray] = {}
        params: dict[tuple[str, float], dict[str, Any]] = {}
        fill_rows: list[tuple[tuple[str, float], tuple]] = []
        guide_rows: list[tuple[tuple[str, float], tuple]] = []
        levels = [lv for lv in scales if lv != 0]
        angle = direction(ctx.class_id, ctx.seed)
        side = float(mask.shape[0])

        for shift in shifts:
            if shift == "position" and levels:
                far = physical("position", max(levels), opts)["offset"] * side
                _, _, angle_used, _ = G.offset_for(mask, far, angle)
            for lv in levels:
                key = (shift, lv)
                p: dict[str, Any] = {"attribute": shift, "level": lv, **common, **physical(shift, lv, opts)}
                if shift in BACKGROUND:
                    bg = opts.background
                    p["strength"] = guidance_strength(p["lambda"], bg.gain_complexity, bg.gain_simplicity)
                    guide_rows.append((key, (background, image, mask.astype(np.float32), p["strength"])))
                    params[key] = p
                    continue
                if shift == "size":
                    layer = G.scale_to_share(image, mask, p["target_share"], opts.size.tolerance)
                elif shift == "position":
                    distance = p["offset"] * side
                    dy, dx, _, fits = G.offset_for(mask, distance, angle_used)
                    layer = G.translate_object(image, mask, dy, dx)
                    layer.info.update(offset_px=round(math.hypot(dy, dx), 3), requested_px=round(distance, 3), fits=fits)
                else:
                    layer = G.rotate_object(image, mask, p["degrees"], opts.rotation.about)
                p.update({k: v for k, v in layer.info.items() if k != "target_share"})
                composed = G.composite(layer, background)
                uncovered = hole & ~layer.mask
                p["uncovered_share"] = round(G.area_share(uncovered), 6)
                if opts.fill.kind == "diffusion" and (uncovered.any() or opts.fill.rerender_background):
                    keep = layer.alpha if opts.fill.rerender_background else np.maximum(layer.alpha, (~hole).astype(np.float32))
                    fill_rows.append((key, (composed, composed, keep, 0.0)))
                else:
                    images[key] = composed
                p["fill"] = "rerender" if opts.fill.rerender_background else opts.fill.kind
                params[key] = p

        evals = 0
        if fill_rows:
            done, n = self._denoise(ctx.class_id, ctx.seed, [r for _, r in fill_rows], opts.fill.steps, opts.fill.strength)
            evals += n
            images.update({k: img for (k, _), img in zip(fill_rows, done)})
        if guide_rows:
            done, n = self._denoise(
                ctx.class_id, ctx.seed, [r for _, r in guide_rows], opts.background.steps, opts.background.strength
            )
            evals += n
            hf0 = high_frequency_energy(image, bg_region)
            for (key, _), img in zip(guide_rows, done):
                images[key] = img
                params[key].update(hf_before=hf0, hf_after=high_frequency_energy(img, bg_region))

        seconds = (time.perf_counter() - start_time) / max(1, len(shifts))
        out = {}
        for shift in shifts:
            imgs, ps = [], []
            for lv in scales:
                if lv == 0:
                    imgs.append(base.image)
                    ps.append({"attribute": shift, "level": 0.0, **common})
                else:
                    imgs.append(G.to_image(images[(shift, lv)]))
                    ps.append(_jsonable(params[(shift, lv)]))
            out[shift] = ShiftImages(images=imgs, params=ps, unet_evals=evals / max(1, len(shifts)), seconds=seconds)
        return out


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, (np.floating, float)):
            out[k] = round(float(v), 6)
        elif isinstance(v, np.integer):
            out[k] = int(v)
        elif isinstance(v, (list, tuple)):
            out[k] = [round(float(x), 4) for x in v]
        else:
            out[k] = v
    return out
