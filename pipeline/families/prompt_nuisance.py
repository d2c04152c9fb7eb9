"""Family ``prompt_nuisance``: an object under a prompt nuisance (ImageNet-D).

For each (class, nuisance, seed) one image from the text-to-image model with the
nuisance prompt of its kind (``a {token} in the {nuisance}`` for a background, ...),
next to the same seed's plain-prompt image (``generator.prompt``) as its scale-0
reference.  Scales are binary: 0 is the plain prompt, every scale > 0 the nuisance
prompt over all steps.  Shifts are nuisances; each belongs to one *kind* (background,
texture, material, or the kinds of a user vocabulary), which the hard-mining analysis
and the report group by.

Vocabularies are data: ``vocabulary: imagenet_d`` (default) is the released lists
(:mod:`pipeline.labels.imagenet_d`: 468 backgrounds, 47 textures, 32 materials); a mapping
``{kind: CSV file | [names]}`` supplies one's own.  A shift is a nuisance's name made a
shift name (``plastic-opaque`` -> ``plastic_opaque``).

Work: the plan's unit is a (class, seed), so every nuisance image of a unit shares the
class's plain-prompt embedding, the unconditional embedding and the initial noise; the
plain image and all nuisance images run as branches of batched UNet calls
(``generator.branch_batch_size`` rows per forward), and each (class, nuisance) prompt
embedding is encoded once per worker.  A nuisance × class × seed plan of hundreds of
thousands of images is classes × seeds unit rows; the images themselves only exist
inside the stages, one unit at a time.
"""

from __future__ import annotations

import difflib
import json
import os
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipeline.errors import CnsbenchError
from pipeline.families.base import BaseImage, CardHeadline, Family, ShiftImages, UnitContext
from pipeline.families.slider import prompt_evals
from pipeline.perf.evals import UnetCost

# Defaults of ``templates`` per released kind.  The public repository ships no generation
# prompts; these follow the paper's description of its prompts (object "in" a background,
# "made of" a material, "with" a texture).  Placeholders: {token} (class token or name),
# {class_name}, {nuisance} (the nuisance's words).
DEFAULT_TEMPLATES = {
    "background": "a {token} in the {nuisance}",
    "texture": "a {token} with {nuisance} texture",
    "material": "a {token} made of {nuisance}",
}
FALLBACK_TEMPLATE = "a picture of a {token} in {nuisance}"
_PLACEHOLDERS = {"token", "class_name", "nuisance"}


def _check_template(template: str, where: str) -> str:
    import string

    fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    unknown = sorted(fields - _PLACEHOLDERS)
    if unknown:
        raise CnsbenchError(f"{where}: unknown placeholder(s) {unknown}; allowed: {{token}}, {{class_name}}, {{nuisance}}")
    if "{token}" not in template and "{class_name}" not in template:
        raise CnsbenchError(f"{where}: the template must name the object ({{token}} or {{class_name}})")
    return template


