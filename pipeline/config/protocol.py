"""The evaluation protocol of a build: one switch for the inputs that decide the numbers.

``protocol: cns`` (the default when the label space is ImageNet-1k) computes every input
to the filter and to the classifiers as the original CNS-Bench code does, so the published
thresholds apply and accuracies compare with the paper:

==========================  ============================================================
filter class names          Keras ``imagenet_class_index.json`` names, ``_`` -> space
                            (``pipeline/data/keras_imagenet_class_index.json``)
filter shift text           the shift name verbatim (``a photo of a goldfish in cartoon_style``)
DINOv2 similarity input     ``Resize(520)`` bilinear, ``CenterCrop(518)``, ``Normalize(0.5, 0.2)``
classifier input            ``Resize(256)`` bicubic, ``CenterCrop(224)``, ImageNet mean/std,
                            for every classifier (CLIP zero-shot included)
slider training             LoRA on attention and convolutions ("c3lier") without
                            cross-attention ("noxattn"), 512 px, batch 16
==========================  ============================================================

``protocol: custom`` (the default for any other label space) uses the project's own
choices: the label space's names, the shift's words, each model's own data config.
Under either protocol an explicitly set key wins; the protocol only fills the keys left
unset.  :func:`resolve` writes the effective values into the config, so the resolved
``config.yaml`` next to a build shows exactly what ran.

This module must stay importable without torch (config validation imports it).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

PROTOCOLS = ("cns", "custom")
KERAS_CLASS_INDEX = Path(__file__).resolve().parents[1] / "data" / "keras_imagenet_class_index.json"

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")


@dataclass(frozen=True)
class Preprocess:
    """Resize the shorter side to ``resize``, center-crop ``crop``, scale to [0, 1], normalise.

    ``shifted_crop_only``: images at a scale > 0 skip the resize (center crop and
    normalisation only).  ImageNet-C stores its corrupted images already resized and
    cropped to 224 px, and its ``test.py`` feeds them with ``CenterCrop(224)`` alone, while
    the clean images (scale 0) get the full transform.

    ``squash``: both sides are resized to ``resize`` (the aspect ratio is not kept), as
    Keras' ``load_img(target_size=(s, s))`` does (XIMAGENET-12's ``train.py``).
    """

    resize: int
    crop: int
    interpolation: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    shifted_crop_only: bool = False
    squash: bool = False

    def as_dict(self) -> dict[str, Any]:
        out = {
            "resize": self.resize, "crop": self.crop, "interpolation": self.interpolation,
            "mean": list(self.mean), "std": list(self.std),
        }
        if self.shifted_crop_only:
            out["shifted_crop_only"] = True
        if self.squash:
            out["squash"] = True
        return out


# easyrobust benchmarks/cns_benchmark.py: Resize(int(224 / 0.875)), interpolation 3 (bicubic).
CNS_CLASSIFIER = Preprocess(256, 224, "bicubic", IMAGENET_MEAN, IMAGENET_STD)
# evaluation/similiarity_computer.py, DinoImgSimilarity: Resize(520) (torchvision's default
# bilinear), CenterCrop(518), Normalize(mean=0.5, std=0.2) on every channel.
CNS_DINO = Preprocess(520, 518, "bilinear", (0.5, 0.5, 0.5), (0.2, 0.2, 0.2))

# The original slider trainer (generation/trainscripts/textsliders): config.yaml, the
# command line of its README and the settings train_lora.py forces per prompt.
CNS_SLIDER_TRAINING: dict[str, Any] = {
    "rank": 4,
    "alpha": 1.0,
    "targets": "attn_conv",  # "c3lier": the conv module list is appended to the attention one in place
    "method": "noxattn",
    "iterations": 400,
    "learning_rate": 2e-4,
    "eta": 4.0,
    "max_denoise_steps": 50,
    "resolution": 512,
    "batch_size": 16,
}
# What slider training did before the protocol existed (kept for ``custom``).
CUSTOM_SLIDER_TRAINING: dict[str, Any] = {"targets": "attn", "batch_size": 1}


# --------------------------------------------------------------------------- names
@functools.lru_cache(maxsize=1)
def keras_class_names() -> tuple[str, ...]:
    """The 1000 ImageNet names of Keras' ``imagenet_class_index.json`` with ``_`` as spaces.

    These are the names the original filter puts into its CLIP prompts (index 7 ``cock``,
    21 ``kite``, 134 and 517 both ``crane``, 638 and 639 both ``maillot``).
    """
    raw = json.loads(KERAS_CLASS_INDEX.read_text())
    names = tuple(raw[str(i)][1].replace("_", " ") for i in range(len(raw)))
    if len(names) != 1000:
        raise RuntimeError(f"{KERAS_CLASS_INDEX}: expected 1000 classes, found {len(names)}")
    return names


def is_imagenet(labels: Any) -> bool:
    return labels == "imagenet"


def default_protocol(labels: Any) -> str:
    """``cns`` on the ImageNet-1k label space, ``custom`` on any other."""
    return "cns" if is_imagenet(labels) else "custom"


# --------------------------------------------------------------------------- resolution
def resolve(cfg: Any) -> Any:
    """``cfg`` with every protocol-governed key left unset (``None``) filled with its effective value.

    ``cfg`` is a validated :class:`pipeline.config.BuildConfig`; the result is a copy (``cfg``
    is not changed) whose filled keys stay out of each model's ``model_fields_set``: they
    were not given by the config, so a released layout's protocol may still fill its own
    (:mod:`pipeline.sources.release_protocol`).  Raises ValueError naming the key for a
    combination that cannot hold.
    """
    protocol = cfg.protocol or default_protocol(cfg.benchmark.labels)
    cns = protocol == "cns"
    flt = cfg.filter
    class_names = flt.class_names
    if class_names is None:
        class_names = "keras" if cns and is_imagenet(cfg.benchmark.labels) else "labels"
    if class_names == "keras" and not is_imagenet(cfg.benchmark.labels):
        raise ValueError(
            "filter.class_names: 'keras' names exist for the ImageNet-1k label space only; "
            f"benchmark.labels is {cfg.benchmark.labels!r} (use 'labels')"
        )
    unknown = sorted(set(flt.shift_text) - set(cfg.benchmark.shifts) - {s for f in cfg.families for s in f.shifts})
    if unknown:
        raise ValueError(f"filter.shift_text: {unknown} are not shifts of this build")
    own = "cns" if cns else "model"
    dino = flt.dino if flt.dino.preprocess is not None else _filled(flt.dino, preprocess=own)
    flt = _filled(flt, class_names=class_names, dino=dino,
                  shift_text_style=flt.shift_text_style or ("verbatim" if cns else "words"))
    classifiers = [c if c.preprocess is not None else _filled(c, preprocess=own) for c in cfg.classifiers]
    # Slider-training keys have plain defaults (a spec built on its own stays usable), so
    # "unset" here means "not given in the config" (pydantic's model_fields_set).
    st = cfg.slider_training
    defaults = CNS_SLIDER_TRAINING if cns else {**CUSTOM_SLIDER_TRAINING, "resolution": cfg.generator.resolution}
    st = _filled(st, **{key: value for key, value in defaults.items()
                        if key not in st.model_fields_set and (key != "resolution" or st.resolution is None)})
    return _filled(cfg, protocol=protocol, filter=flt, classifiers=classifiers, slider_training=st)


def _filled(model: Any, **values: Any) -> Any:
    """A copy of the validated pydantic ``model`` with ``values`` in place of its own and the same
    ``model_fields_set`` (``model_construct``: the values are the resolver's, already checked)."""
    if all(getattr(model, k) == v for k, v in values.items()):
        return model
    return type(model).model_construct(_fields_set=set(model.model_fields_set), **{**dict(model), **values})


def filter_class_name(cfg: Any, class_id: int) -> str:
    """The class name the filter's CLIP prompts use for ``class_id``."""
    if cfg.filter.class_names == "keras":
        return keras_class_names()[class_id]
    return cfg.benchmark.class_name(class_id)


def shift_text(filter_spec: Any, shift: str, words: str | None = None) -> str:
    """The text the filter's class-in-shift prompt uses for ``shift``.

    ``filter.shift_text[shift]`` when given; else the shift name verbatim (style
    ``verbatim``, as the original evaluation script receives it: ``in cartoon_style``) or
    the shift's words (style ``words``: ``words`` if given, else the name with ``_`` as
    spaces).
    """
    explicit = filter_spec.shift_text.get(shift)
    if explicit is not None:
        return explicit
    if filter_spec.shift_text_style == "verbatim":
        return shift
    return words if words is not None else shift.replace("_", " ")


def filter_shift_text(cfg: Any, shift: str) -> str:
    """:func:`shift_text` of a build: style ``words`` uses ``benchmark.shift_words``."""
    return shift_text(cfg.filter, shift, cfg.shift_words(shift))


def problems(cfg: Any) -> list[str]:
    """Combinations the protocol refuses before a build starts (one line each, naming the key)."""
    out = []
    tokens = cfg.generator.class_tokens
    kinds = {g.kind for g in cfg.family_groups()}
    if is_imagenet(cfg.benchmark.labels) and kinds & {"slider", "prompt"} and tokens.kind == "none" and not tokens.plain_names:
        out.append(
            "generator.class_tokens: kind 'none' prompts SD2 with plain ImageNet class names, but CNS-Bench "
            "(and its published sliders) use the ImageNet* textual-inversion tokens; set "
            "generator.class_tokens to {kind: text_encoder_dir, path: DIR} (the released ImageNet* text encoder) "
            "or {kind: ti_folder, path: DIR} (Dataset Interfaces tokens/{i}.bin), or opt in to plain names "
            "with generator.class_tokens.plain_names: true"
        )
    return out


# --------------------------------------------------------------------------- transforms
def preprocess_of(choice: Any, cns_default: Preprocess) -> Preprocess | None:
    """``'cns'`` -> ``cns_default``; ``'model'`` -> None (the model's own); an explicit spec -> it."""
    if choice == "cns":
        return cns_default
    if choice == "model" or choice is None:
        return None
    data = choice if isinstance(choice, dict) else choice.model_dump()
    return Preprocess(
        int(data["resize"]), int(data["crop"]), str(data["interpolation"]),
        tuple(float(v) for v in data["mean"]), tuple(float(v) for v in data["std"]),
        bool(data.get("shifted_crop_only", False)),
        bool(data.get("squash", False)),
    )


def build_transform(p: Preprocess, shifted: bool = False) -> Callable[[Any], Any]:
    """PIL image -> normalised float tensor [C, H, W], as torchvision composes it.

    ``shifted``: the transform of images at a scale > 0, without the resize when
    ``p.shifted_crop_only``.
    """
    from torchvision import transforms

    modes = {
        "bilinear": transforms.InterpolationMode.BILINEAR,
        "bicubic": transforms.InterpolationMode.BICUBIC,
        "nearest": transforms.InterpolationMode.NEAREST,
    }
    size = (p.resize, p.resize) if p.squash else p.resize
    resize = [] if shifted and p.shifted_crop_only else [transforms.Resize(size, interpolation=modes[p.interpolation])]
    compose = transforms.Compose([
        *resize,
        transforms.CenterCrop(p.crop),
        transforms.ToTensor(),
        transforms.Normalize(mean=list(p.mean), std=list(p.std)),
    ])

    def transform(image: Any) -> Any:
        # The original reads images through torchvision's ImageFolder, which converts to RGB.
        return compose(image.convert("RGB") if getattr(image, "mode", "RGB") != "RGB" else image)

    return transform
