"""Typed build configuration: loaded from YAML, validated before any model is touched.

Every section is a pydantic model with ``extra="forbid"`` so a misspelt key is an
error, not a silently ignored setting.  :func:`load_config` turns validation errors
into messages that name the file, the key path, the bad value and what is allowed.

Relative paths in a config file are resolved against the directory of that file, so
``configs/demo.yaml`` works from any working directory.  The fully resolved config
(:func:`resolved_dict`) and its hash (:func:`config_hash`) are written next to the
outputs of a build.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from pipeline.io import bounds
from pipeline.labels import LabelSpace, label_space

REFERENCE_SCALES = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
REFERENCE_NEGATIVE_PROMPT = "blurry,text,caption,lowquality,lowresolution,low res,grainy,ugly"
SHIFT_NAME = re.compile(r"^[a-z0-9][a-z0-9_]*$")


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file, key path and value."""


class Strict(BaseModel):
    # allow_inf_nan=False: NaN or infinite numbers anywhere in a config are refused.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


# --------------------------------------------------------------------------- resources
class StageResources(Strict):
    """Ray resources of one stage's actor pool."""

    num_gpus: float = Field(0.0, ge=0, description="GPUs per actor (fractions pack actors on a GPU)")
    num_cpus: float = Field(1.0, gt=0)
    batch_size: int = Field(1, ge=1, le=bounds.MAX_BATCH, description="rows per map_batches call")
    pool_size: int = Field(1, ge=1, le=bounds.MAX_BATCH, description="actors started at once")
    max_pool_size: int | None = Field(None, ge=1, description="autoscale up to this many actors")
    max_retries: int = Field(2, ge=0, description="restarts of a crashed actor before items are failed")

    @model_validator(mode="after")
    def _pool(self) -> "StageResources":
        if self.max_pool_size is not None and self.max_pool_size < self.pool_size:
            raise ValueError(f"max_pool_size ({self.max_pool_size}) must be >= pool_size ({self.pool_size})")
        return self


class Resources(Strict):
    generate: StageResources = StageResources(num_gpus=1.0, batch_size=1)
    filter: StageResources = StageResources(num_gpus=0.25, batch_size=8)
    classify: StageResources = StageResources(num_gpus=0.25, batch_size=8)
    write: StageResources = StageResources(num_cpus=1.0, batch_size=64)
    # Reading existing images (evaluate): light I/O, batches the size of the next stage's.
    load: StageResources = StageResources(num_cpus=1.0, batch_size=8)
    # Adding predictions of new classifiers to committed shards (one shard per batch).
    reclassify: StageResources = StageResources(num_gpus=0.25, batch_size=1)


