"""``classifiers``: the classifier pool, one entry per model."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Union

from pydantic import Discriminator, Field, PrivateAttr, Tag, TypeAdapter, field_validator, model_validator

from pipeline.config.base import Strict
from pipeline.config.filter import Preprocessing
from pipeline.io import bounds


# How a vlm's question is wrapped (``prompt_template``): LLaVA's llava_v1 conversation, or the checkpoint's template.
PROMPT_TEMPLATES = ("original", "model")
# How a vlm's image reaches its processor (``image_aspect_ratio``): as the processor resizes and crops
# it, or padded to a square in the processor's mean colour first (LLaVA's ``process_images``, ``pad``).
IMAGE_ASPECT_RATIOS = ("model", "pad")
VLM_DTYPES = ("float32", "float16", "bfloat16")


class ClassifierSpec(Strict):
    """A classifier entry: the fields every kind shares.  A kind with options of its own has a
    subclass (:class:`VLMSpec`), chosen by ``kind`` (:data:`ClassifierEntry`); the kind's class
    names it as its ``Spec`` (:class:`pipeline.models.classifier_kind.BaseClassifier`)."""

    # Keys that name local files (``./`` and ``../`` resolved against the config's folder;
    # hashed as the classifier's weights), and those of them that may be a folder.
    file_keys: ClassVar[tuple[str, ...]] = ("checkpoint", "model_config_file", "label_map")
    folder_keys: ClassVar[frozenset[str]] = frozenset()

    name: str = Field(..., pattern=r"^[A-Za-z0-9_.\-]+$", description="unique display name")
    kind: str = Field("timm", description="registry key: timm | open_clip_zeroshot | torchscript | exported | torch_hub | vlm | module (a model held in memory: pipeline.evaluate, pipeline.card)")
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
    # An object the entry's kind holds in memory rather than names in the config (the model of
    # kind ``module``), or a Ray reference to it: it travels with the spec (model_copy, pickle),
    # never into config.json or the config's hash.
    _held: Any = PrivateAttr(default=None)

    @property
    def held(self) -> Any:
        """The object the entry holds in memory (None for a kind that loads its model from files)."""
        return self._held

    def holding(self, obj: Any) -> "ClassifierSpec":
        """A copy of the entry holding ``obj``."""
        out = self.model_copy()
        out._held = obj
        return out

    @model_validator(mode="before")
    @classmethod
    def _options_of_other_kinds(cls, data: Any) -> Any:
        """A key of another kind's options named for what it is, not as an unknown key; left
        out when None (outputs written before a kind's options had their own spec hold every
        entry with a vlm's keys, null)."""
        if cls is ClassifierSpec and isinstance(data, dict):
            foreign = [k for k in VLM_ONLY if data.get(k) is not None]
            if foreign:
                raise ValueError(
                    f"{' / '.join(foreign)}: only a classifier of kind vlm takes them (kind is {data.get('kind', 'timm')!r})"
                )
            data = {k: v for k, v in data.items() if k not in VLM_ONLY}
        return data

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> "ClassifierSpec":
        """``ClassifierSpec.model_validate(entry)`` gives the spec of the entry's kind (:data:`ClassifierEntry`)."""
        if cls is ClassifierSpec:
            return _ENTRY.validate_python(obj, **kwargs)
        return super().model_validate(obj, **kwargs)

    @field_validator("templates")
    @classmethod
    def _templates(cls, value: str | list[str]) -> str | list[str]:
        for t in [] if isinstance(value, str) else value:
            bounds.check_template(t, {"c"}, required={"c"})
        return value


class VLMSpec(ClassifierSpec):
    """A ``vlm`` entry: how the model is asked (``protocol``) and run; its ``model`` is a hub id or a folder."""

    file_keys: ClassVar[tuple[str, ...]] = ("model", *ClassifierSpec.file_keys)
    folder_keys: ClassVar[frozenset[str]] = frozenset({"model"})

    protocol: dict[str, Any] | None = Field(
        None, description="vlm: how the model is asked and scored (kind two_choice | multiple_choice | open, ...)"
    )
    dtype: str | None = Field(
        None, description="vlm: weights dtype float32 | float16 | bfloat16 (default float32; float16 under ImageNet-D's protocol)"
    )
    vision_dtype: str | None = Field(
        None, description="vlm: the vision tower's dtype (default: dtype; float32 under ImageNet-D's protocol, as "
        "LLaVA-1.5's builder keeps its CLIP tower)",
    )
    image_aspect_ratio: str | None = Field(
        None, description="vlm: 'model' (the processor's resize and crop; the default) or 'pad' (padded to a square "
        "in the processor's mean colour first, as LLaVA-1.5; the default under ImageNet-D's protocol)",
    )
    prompt_template: str | None = Field(
        None,
        description="vlm: how the question is wrapped: 'original' (LLaVA's llava_v1 conversation, as ImageNet-D's "
        "eval_imagenet_d.py; the default under its protocol) or 'model' (the checkpoint's chat template; the default)",
    )

    @model_validator(mode="after")
    def _vlm(self) -> "VLMSpec":
        from pipeline.config.vqa import resolve_protocol

        # Defaults filled in, so config.json records the prompt and every parameter.  They are
        # written through __dict__ (not "set" by the config): a released layout's protocol
        # still fills them with its own (pipeline.sources.release_protocol).
        self.__dict__["protocol"] = resolve_protocol(self.protocol, "protocol")
        if self.dtype not in (None, *VLM_DTYPES):
            raise ValueError(f"dtype: must be float32, float16 or bfloat16, got {self.dtype!r}")
        if self.prompt_template not in (None, *PROMPT_TEMPLATES):
            raise ValueError(f"prompt_template: must be 'original' or 'model', got {self.prompt_template!r}")
        if self.vision_dtype not in (None, *VLM_DTYPES):
            raise ValueError(f"vision_dtype: must be float32, float16 or bfloat16, got {self.vision_dtype!r}")
        if self.image_aspect_ratio not in (None, *IMAGE_ASPECT_RATIOS):
            raise ValueError(f"image_aspect_ratio: must be 'model' or 'pad', got {self.image_aspect_ratio!r}")
        self.__dict__["dtype"] = self.dtype or "float32"
        self.__dict__["prompt_template"] = self.prompt_template or "model"
        return self


# The options model of each kind that has options of its own; every other kind's entry is a
# ClassifierSpec (an unknown kind too: the asset check names it with the registered ones).
SPECS: dict[str, type[ClassifierSpec]] = {"vlm": VLMSpec}
# The keys only another kind's spec has (named as such when a plain entry sets them).
VLM_ONLY = tuple(k for k in VLMSpec.model_fields if k not in ClassifierSpec.model_fields)


def spec_class(kind: Any) -> type[ClassifierSpec]:
    """The options model of classifier ``kind`` (:data:`SPECS`, else :class:`ClassifierSpec`)."""
    return SPECS.get(kind, ClassifierSpec) if isinstance(kind, str) else ClassifierSpec


# The union's tags (the spec classes' names), which a validation error's location holds.
SPEC_TAGS = {c.__name__: c for c in (ClassifierSpec, *SPECS.values())}


def _kind_tag(value: Any) -> str:
    kind = value.get("kind", "timm") if isinstance(value, dict) else getattr(value, "kind", "timm")
    return spec_class(kind).__name__


# A classifier entry of a config: the spec of its kind, chosen by ``kind``.
ClassifierEntry = Annotated[
    Union[tuple(Annotated[c, Tag(name)] for name, c in SPEC_TAGS.items())],
    Discriminator(_kind_tag),
]
_ENTRY: TypeAdapter = TypeAdapter(ClassifierEntry)
