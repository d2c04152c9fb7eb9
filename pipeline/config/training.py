"""``slider_training``: settings of concept-slider training."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from pipeline.config.base import Strict
from pipeline.config.resources import StageResources
from pipeline.io import bounds


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