# --------------------------------------------------------------------------- benchmark
class BenchmarkSpec(Strict):
    """What to build: classes x seeds x shifts x scales."""

    name: str = "cns-bench"
    labels: str | list[str] = Field(
        "imagenet", description="'imagenet', 'imagenet_d' (113 classes, multi-id), a list of class names, or a file of them"
    )
    classes: list[int | str] = Field(..., min_length=1, description="class ids (ImageNet: 0..999) or class names")
    seeds: list[int] = Field(..., min_length=1)
    shifts: list[str] = Field(..., min_length=1, description="shifts of the primary family (generator.kind)")
    scales: list[float] = Field(default_factory=lambda: list(REFERENCE_SCALES))
    shift_words: dict[str, str] = Field(
        default_factory=dict,
        description="words of a shift in prompts and reports; default: the name with '_' as spaces",
    )

    @field_validator("seeds", mode="before")
    @classmethod
    def _seed_range(cls, value: Any) -> Any:
        # "1..50" is shorthand for the reference's seeds 1..N.
        if isinstance(value, str):
            return bounds.seed_range(value)  # bounded before the list is made
        if isinstance(value, list) and len(value) > bounds.MAX_SEEDS:
            raise ValueError(f"{len(value)} seeds; at most {bounds.MAX_SEEDS} are allowed")
        return value

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError("seeds must be unique")
        if any(s < 0 or s >= 2**63 for s in value):
            raise ValueError("seeds must be in [0, 2**63)")
        return value

    @model_validator(mode="after")
    def _classes(self) -> "BenchmarkSpec":
        space = label_space(self.labels)
        ids = []
        for i, v in enumerate(self.classes):
            try:
                ids.append(space.resolve(v))
            except ValueError as err:
                raise ValueError(f"classes[{i}]: {err}") from None
        if len(set(ids)) != len(ids):
            raise ValueError(f"classes contain duplicates after resolving names: {ids}")
        # Assigning through __dict__ keeps validate_assignment from re-running this validator.
        self.__dict__["classes"] = ids
        return self

    @property
    def label_space(self) -> LabelSpace:
        return label_space(self.labels)

    def class_name(self, class_id: int) -> str:
        return self.label_space.name(class_id)

    @field_validator("shifts")
    @classmethod
    def _shifts(cls, value: list[str]) -> list[str]:
        for s in value:
            if not SHIFT_NAME.match(s):
                raise ValueError(f"shift {s!r} must match {SHIFT_NAME.pattern} (e.g. 'painting_style')")
        if len(set(value)) != len(value):
            raise ValueError("shifts must be unique")
        return value

    @field_validator("scales")
    @classmethod
    def _scales(cls, value: list[float]) -> list[float]:
        if 0.0 not in value:
            raise ValueError("scales must include 0 (the unshifted reference image of every trajectory)")
        if sorted(set(value)) != list(value):
            raise ValueError(f"scales must be unique and ascending, got {value}")
        bounds.check_scales(value)
        return [float(v) for v in value]


# --------------------------------------------------------------------------- generator
class ClassTokens(Strict):
    """Where the textual-inversion class tokens come from.

    ``ti_folder``: ``{path}/{i}.bin``, one embedding per ImageNet class, token
    ``<{class name}-{i}>``.  ``text_encoder_dir``: a directory with ``tokenizer/``,
    ``text_encoder/`` and ``tokens.pt``.  ``none``: the plain class name is used.
    """

    kind: Literal["ti_folder", "text_encoder_dir", "none"] = "ti_folder"
    path: str | None = None
    plain_names: bool = Field(
        False, description="kind none on ImageNet: opt in to plain-name prompts (not what CNS-Bench used)"
    )

    @model_validator(mode="after")
    def _path(self) -> "ClassTokens":
        if self.kind != "none" and not self.path:
            raise ValueError(f"class_tokens.path is required for kind {self.kind!r}")
        return self


class GeneratorSpec(Strict):
    kind: str = Field("slider", description="registry key, see `cnsbench ls`")
    model: str = Field("stabilityai/stable-diffusion-2", description="diffusers model dir or hub id")
    class_tokens: ClassTokens = ClassTokens(kind="none")
    slider_store: str | None = Field(None, description="directory or URI holding one slider per (class, shift)")
    slider_pattern: str = Field(
        "{shift}/{class_id:03d}.safetensors",
        description="file of a slider inside the store; placeholders {shift}, {class_id}, {class_name}",
    )
    prompt: str = "a picture of a {token}"
    shift_prompt: str = Field("a picture of a {token} in {shift_words}", description="used by the prompt baseline")
    negative_prompt: str = REFERENCE_NEGATIVE_PROMPT
    steps: int = Field(50, ge=1, le=1000)
    guidance_scale: float = Field(7.5, ge=0)
    lora_timestep_threshold: int = Field(750, ge=0, le=1000, description="slider on while t <= threshold")
    resolution: int = Field(768, ge=8, le=bounds.MAX_RESOLUTION, description="generated size in pixels (multiple of 8)")
    image_size: int = Field(256, ge=8, le=bounds.MAX_RESOLUTION, description="saved size in pixels")
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    share_prefix: bool = Field(True, description="compute pre-window steps and scale 0 once per (class, seed)")
    branch_batch_size: int = Field(16, ge=1, le=bounds.MAX_BATCH, description="(shift, scale) branches per UNet forward")
    attention: Literal["auto", "sdpa", "xformers"] = "auto"
    channels_last: bool = False
    compile: bool = False
    options: dict[str, Any] = Field(default_factory=dict, description="options of the primary family (generator.kind)")

    @field_validator("resolution")
    @classmethod
    def _res(cls, value: int) -> int:
        if value % 8:
            raise ValueError(f"resolution must be a multiple of 8, got {value}")
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str) -> str:
        bounds.check_template(value, {"token"}, required={"token"})
        return value

    @field_validator("shift_prompt")
    @classmethod
    def _shift_prompt(cls, value: str) -> str:
        bounds.check_template(value, {"token", "shift_words"})
        return value

    @field_validator("slider_pattern")
    @classmethod
    def _slider_pattern(cls, value: str) -> str:
        from pipeline.io.fs import normalize_relpath

        bounds.check_template(value, {"shift", "class_id", "class_name"})
        normalize_relpath(value.replace("{", "").replace("}", ""), "slider_pattern")  # relative, inside the store
        return value


