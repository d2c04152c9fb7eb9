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
config's order; vlms apart, last); each group runs in its own classify actor pool
(:func:`pipeline.stages.classify.classify_specs`).  :func:`project_stage_memory` gives each
stage's actor (``cnsbench validate`` prints it).  A classifier's footprint is kept in
``$XDG_CACHE_HOME/cnsbench/footprints.json`` (default ``~/.cache``), keyed by its spec, the
batch and the model libraries' versions, so a large zoo is measured once per machine.
Each classifier kind states its own size (``footprint(spec, images)`` of its class,
:mod:`pipeline.models.footprint`); this module adds the runtime, the stage's precision and
the activation factor.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from pipeline.errors import CnsbenchError
from pipeline.io.files import write_text_atomic
from pipeline.models.footprint import (
    DTYPE_BYTES,
    ModelSize,
    dinov2_timm_arch,  # noqa: F401 - bench/classify_memory.py reads it here
    input_side,
    meta_forward_peak,
    open_clip_sizes,
    param_count,
    timm_meta,
)
from pipeline.perf.batches import AutoBatch, largest_fitting, stage_budget

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from pipeline.config import BuildConfig, ClassifierSpec
    from pipeline.perf.device import Device

log = logging.getLogger(__name__)

GB = 1024**3
# Python, torch and the model libraries of an actor (0.93 GB RSS measured on CPU); on a GPU,
# about the CUDA context and the allocator's cache (BENCHMARKS.md, "Classifier groups on a GPU:
# projected vs measured memory").
RUNTIME_BYTES = 1024**3
# The writer imports neither torch nor a model library and holds no GPU context: Python, Ray,
# pyarrow and PIL (209 MB peak RSS in the 768 px rehearsal, docs/rehearsal.md, "Measured"; 677-680 MB
# while it still imported torch).  It also holds one shard's rows and the tar made from them
# (``WRITER_SHARD_COPIES``), counted at the raw RGB size of each image, which PNG and JPEG do
# not exceed much.
WRITER_RUNTIME_BYTES = 200 * 1024**2
WRITER_SHARD_COPIES = 2
ACTIVATION_FACTOR = 2.0  # tensors alive around the largest module call (residual stream, allocator slack)
# The UNet and VAE keep more alive around their largest call (norms, skip connections): 2.5x
# is chosen to come near the H100 measurements (BENCHMARKS.md, "Model latencies on an H100: the
# latency model's calibration": 0.143 GiB per UNet sample, 1.34 GiB per decoded 768 px image
# in bf16; projected with it 0.124 and 1.41 GiB).
GENERATE_ACTIVATION_FACTOR = 2.5
# Footprints are measured in float32 and scaled to the stage's ``resources.<stage>.precision``
# (pipeline.models.precision: bfloat16 casts the weights, and autocast keeps most activations in it).
CLASSIFIER_DTYPE = "float32"


@dataclass(frozen=True)
class Footprint:
    """One model at one batch: parameters, weight bytes and peak activation bytes."""

    name: str
    params: int
    weight_bytes: int
    activation_bytes: int
    note: str = ""  # how the size was found when it is a guess (an unknown architecture)
    own_dtype: bool = False  # the model runs in its own dtypes (a vlm), not the stage's precision

    @property
    def total(self) -> int:
        return self.weight_bytes + self.activation_bytes


def classify_images_per_forward(cfg: "BuildConfig") -> int:
    """Images in one classifier forward: a batch's rows times their images, at most ``PREDICT_CHUNK``."""
    from pipeline.models.classifiers import PREDICT_CHUNK

    per_row = max(1, len(cfg.benchmark.scales))
    return min(PREDICT_CHUNK, stage_batch_size(cfg, "classify") * per_row)


def _cache_file() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "cnsbench", "footprints.json")


