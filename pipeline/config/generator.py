"""``generator``: the diffusion model, class tokens, sliders and sampling."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.config.base import REFERENCE_NEGATIVE_PROMPT, Strict
from pipeline.io import bounds


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
    compile: bool = Field(
        False,
        description="torch.compile the UNet with the slider application in its graph: static shapes "
        "(a unit's last window chunk padded to branch_batch_size), no recompilation when sliders or "
        "multipliers change; CUDA graphs (mode reduce-overhead) on CUDA",
    )
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
