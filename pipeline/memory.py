"""Memory a stage's actor needs, known before any weights load, and the classifier groups it implies.

A model's footprint is its weights (parameters x bytes of the dtype it runs in) plus the
peak activations of one forward at the batch the stage runs: the model is built on
PyTorch's ``meta`` device (shapes only, no memory, no download) and one forward there
records the largest input + output of any leaf module.  Peak activations are that, times
:data:`ACTIVATION_FACTOR` (tensors alive around it), times the images of one forward.
Each actor also pays :data:`RUNTIME_BYTES` for the interpreter, torch and (on a GPU) the
CUDA context.

:func:`classifier_groups` packs the classifiers into groups whose projected memory fits
``resources.classify.memory_budget_gb`` (first fit, largest first; each group keeps the
config's order); each group runs in its own classify actor pool
(:func:`pipeline.stages.classify.classify_specs`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from pipeline.config import BuildConfig, ClassifierSpec

log = logging.getLogger(__name__)

GB = 1024**3
RUNTIME_BYTES = 768 * 1024**2  # Python, torch and its libraries; about the CUDA context on a GPU
ACTIVATION_FACTOR = 2.0  # tensors alive around the largest module call (residual stream, allocator slack)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CLASSIFIER_DTYPE = "float32"  # classifiers run in float32 (pipeline.models.classifiers)


@dataclass(frozen=True)
class Footprint:
    """One model at one batch: parameters, weight bytes and peak activation bytes."""

    name: str
    params: int
    weight_bytes: int
    activation_bytes: int
    note: str = ""  # how the size was found when it is a guess (an unknown architecture)

    @property
    def total(self) -> int:
        return self.weight_bytes + self.activation_bytes


# --------------------------------------------------------------------------- meta builds
def meta_forward_peak(model: "torch.nn.Module", shape: Sequence[int], call: Callable | None = None) -> int:
    """Largest input + output bytes of any leaf module in one forward of a ``shape`` input on ``meta``."""
    import torch

    peak = [0]

    def nbytes(value: Any) -> int:
        if isinstance(value, torch.Tensor):
            return value.numel() * value.element_size()
        if isinstance(value, (list, tuple)):
            return sum(nbytes(v) for v in value)
        return 0

    def hook(_module, inputs, output) -> None:
        peak[0] = max(peak[0], nbytes(inputs) + nbytes(output))

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    try:
        with torch.inference_mode():
            x = torch.zeros(*shape, device="meta")
            (call or model)(x)
    except Exception as err:  # noqa: BLE001 - a forward meta tensors cannot run: weights only
        log.debug("meta forward of %s failed: %s", type(model).__name__, err)
    finally:
        for h in handles:
            h.remove()
    return peak[0]


def _params(model: "torch.nn.Module") -> int:
    return sum(p.numel() for p in model.parameters())


def _timm_meta(name: str, model_kwargs: dict[str, Any]) -> "torch.nn.Module":
    import timm
    import torch

    with torch.device("meta"):
        return timm.create_model(name.split(".", 1)[0], pretrained=False, **model_kwargs).eval()


def _input_size(spec: "ClassifierSpec", model: Any, default: int = 224) -> int:
    """The side of the square input the classifier sees (its protocol crop, or the model's own)."""
    from pipeline.protocol import CNS_CLASSIFIER, preprocess_of

    p = preprocess_of(spec.preprocess or "model", CNS_CLASSIFIER)
    if p is not None:
        return p.crop
    size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size")
    return int(size[-1]) if size else default


def _timm_footprint(spec: "ClassifierSpec", images: int) -> tuple[int, int]:
    model = _timm_meta(spec.model, spec.model_kwargs)
    side = _input_size(spec, model)
    return _params(model), meta_forward_peak(model, (1, 3, side, side)) * images


def _open_clip_footprint(spec: "ClassifierSpec", images: int) -> tuple[int, int]:
    import open_clip
    import torch

    if spec.model_config_file:
        from pipeline.models.detectors import register_open_clip_config

        register_open_clip_config(spec.model_config_file, spec.model, f"classifiers[{spec.name}].model_config_file")
    with torch.device("meta"):
        model = open_clip.create_model(spec.model, pretrained=None, device="meta").eval()
    side = int(model.visual.image_size[0] if isinstance(model.visual.image_size, (tuple, list)) else model.visual.image_size)
    peak = meta_forward_peak(model.visual, (1, 3, side, side))
    return _params(model), peak * images


# DINOv2 torch-hub entry points as the timm architectures they match; the ``_lc`` linear
# head reads the class token and the mean patch token (2 x width -> 1000 classes).
_DINOV2_HUB = re.compile(r"^dinov2_vit([sblg])14(_reg)?(_lc)?$")
_DINOV2_TIMM = {"s": "vit_small_patch14", "b": "vit_base_patch14", "l": "vit_large_patch14", "g": "vit_giant_patch14"}


def _torch_hub_footprint(spec: "ClassifierSpec", images: int) -> tuple[int, int]:
    entry = spec.model.rpartition(":")[2]
    m = _DINOV2_HUB.match(entry)
    if not m:
        raise LookupError(f"no size known for torch hub entry {entry!r}")
    arch = f"{_DINOV2_TIMM[m.group(1)]}{'_reg4' if m.group(2) else ''}_dinov2"
    model = _timm_meta(arch, {"img_size": 224})
    head = (2 * model.embed_dim + 1) * 1000 if m.group(3) else 0
    return _params(model) + head, meta_forward_peak(model, (1, 3, 224, 224)) * images


def _torchscript_footprint(spec: "ClassifierSpec", images: int) -> tuple[int, int]:
    size = os.path.getsize(spec.checkpoint) if spec.checkpoint and os.path.isfile(spec.checkpoint) else 0
    return size // DTYPE_BYTES[CLASSIFIER_DTYPE], 0


# Classifier kind -> (spec, images per forward) -> (parameters, activation bytes).  A kind
# registered elsewhere may instead give its class a ``footprint(spec, images)`` static
# method returning the same pair.
CLASSIFIER_SIZERS: dict[str, Callable[["ClassifierSpec", int], tuple[int, int]]] = {
    "timm": _timm_footprint,
    "open_clip_zeroshot": _open_clip_footprint,
    "torch_hub": _torch_hub_footprint,
    "torchscript": _torchscript_footprint,
}


def classify_images_per_forward(cfg: "BuildConfig") -> int:
    """Images in one classifier forward: a batch's rows times their images, at most ``PREDICT_CHUNK``."""
    from pipeline.models.classifiers import PREDICT_CHUNK

    per_row = max(1, len(cfg.benchmark.scales))
    return min(PREDICT_CHUNK, cfg.resources.classify.batch_size * per_row)


@functools.lru_cache(maxsize=512)
def _classifier_footprint(spec_json: str, images: int) -> Footprint:
    from pipeline import registry
    from pipeline.config import ClassifierSpec

    spec = ClassifierSpec.model_validate(json.loads(spec_json))
    sizer = CLASSIFIER_SIZERS.get(spec.kind)
    if sizer is None:
        try:
            sizer = getattr(registry.CLASSIFIERS.get(spec.kind), "footprint", None)
        except (KeyError, ImportError):
            sizer = None
    note = ""
    try:
        if sizer is None:
            raise LookupError(f"no size estimate for classifier kind {spec.kind!r}")
        params, activations = sizer(spec, images)
    except Exception as err:  # noqa: BLE001 - an unknown size must not stop a build
        params, activations, note = 0, 0, f"size unknown ({err})"
    weight = params * DTYPE_BYTES[CLASSIFIER_DTYPE]
    return Footprint(spec.name, params, weight, int(activations * ACTIVATION_FACTOR), note)


def classifier_footprint(spec: "ClassifierSpec", images: int) -> Footprint:
    """The projected memory of one classifier at ``images`` per forward (cached per spec)."""
    return _classifier_footprint(json.dumps(spec.model_dump(mode="json"), sort_keys=True), images)


def classifier_footprints(cfg: "BuildConfig") -> list[Footprint]:
    images = classify_images_per_forward(cfg)
    return [classifier_footprint(spec, images) for spec in cfg.classifiers]


# --------------------------------------------------------------------------- groups
def group_bytes(footprints: Sequence[Footprint]) -> int:
    """An actor running these models: the runtime, every model's weights, the largest activations
    (the models run one after the other)."""
    if not footprints:
        return RUNTIME_BYTES
    return RUNTIME_BYTES + sum(f.weight_bytes for f in footprints) + max(f.activation_bytes for f in footprints)


def pack(footprints: Sequence[Footprint], budget: int) -> list[list[int]]:
    """Indices of ``footprints`` in groups whose :func:`group_bytes` fits ``budget``: first fit,
    largest first.  A model too big for any budget gets a group of its own.  Groups are
    ordered by their first index and list their indices in order."""
    order = sorted(range(len(footprints)), key=lambda i: (-footprints[i].total, i))
    groups: list[list[int]] = []
    for i in order:
        for group in groups:
            if group_bytes([footprints[j] for j in group + [i]]) <= budget:
                group.append(i)
                break
        else:
            groups.append([i])
    return sorted(sorted(g) for g in groups)


def classifier_groups(cfg: "BuildConfig") -> list[list[int]]:
    """The classifier indices of each classify actor pool: one group when no budget is set."""
    n = len(cfg.classifiers)
    budget_gb = cfg.resources.classify.memory_budget_gb
    if budget_gb is None or n <= 1:
        return [list(range(n))]
    footprints = classifier_footprints(cfg)
    budget = int(budget_gb * GB)
    for f in footprints:
        if group_bytes([f]) > budget:
            log.warning(
                "classifier %s needs about %.1f GB, more than resources.classify.memory_budget_gb (%g): "
                "it runs alone", f.name, group_bytes([f]) / GB, budget_gb,
            )
    return pack(footprints, budget)