# --------------------------------------------------------------------------- filter
class ClipModelSpec(Strict):
    model: str = "ViT-B-16"
    pretrained: str | None = Field("openai", description="open_clip pretrained tag or a local weights file")
    model_config_file: str | None = Field(None, description="JSON architecture for a custom open_clip model")


class PreprocessSpec(Strict):
    """An explicit eval transform: resize the shorter side, center-crop, scale to [0, 1], normalise."""

    resize: int = Field(..., ge=1, le=bounds.MAX_RESOLUTION)
    crop: int = Field(..., ge=1, le=bounds.MAX_RESOLUTION)
    interpolation: Literal["bilinear", "bicubic", "nearest"] = "bicubic"
    mean: list[float] = Field(..., min_length=1)
    std: list[float] = Field(..., min_length=1)

    @model_validator(mode="after")
    def _sizes(self) -> "PreprocessSpec":
        if self.crop > self.resize:
            raise ValueError(f"crop ({self.crop}) must be <= resize ({self.resize})")
        if len(self.mean) != len(self.std) or any(v <= 0 for v in self.std):
            raise ValueError(f"mean and std need the same length and std > 0, got mean={self.mean}, std={self.std}")
        return self


# 'cns': the original CNS-Bench transform, 'model': the model's own data config (see pipeline.protocol).
Preprocessing = Literal["cns", "model"] | PreprocessSpec


class DinoModelSpec(Strict):
    model: str = "vit_large_patch14_reg4_dinov2.lvd142m"
    checkpoint: str | None = Field(None, description="local weights file; otherwise timm's pretrained tag")
    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    softmax_cls: bool = Field(True, description="softmax on the class token before the cosine (reference code)")
    preprocess: Preprocessing | None = Field(
        None, description="cns: Resize(520) bilinear, CenterCrop(518), Normalize(0.5, 0.2); model: timm's config"
    )


class Thresholds(Strict):
    """A detector passes when its score is strictly greater than the threshold."""

    clip_text: float = 28.7394449
    clip_shift_text: float = 35.2928484
    clip_image: float = 0.805859378
    dino_image: float = 0.781161878


class FilterSpec(Strict):
    kind: str = Field("ooc4", description="registry key, see `cnsbench ls`")
    enabled: bool = True
    clip: ClipModelSpec = ClipModelSpec()
    dino: DinoModelSpec = DinoModelSpec()
    thresholds: Thresholds = Thresholds()
    min_pass: int = Field(2, ge=0, le=4, description="keep a sample when at least this many detectors pass")
    class_prompt: str = "a photo of a {class_name}"
    shift_prompt: str = "a photo of a {class_name} in {shift_words}"
    class_names: Literal["keras", "labels"] | None = Field(
        None, description="names in the prompts: keras (the original's ImageNet names) or the label space's"
    )
    shift_text_style: Literal["verbatim", "words"] | None = Field(
        None, description="{shift_words} of the prompts: the shift name verbatim (cns) or its words"
    )
    shift_text: dict[str, str] = Field(default_factory=dict, description="filter text of a shift, overriding the style")

    @field_validator("class_prompt", "shift_prompt")
    @classmethod
    def _prompts(cls, value: str) -> str:
        bounds.check_template(value, {"class_name", "shift_words"})
        return value


