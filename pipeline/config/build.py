"""The whole build config: its sections and the checks that span them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from pipeline.config.base import SHIFT_NAME, Strict
from pipeline.config.benchmark import BenchmarkSpec
from pipeline.config.classifiers import ClassifierEntry
from pipeline.config.families import FamilyGroup, FamilySpec, SourceSpec
from pipeline.config.filter import FilterSpec
from pipeline.config.generator import GeneratorSpec
from pipeline.config.output import AggregateSpec, OutputSpec
from pipeline.config.refine import RefineSpec
from pipeline.config.resources import Resources
from pipeline.config.training import SliderTrainingSpec
from pipeline.io import bounds


class BuildConfig(Strict):
    protocol: Literal["cns", "custom"] | None = Field(
        None, description="cns: the original CNS-Bench inputs (default on ImageNet); custom: set every item yourself"
    )
    benchmark: BenchmarkSpec
    generator: GeneratorSpec = GeneratorSpec()
    filter: FilterSpec = FilterSpec()
    classifiers: list[ClassifierEntry] = Field(..., min_length=1)
    output: OutputSpec = OutputSpec()
    aggregate: AggregateSpec = AggregateSpec()
    resources: Resources = Resources()
    slider_training: SliderTrainingSpec = SliderTrainingSpec()
    refine: RefineSpec = RefineSpec()
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

    @model_validator(mode="wrap")
    @classmethod
    def _protocol(cls, data: Any, handler: Any) -> "BuildConfig":
        from pipeline.config import protocol

        # The validated config with the keys it left unset filled; see pipeline/config/protocol.py.
        return protocol.resolve(handler(data))

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
        from pipeline.config.vqa import check_distractor_sources

        check_distractor_sources(self.classifiers)  # a vlm's distractor classifier is in the pool
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
            if not SHIFT_NAME.fullmatch(s):
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