def _cache_key(spec_json: str, images: int) -> str:
    """The spec, the batch, the model libraries' versions and the local files the spec names."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version

    parts = [spec_json, str(images)]
    for lib in ("torch", "timm", "open_clip_torch"):
        try:
            parts.append(f"{lib}={version(lib)}")
        except PackageNotFoundError:
            parts.append(f"{lib}=-")
    spec = json.loads(spec_json)
    for key in ("checkpoint", "model_config_file"):
        path = spec.get(key)
        if path and os.path.isfile(path):
            st = os.stat(path)
            parts.append(f"{path}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _cached(key: str) -> Footprint | None:
    try:
        with open(_cache_file(), encoding="utf-8") as fh:
            entry = json.load(fh).get(key)
        return Footprint(**entry) if entry else None
    except (OSError, ValueError, TypeError):
        return None


def _remember(key: str, footprint: Footprint) -> None:
    """Keep a measured footprint for the next run (meta builds of a large zoo take a while)."""
    import dataclasses

    path = _cache_file()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            data = {}
        data[key] = dataclasses.asdict(footprint)
        write_text_atomic(path, json.dumps(data))
    except OSError as err:  # a read-only home: measure again next time
        log.debug("could not cache footprints in %s: %s", path, err)


@functools.lru_cache(maxsize=512)
def _classifier_footprint(spec_json: str, images: int) -> Footprint:
    key = _cache_key(spec_json, images)
    hit = _cached(key)
    if hit is not None:
        return hit
    footprint = _measure(spec_json, images)
    if not footprint.note:
        _remember(key, footprint)
    return footprint


def _measure(spec_json: str, images: int) -> Footprint:
    from pipeline import registry
    from pipeline.config import ClassifierSpec

    spec = ClassifierSpec.model_validate(json.loads(spec_json))
    try:
        size = _as_size(registry.CLASSIFIERS.get(spec.kind).footprint(spec, images))
    except Exception as err:  # noqa: BLE001 - an unknown size must not stop a build
        return Footprint(spec.name, 0, 0, 0, f"size unknown ({err})")
    weight = size.weight_bytes if size.own_dtype else size.params * DTYPE_BYTES[CLASSIFIER_DTYPE]
    return Footprint(spec.name, size.params, int(weight),
                     int(size.activation_bytes * ACTIVATION_FACTOR) + int(size.cache_bytes), own_dtype=size.own_dtype)


def _as_size(sized: ModelSize | Sequence[int]) -> ModelSize:
    """A kind's ``footprint`` answer as a :class:`ModelSize` (a plug-in may still give the
    older ``(parameters, activation bytes)`` pair)."""
    return sized if isinstance(sized, ModelSize) else ModelSize(int(sized[0]), int(sized[1]))


def classifier_footprint(spec: "ClassifierSpec", images: int) -> Footprint:
    """The projected memory of one classifier at ``images`` per forward (cached per spec)."""
    return _classifier_footprint(json.dumps(spec.model_dump(mode="json"), sort_keys=True), images)


def in_precision(footprint: Footprint, precision: str) -> Footprint:
    """A float32 footprint in a stage's ``precision``: weights and activations at its bytes per value
    (a model that runs in its own dtypes keeps its footprint)."""
    nbytes = DTYPE_BYTES[precision]
    ref = DTYPE_BYTES[CLASSIFIER_DTYPE]
    if nbytes == ref or footprint.own_dtype:
        return footprint
    return dataclasses.replace(
        footprint, weight_bytes=footprint.params * nbytes, activation_bytes=footprint.activation_bytes * nbytes // ref
    )


def classifier_footprints(cfg: "BuildConfig", images: int | None = None) -> list[Footprint]:
    """Each classifier's footprint at ``images`` per forward (default: the stage's batch), in the
    classify stage's precision (vlms keep their own dtype)."""
    images = classify_images_per_forward(cfg) if images is None else images
    precision = cfg.resources.classify.precision
    return [in_precision(classifier_footprint(spec, images), precision) for spec in cfg.classifiers]


# --------------------------------------------------------------------------- batch sizes
def stage_batch_size(cfg: "BuildConfig", stage: str) -> int:
    """Rows per call of ``stage``: ``resources.<stage>.batch_size``, ``auto`` resolved (:func:`auto_batch`)."""
    size = getattr(cfg.resources, stage).batch_size
    return auto_batch(cfg, stage).batch if size == "auto" else size