# --------------------------------------------------------------------------- classifiers
class ClassifierSpec(Strict):
    name: str = Field(..., pattern=r"^[A-Za-z0-9_.\-]+$", description="unique display name")
    kind: str = Field("timm", description="registry key: timm | open_clip_zeroshot")
    model: str = Field(..., description="timm model name (arch.tag) or open_clip architecture")
    checkpoint: str | None = Field(None, description="local weights file (timm) or pretrained tag/file (open_clip)")
    model_config_file: str | None = Field(None, description="open_clip: JSON architecture of a custom model")
    model_kwargs: dict[str, Any] = Field(default_factory=dict, description="timm create_model overrides")
    templates: str | list[str] = Field("openai_imagenet", description="zero-shot prompt templates or a set name")
    label_map: dict[int, int] | str | None = Field(
        None, description="output index -> ImageNet id (dict or JSON file); identity over 1000 classes if unset"
    )
    preprocess: Preprocessing | None = Field(
        None, description="cns: Resize(256) bicubic, CenterCrop(224), ImageNet mean/std; model: the model's own"
    )

    @field_validator("templates")
    @classmethod
    def _templates(cls, value: str | list[str]) -> str | list[str]:
        for t in [] if isinstance(value, str) else value:
            bounds.check_template(t, {"c"}, required={"c"})
        return value


# --------------------------------------------------------------------------- output / aggregate
class OutputSpec(Strict):
    path: str | None = Field(None, description="directory or URI; `build --output` overrides it")
    trajectories_per_shard: int = Field(64, ge=1, le=bounds.MAX_BATCH)
    image_format: Literal["png", "jpg"] = "png"
    jpeg_quality: int = Field(95, ge=1, le=100)


class BootstrapSpec(Strict):
    """Bootstrap confidence intervals of the report (see docs/report.md)."""

    resamples: int = Field(1000, ge=0, le=100000, description="resamples of trajectories within (shift, class); 0: none")
    level: float = Field(0.95, gt=0.0, lt=1.0, description="two-sided level of the percentile intervals")
    seed: int = Field(0, ge=0, description="seed of the resampling (the intervals are deterministic for it)")


class StripSpec(Strict):
    """Image strips of the report: per shift a contact sheet of trajectories x scales."""

    count: int = Field(8, ge=0, le=200, description="trajectories per sheet; 0: no strips")
    choice: Literal["random", "most_robust", "least_robust"] = Field(
        "random", description="random (fixed seed) or the trajectories with the latest/earliest failure points"
    )
    seed: int = Field(0, ge=0, description="seed of the random choice")
    thumb_px: int = Field(64, ge=16, le=512, description="thumbnail edge in pixels")


class AggregateSpec(Strict):
    margin_max_scale: float = Field(3.0, description="failure point given to never-failed trajectories in the margin")
    fp_std_ddof: int = Field(1, ge=0, le=1, description="1: sample std as the reference code's pandas .std()")
    plots: bool = True
    analyses: list[str | dict[str, Any]] = Field(
        default_factory=lambda: ["cns"],
        description="analyses to run (registry keys, or {name: key, ...options}); families add their own",
    )
    bootstrap: BootstrapSpec = BootstrapSpec()
    strips: StripSpec = StripSpec()

    @field_validator("analyses")
    @classmethod
    def _analyses(cls, value: list[str | dict[str, Any]]) -> list[str | dict[str, Any]]:
        for i, entry in enumerate(value):
            if isinstance(entry, dict) and not isinstance(entry.get("name"), str):
                raise ValueError(f"analyses[{i}]: an entry with options needs a 'name' key")
        return value

    def analysis_entries(self) -> list[tuple[str, dict[str, Any]]]:
        """(registry key, options) of every configured analysis."""
        out = []
        for entry in self.analyses:
            if isinstance(entry, str):
                out.append((entry, {}))
            else:
                out.append((entry["name"], {k: v for k, v in entry.items() if k != "name"}))
        return out


