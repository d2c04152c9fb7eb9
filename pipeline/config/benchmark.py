"""``benchmark``: what to build (classes x seeds x shifts x scales)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from pipeline.config.base import REFERENCE_SCALES, SHIFT_NAME, Strict
from pipeline.io import bounds
from pipeline.labels import LabelSpace, label_space


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
            if not SHIFT_NAME.fullmatch(s):
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
