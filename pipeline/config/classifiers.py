"""``classifiers``: the classifier pool, one entry per model."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from pipeline.config.base import Strict
from pipeline.config.filter import Preprocessing
from pipeline.io import bounds


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