class SliderTrainingSpec(Strict):
    """Concept-slider training (text slider): one LoRA per (class, shift)."""

    rank: int = Field(4, ge=1)
    alpha: float = Field(1.0, gt=0)
    targets: Literal["attn", "attn_conv"] = Field(
        "attn", description="attn: attention only; attn_conv: + convs (c3lier, the cns protocol's default)"
    )
    method: Literal["noxattn", "full", "xattn", "selfattn"] = "noxattn"
    iterations: int = Field(400, ge=1)
    learning_rate: float = Field(2e-4, gt=0)
    eta: float = Field(4.0, description="guidance of the slider target: neutral + eta * (positive - unconditional)")
    mode: Literal["enhance", "erase"] = Field("enhance", description="erase: neutral - eta * (...)")
    positive_prompt: str = "{token}, in {shift_words}"

    @field_validator("positive_prompt")
    @classmethod
    def _positive_prompt(cls, value: str) -> str:
        bounds.check_template(value, {"token", "shift_words"}, where="slider_training.positive_prompt")
        return value
    max_denoise_steps: int = Field(50, ge=1, description="k ~ U{1..max} partial DDIM steps per iteration")
    resolution: int | None = Field(
        None, ge=8, le=bounds.MAX_RESOLUTION, description="training size in pixels (cns: 512; else generator.resolution)"
    )
    batch_size: int = Field(1, ge=1, le=bounds.MAX_BATCH, description="latents per iteration (cns: 16)")
    seed: int = 0
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    resources: StageResources = StageResources(num_gpus=1.0)


class FamilySpec(Strict):
    """A further shift family of the build, on the same (class, seed) units as the primary one."""

    kind: str = Field(..., description="registry key, see `cnsbench ls`")
    shifts: list[str] = Field(..., min_length=1)
    scales: list[float] | None = Field(None, description="this family's scale grid; default: the family's own")
    options: dict[str, Any] = Field(default_factory=dict)


class MaskSpec(Strict):
    """Where object masks come from (families with ``needs_mask``)."""

    kind: str = Field("none", description="registry key of a mask provider, see `cnsbench ls`")
    path: str | None = Field(None, description="mask folder (kind 'folder')")
    options: dict[str, Any] = Field(default_factory=dict)


class SourceSpec(Strict):
    """Where a trajectory's scale-0 image comes from for families that transform images."""

    kind: str = Field("seed", description="registry key: 'seed' (text-to-image from the seed) or a collection")
    path: str | None = Field(None, description="collection location (folders, WebDataset)")
    label_map: str | None = Field(None, description="JSON {folder name: class id} for class folders")
    follow_symlinks: bool = Field(False, description="follow symlinks that leave the collection")
    masks: MaskSpec = MaskSpec()


@dataclass(frozen=True)
class FamilyGroup:
    """A resolved family of a build: its kind, shifts, scale grid and validated options."""

    kind: str
    shifts: tuple[str, ...]
    scales: tuple[float, ...]
    options: Any  # the family's Options model instance
    primary: bool = False

    @property
    def where(self) -> str:
        return "generator" if self.primary else f"families[{self.kind}]"


