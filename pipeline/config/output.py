"""``output`` and ``aggregate``: where results go and how reports are made."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from pipeline.config.base import Strict
from pipeline.io import bounds


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
