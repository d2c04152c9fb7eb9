"""``filter``: the out-of-class filter's models, preprocessing and thresholds."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.config.base import Strict
from pipeline.io import bounds


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
    shifted_crop_only: bool = Field(
        False, description="images at a scale > 0 are center-cropped without the resize (ImageNet-C's test.py)"
    )
    squash: bool = Field(
        False,
        description="resize both sides to `resize`, not the shorter one (Keras load_img: XIMAGENET-12's train.py)",
        exclude_if=lambda v: not v,  # written only when set, so other layouts' recorded transforms stay as they were
    )

    @model_validator(mode="after")
    def _sizes(self) -> "PreprocessSpec":
        if self.crop > self.resize:
            raise ValueError(f"crop ({self.crop}) must be <= resize ({self.resize})")
        if len(self.mean) != len(self.std) or any(v <= 0 for v in self.std):
            raise ValueError(f"mean and std need the same length and std > 0, got mean={self.mean}, std={self.std}")
        return self


# 'cns': the original CNS-Bench transform, 'model': the model's own data config (see pipeline.config.protocol).
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