class BuildConfig(Strict):
    protocol: Literal["cns", "custom"] | None = Field(
        None, description="cns: the original CNS-Bench inputs (default on ImageNet); custom: set every item yourself"
    )
    benchmark: BenchmarkSpec
    generator: GeneratorSpec = GeneratorSpec()
    filter: FilterSpec = FilterSpec()
    classifiers: list[ClassifierSpec] = Field(..., min_length=1)
    output: OutputSpec = OutputSpec()
    aggregate: AggregateSpec = AggregateSpec()
    resources: Resources = Resources()
    slider_training: SliderTrainingSpec = SliderTrainingSpec()
    families: list[FamilySpec] = Field(default_factory=list, description="further shift families of the build")
    source: SourceSpec = SourceSpec()
    _groups: list[FamilyGroup] | None = PrivateAttr(None)

    # ------------------------------------------------------------ families
    def family_groups(self) -> list[FamilyGroup]:
        """The primary family (generator.kind over benchmark.shifts/scales), then ``families``."""
        if self._groups is None:
            self._groups = _resolve_groups(self)
        return self._groups

    def all_shifts(self) -> list[str]:
        return [s for g in self.family_groups() for s in g.shifts]

    def scales_of(self, shift: str) -> list[float]:
        for g in self.family_groups():
            if shift in g.shifts:
                return list(g.scales)
        raise KeyError(f"shift {shift!r} is not part of this build")

    def shift_words(self, shift: str) -> str:
        """Words of a shift in prompts and reports (``benchmark.shift_words``, else '_' -> ' ')."""
        return self.benchmark.shift_words.get(shift, shift.replace("_", " "))

    @model_validator(mode="after")
    def _protocol(self) -> "BuildConfig":
        from pipeline import protocol

        protocol.resolve(self)  # fills the keys left unset; see pipeline/protocol.py
        return self

    @model_validator(mode="after")
    def _families(self) -> "BuildConfig":
        self._groups = None
        self.family_groups()  # raises ValueError naming the family and key
        return self

    @model_validator(mode="after")
    def _cross(self) -> "BuildConfig":
        names = [c.name for c in self.classifiers]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"classifier names must be unique, duplicated: {dup}")
        if self.aggregate.margin_max_scale < max(self.benchmark.scales):
            raise ValueError(
                f"aggregate.margin_max_scale ({self.aggregate.margin_max_scale}) must be >= the largest scale"
            )
        return self


def _check_scales(scales: list[float], where: str) -> list[float]:
    if 0.0 not in scales:
        raise ValueError(f"{where}: scales must include 0 (the unshifted reference image of every trajectory)")
    if sorted(set(scales)) != list(scales):
        raise ValueError(f"{where}: scales must be unique and ascending, got {scales}")
    try:
        bounds.check_scales(scales)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    return [float(v) for v in scales]


def _resolve_groups(cfg: "BuildConfig") -> list[FamilyGroup]:
    """Validate every family entry against its registered family and return the groups."""
    from pydantic import ValidationError as _VE

    from pipeline.registry import FAMILIES

    entries = [("generator", cfg.generator.kind, cfg.benchmark.shifts, cfg.benchmark.scales, cfg.generator.options)]
    for i, fam in enumerate(cfg.families):
        entries.append((f"families[{i}]", fam.kind, fam.shifts, fam.scales, fam.options))
    groups, seen = [], {}
    for n, (where, kind, shifts, scales, options) in enumerate(entries):
        try:
            family = FAMILIES.get(kind)
        except KeyError as err:
            raise ValueError(f"{where}.kind: {err.args[0]}") from None
        try:
            opts = family.Options.model_validate(options)
        except _VE as err:
            detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
            raise ValueError(f"{where}.options: {detail}") from None
        for s in shifts:
            if not SHIFT_NAME.match(s):
                raise ValueError(f"{where}.shifts: shift {s!r} must match {SHIFT_NAME.pattern}")
            if s in seen:
                raise ValueError(f"{where}.shifts: shift {s!r} is already a shift of {seen[s]}")
            seen[s] = where
        problems = family.check_shifts(list(shifts), opts)
        if problems:
            raise ValueError(f"{where}.shifts: " + "; ".join(problems))
        if scales is None:
            scales = family.default_scales
            if scales is None:
                raise ValueError(f"{where}.scales: family {kind!r} has no default scale grid; set scales")
        grid = _check_scales(list(scales), f"{where}.scales")
        problems = family.check_scales(grid)
        if problems:
            raise ValueError(f"{where}.scales: " + "; ".join(problems))
        groups.append(FamilyGroup(kind, tuple(shifts), tuple(grid), opts, primary=(n == 0)))
    return groups