def auto_batch(cfg: "BuildConfig", stage: str) -> AutoBatch:
    """The largest batch of the filter or classify ``stage`` whose projected actor fits its budget
    (:mod:`pipeline.perf.batches`).  With classifier groups (``memory_budget_gb``) every
    classifier must fit alone at that batch, and the groups are packed at it."""
    budget, source = stage_budget(cfg, stage)
    per_row = max(1, len(cfg.benchmark.scales))
    if stage == "classify":
        from pipeline.models.classifiers import PREDICT_CHUNK

        chunk = PREDICT_CHUNK
        one = classifier_footprints(cfg, images=1)  # activations grow linearly with the images
        grouped = cfg.resources.classify.memory_budget_gb is not None and len(one) > 1

        def per(f: Footprint, images: int) -> Footprint:
            return dataclasses.replace(f, activation_bytes=f.activation_bytes * images)

        def need(batch: int) -> int:
            images = min(chunk, batch * per_row)
            if grouped:
                return max(group_bytes([per(f, images)]) for f in one)
            return group_bytes([per(f, images) for f in one])
    elif stage == "filter":
        from pipeline.models.detectors import MAX_FORWARD

        chunk = MAX_FORWARD

        def need(batch: int) -> int:
            return _filter_bytes(cfg, batch)
    else:
        raise CnsbenchError(f"batch_size auto: stage {stage!r} has no memory projection (filter, classify)")
    cap = max(1, chunk // per_row)
    best = largest_fitting(need, budget, cap)
    batch = max(1, best)
    whose = "its largest classifier alone; the groups are packed at this batch" if stage == "classify" and grouped else ""
    return AutoBatch(stage, batch, budget, source, need(batch), cap, chunk, fits=best >= 1, projected_of=whose)


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


@functools.lru_cache(maxsize=None)
def _warn_alone(name: str, needs_gb: float, budget_gb: float, source: str) -> None:
    """Once per process: a classifier larger than the budget."""
    log.warning("classifier %s needs about %.1f GB, more than the %.1f GB of %s: it runs alone",
                name, needs_gb, budget_gb, source)


def classifier_groups(cfg: "BuildConfig", device: "Device | None" = None) -> list[list[int]]:
    """The classifier indices of each classify actor pool: one group when no budget is set.

    The budget is :func:`pipeline.perf.device.classify_budget` (``memory_budget_gb``; ``auto``:
    the classify actor's share of ``device``, default the device found at run time).
    Classifiers that ask (vlms) draw their distractors from every ranking classifier's top-5,
    so they are packed apart and their groups run after all the others."""
    from pipeline.perf.device import classify_budget

    n = len(cfg.classifiers)
    found = classify_budget(cfg, device) if n > 1 else None
    if found is None:
        return [list(range(n))]
    budget, source = found
    footprints = classifier_footprints(cfg)
    for f in footprints:
        if group_bytes([f]) > budget:
            _warn_alone(f.name, round(group_bytes([f]) / GB, 1), round(budget / GB, 1), source)
    from pipeline.config.vqa import asks as answers

    asks = [answers(spec.kind) for spec in cfg.classifiers]
    groups = []
    for last in (False, True):
        members = [i for i in range(n) if asks[i] == last]
        groups += [[members[j] for j in g] for g in pack([footprints[i] for i in members], budget)]
    return groups


# --------------------------------------------------------------------------- stages
def _filter_bytes(cfg: "BuildConfig", batch: int | None = None) -> int:
    """The filter actor: open_clip CLIP and the timm DINOv2 backbone in the filter's precision,
    a forward of ``batch`` rows' images (default: the stage's batch) each."""
    from pipeline.models.detectors import MAX_FORWARD

    flt = cfg.filter
    if not flt.enabled or flt.kind == "none":
        return RUNTIME_BYTES
    batch = stage_batch_size(cfg, "filter") if batch is None else batch
    images = min(MAX_FORWARD, batch * max(1, len(cfg.benchmark.scales)))
    params, peak = _filter_model_sizes(flt.model_dump_json())
    nbytes = DTYPE_BYTES[cfg.resources.filter.precision]
    activations = peak * images * ACTIVATION_FACTOR * nbytes / DTYPE_BYTES[CLASSIFIER_DTYPE]
    return RUNTIME_BYTES + params * nbytes + int(activations)


@functools.lru_cache(maxsize=32)
def _filter_model_sizes(filter_json: str) -> tuple[int, int]:
    """(parameters of CLIP and DINOv2, the larger float32 peak of one image's forward)."""
    from pipeline.config import FilterSpec
    from pipeline.config.protocol import CNS_DINO

    flt = FilterSpec.model_validate_json(filter_json)
    clip_params, clip_peak = open_clip_sizes(flt.clip.model, flt.clip.model_config_file, "filter.clip")
    dino = timm_meta(flt.dino.model, {**flt.dino.model_kwargs, "num_classes": 0})
    side = input_side(flt.dino.preprocess, dino, CNS_DINO)
    dino_peak = meta_forward_peak(dino, (1, 3, side, side), call=dino.forward_features)
    return clip_params + param_count(dino), max(clip_peak, dino_peak)


def _classify_bytes(cfg: "BuildConfig") -> int:
    """The classify actor of the largest classifier group."""
    footprints = classifier_footprints(cfg)
    return max(group_bytes([footprints[i] for i in group]) for group in classifier_groups(cfg))


def diffusers_meta(model: str) -> dict[str, "torch.nn.Module"]:
    """The UNet, VAE and text encoder of a diffusers repository (local or in the hub cache), on ``meta``."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    import warnings

    local_only = os.path.isdir(model) or os.environ.get("HF_HUB_OFFLINE") == "1"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notes of the hub client, not the user's concern
        unet_cfg = UNet2DConditionModel.load_config(model, subfolder="unet", local_files_only=local_only)
        vae_cfg = AutoencoderKL.load_config(model, subfolder="vae", local_files_only=local_only)
        text_cfg = CLIPTextConfig.from_pretrained(model, subfolder="text_encoder", local_files_only=local_only)
    with torch.device("meta"):
        return {
            "unet": UNet2DConditionModel.from_config(unet_cfg).eval(),
            "vae": AutoencoderKL.from_config(vae_cfg).eval(),
            "text_encoder": CLIPTextModel(text_cfg).eval(),
        }


def _generate_bytes(cfg: "BuildConfig", dtype_bytes: int) -> int:
    """The generate actor: the text-to-image pipeline's weights at its dtype, and the larger of a
    UNet forward (a chunk of branches, doubled for classifier-free guidance) and a VAE decode."""
    import torch

    from pipeline.registry import FAMILIES

    gen = cfg.generator
    families = [FAMILIES.get(g.kind) for g in cfg.family_groups()]
    if not (any(f.generates_base for f in families) or cfg.source.kind == "seed"):
        return RUNTIME_BYTES
    parts = diffusers_meta(gen.model)
    unet, vae = parts["unet"], parts["vae"]
    nonzero = sum(1 for s in cfg.benchmark.scales if s != 0)
    shifts = max(len(g.shifts) for g in cfg.family_groups())
    batch = min(gen.branch_batch_size, 1 + shifts * nonzero)
    cfg_batch = batch * (2 if gen.guidance_scale > 1 else 1)
    side = gen.resolution // 8
    cross = unet.config.cross_attention_dim
    context = torch.zeros(1, 77, cross, device="meta")

    def unet_call(x: "torch.Tensor") -> Any:
        return unet(x, 1, encoder_hidden_states=context.expand(x.shape[0], -1, -1))

    unet_peak = meta_forward_peak(unet, (1, unet.config.in_channels, side, side), call=unet_call) * cfg_batch
    latent = vae.config.latent_channels
    vae_peak = meta_forward_peak(vae, (1, latent, side, side), call=lambda x: vae.decode(x)) * batch
    weights = sum(param_count(m) for m in parts.values()) * dtype_bytes
    return RUNTIME_BYTES + weights + int(max(unet_peak, vae_peak) * GENERATE_ACTIVATION_FACTOR * dtype_bytes / 4)


def _write_bytes(cfg: "BuildConfig") -> int:
    images = cfg.output.trajectories_per_shard * max(len(g.scales) for g in cfg.family_groups())
    side = cfg.generator.image_size
    return WRITER_RUNTIME_BYTES + WRITER_SHARD_COPIES * images * side * side * 3


def project_stage_memory(
    cfg: "BuildConfig", device: str = "cuda", stages: Sequence[str] = ("generate", "filter", "classify", "write")
) -> dict[str, int | None]:
    """Projected peak bytes of one actor of each of ``stages`` (``None``: not projectable here,
    e.g. a hub model whose configuration is not cached), at the config's dtype on ``device``
    (``cpu``: float32, as :func:`pipeline.stages.base.pick_dtype` runs there) and batch sizes.
    The classify entry is its largest group's actor."""
    dtype_bytes = 4 if device == "cpu" else DTYPE_BYTES[cfg.generator.dtype]
    out: dict[str, int | None] = {}
    for stage, project in (
        ("generate", lambda: _generate_bytes(cfg, dtype_bytes)),
        ("filter", lambda: _filter_bytes(cfg)),
        ("classify", lambda: _classify_bytes(cfg)),
        ("write", lambda: _write_bytes(cfg)),
    ):
        if stage not in stages:
            continue
        try:
            out[stage] = project()
        except Exception as err:  # noqa: BLE001 - a projection is advice; it never stops validate
            log.debug("no memory projection for %s: %s", stage, err)
            out[stage] = None
    return out


def actor_host_bytes(cfg: "BuildConfig", stage: str, members: list[int] | None = None) -> int | None:
    """Bytes one actor of ``stage`` (a classify group: the classifiers ``members``) is projected
    to hold in its host's memory: its projection on a CPU (weights and activations; on a GPU
    node an upper bound, its activations living on the GPU).  None: not projectable here."""
    if stage == "classify":
        feet = classifier_footprints(cfg)
        return group_bytes([feet[i] for i in (range(len(feet)) if members is None else members)])
    return project_stage_memory(cfg, "cpu", (stage,)).get(stage)