class PromptNuisanceOptions(BaseModel):
    """Options of ``prompt_nuisance`` (``generator.options`` or ``families[].options``)."""

    model_config = ConfigDict(extra="forbid")

    vocabulary: str | dict[str, str | list[str]] = Field(
        "imagenet_d",
        description="'imagenet_d' (the released background/texture/material lists) or {kind: CSV file | [names]}",
    )
    templates: dict[str, str] = Field(
        default_factory=dict,
        description="prompt per nuisance kind with {token}/{class_name} and {nuisance}; defaults in DEFAULT_TEMPLATES",
    )
    default_template: str = Field(FALLBACK_TEMPLATE, description="prompt of kinds without a template")
    plain_prompt: str | None = Field(None, description="scale-0 prompt; default generator.prompt")

    @field_validator("vocabulary")
    @classmethod
    def _vocabulary(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value != "imagenet_d":
                raise CnsbenchError(f"vocabulary must be 'imagenet_d' or a mapping {{kind: CSV file | [names]}}, got {value!r}")
            return value
        if not value:
            raise CnsbenchError("vocabulary mapping is empty")
        for kind, names in value.items():
            if not kind or not kind.replace("_", "").isalnum():
                raise CnsbenchError(f"vocabulary: kind {kind!r} must be a word (letters, digits, '_')")
            if isinstance(names, list) and not names:
                raise CnsbenchError(f"vocabulary.{kind}: empty list")
        return value

    @field_validator("templates")
    @classmethod
    def _templates(cls, value: dict[str, str]) -> dict[str, str]:
        for kind, template in value.items():
            _check_template(template, f"templates.{kind}")
        return value

    @field_validator("default_template")
    @classmethod
    def _default(cls, value: str) -> str:
        return _check_template(value, "default_template")

    @field_validator("plain_prompt")
    @classmethod
    def _plain(cls, value: str | None) -> str | None:
        if value is not None and "{token}" not in value:
            raise CnsbenchError("plain_prompt must contain '{token}'")
        return value

    # ------------------------------------------------------------ vocabulary
    def nuisances(self) -> dict[str, tuple[str, str]]:
        """shift name -> (kind, nuisance words), over the whole vocabulary.

        Raises ValueError naming the file or kind when a list cannot be read or two
        nuisances end up with the same shift name.
        """
        from pipeline.labels import imagenet_d as D
        if self.vocabulary == "imagenet_d":
            lists = {kind: list(D.nuisances(kind)) for kind in D.NUISANCE_KINDS}
        else:
            lists = {}
            for kind, names in self.vocabulary.items():
                if isinstance(names, list):
                    lists[kind] = [str(n) for n in names]
                else:
                    if not os.path.isfile(names):
                        raise CnsbenchError(f"vocabulary.{kind}: file not found: {names}")
                    with open(names, encoding="utf-8") as fh:
                        lists[kind] = D.parse_nuisance_csv(fh.read(), names)
        out: dict[str, tuple[str, str]] = {}
        for kind, names in lists.items():
            for name in names:
                shift = D.shift_name(name)
                if not shift:
                    raise CnsbenchError(f"vocabulary.{kind}: nuisance {name!r} has no letters or digits")
                if shift in out and out[shift] != (kind, D.nuisance_words(name)):
                    raise CnsbenchError(
                        f"vocabulary.{kind}: nuisance {name!r} has the shift name {shift!r} of a {out[shift][0]} nuisance"
                    )
                out[shift] = (kind, D.nuisance_words(name))
        return out

    def template(self, kind: str) -> str:
        if kind in self.templates:
            return self.templates[kind]
        if self.vocabulary == "imagenet_d" or kind in DEFAULT_TEMPLATES:
            return DEFAULT_TEMPLATES.get(kind, self.default_template)
        return self.default_template


def nuisance_kinds(options: PromptNuisanceOptions, shifts: list[str]) -> dict[str, str]:
    """shift -> nuisance kind for the shifts of a build (for analyses and reports)."""
    table = options.nuisances()
    return {s: table[s][0] for s in shifts if s in table}


class PromptNuisanceFamily(Family):
    kind = "prompt_nuisance"
    headline = CardHeadline("imagenet_d", "pipeline.card.headline:imagenet_d", {"accuracy": True})
    continuous_scale = False  # scale 0 the plain prompt, 1 the nuisance: nothing between
    Options = PromptNuisanceOptions
    scale_meaning = "binary: 0 the plain prompt, > 0 the nuisance prompt of the shift's kind (same seed)"
    default_scales: ClassVar[list[float]] = [0.0, 1.0]
    generates_base = True
    analyses = ("hard_mining",)

    @classmethod
    def unet_cost(cls, config, group) -> UnetCost:
        """``NuisanceSampler.generate_group``: the plain prompt and every nuisance over every step."""
        return UnetCost(prompt_evals(config, group))

    @classmethod
    def check_shifts(cls, shifts: list[str], options: BaseModel) -> list[str]:
        try:
            table = options.nuisances()  # type: ignore[attr-defined]
        except ValueError as err:
            return [str(err)]
        problems = []
        for s in shifts:
            if s not in table:
                close = difflib.get_close_matches(s, list(table), n=4, cutoff=0.6)
                hint = f" (close: {', '.join(close)})" if close else ""
                problems.append(f"{s!r} is not a nuisance of the vocabulary{hint}")
        return problems

    def setup(self) -> None:
        from pipeline.models import cache

        gen = self.config.generator
        bench = self.config.benchmark
        key = (
            "sampler", "prompt_nuisance", json.dumps(gen.model_dump(mode="json"), sort_keys=True),
            self.options.model_dump_json(), tuple(bench.classes), json.dumps(bench.labels), self.device, str(self.dtype),
        )

        self.table = self.options.nuisances()

        def make():
            from pipeline.models.nuisance_sampler import NuisanceSampler

            prompts = {shift: (self.options.template(kind), words) for shift, (kind, words) in self.table.items()}
            sampler = NuisanceSampler(gen, self.device, self.dtype, prompts, self.options.plain_prompt)
            sampler.setup(list(bench.classes), bench.label_space)
            return sampler

        self.sampler = cache.shared(key, make)

    def generate(self, ctx: UnitContext, shifts: list[str], scales: list[float]) -> dict[str, ShiftImages]:
        result = self.sampler.generate_group(ctx.class_id, ctx.seed, list(shifts), list(scales))
        plain = self.sampler.plain_text(ctx.class_id)
        ctx.set_base(BaseImage(image=result.image(shifts[0], 0.0)))
        n = len(shifts)
        out = {}
        for shift in shifts:
            kind, words = self.table[shift]
            prompt = self.sampler.nuisance_text(ctx.class_id, shift)
            params = [
                {"kind": kind, "nuisance": words, "prompt": plain if s == 0 else prompt} for s in scales
            ]
            out[shift] = ShiftImages(
                images=[result.image(shift, s) for s in scales],
                params=params,
                unet_evals=result.unet_evals / n,
                seconds=result.seconds / n,
            )
        return out