# --------------------------------------------------------------------------- loading
_PATH_KEYS = {
    ("benchmark", "labels"),
    ("generator", "model"),
    ("generator", "class_tokens", "path"),
    ("generator", "slider_store"),
    ("filter", "clip", "pretrained"),
    ("filter", "clip", "model_config_file"),
    ("filter", "dino", "checkpoint"),
    ("output", "path"),
    ("source", "path"),
    ("source", "label_map"),
    ("source", "masks", "path"),
}
_CLASSIFIER_PATH_KEYS = {"checkpoint", "model_config_file", "label_map"}


def _looks_relative_path(value: Any) -> bool:
    return isinstance(value, str) and (value.startswith("./") or value.startswith("../"))


def _resolve_paths(raw: dict[str, Any], base: Path) -> None:
    """Make ``./`` and ``../`` paths absolute relative to the config's directory."""

    def fix(container: dict[str, Any], key: str) -> None:
        if key in container and _looks_relative_path(container[key]):
            container[key] = str((base / container[key]).resolve())

    for path in _PATH_KEYS:
        node: Any = raw
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            fix(node, path[-1])
    for clf in raw.get("classifiers") or []:
        if isinstance(clf, dict):
            for key in _CLASSIFIER_PATH_KEYS:
                fix(clf, key)


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """Walk a model class along an error location and list the keys allowed there."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(part)
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ()) or ()
        candidates = [ann, *args]
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if current is None:
            return None
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return None


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        key = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc).replace(".[", "[")
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(BuildConfig, loc)
            msg = f"unknown key; allowed keys here: {', '.join(allowed) if allowed else '?'}"
        elif e["type"] == "literal_error":
            msg = f"{msg}"
        value = e.get("input")
        shown = "" if e["type"] in ("missing", "extra_forbidden") or isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"  {key or '<root>'}: {msg}{shown}")
    return "\n".join(lines)


def parse_config(raw: dict[str, Any], source: str = "<dict>", base_dir: Path | None = None) -> BuildConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"invalid config {source}: the top level must be a mapping, got {type(raw).__name__}")
    try:
        bounds.check_expansion(raw, source)  # before the copy below expands aliases
    except ValueError as err:
        raise ConfigError(str(err)) from None
    bad = bounds.nonfinite_path(raw)
    if bad:
        raise ConfigError(f"invalid config {source}:\n  {bad}: NaN or infinite numbers are not allowed")
    try:
        raw = json.loads(json.dumps(raw))  # deep copy, and rejects non-JSON values early
    except (TypeError, ValueError) as err:
        raise ConfigError(f"invalid config {source}: {err} (values must be strings, numbers, lists or mappings)") from None
    if base_dir is not None:
        _resolve_paths(raw, base_dir)
    try:
        return BuildConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def load_config(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> BuildConfig:
    """Load and validate a YAML config file; raises :class:`ConfigError` with a readable message."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        raw = bounds.load_yaml(p)  # bounded size, nesting and alias expansion
    except (ValueError, OSError) as err:
        raise ConfigError(str(err)) from None
    if overrides:
        raw = deep_merge(raw or {}, overrides)
    return parse_config(raw, source=str(p), base_dir=p.resolve().parent)


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def resolved_dict(cfg: BuildConfig) -> dict[str, Any]:
    return cfg.model_dump(mode="json")


def config_hash(cfg: BuildConfig) -> str:
    """Hash of the resolved config (resources excluded: they never change outputs)."""
    data = resolved_dict(cfg)
    data.pop("resources", None)
    blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def dump_yaml(cfg: BuildConfig) -> str:
    return yaml.safe_dump(resolved_dict(cfg), sort_keys=False)
