"""What a build costs on GPUs: images, UNet evaluations, GPU-seconds per stage, wall time, money.

A latency model, not a measurement: every model's work is its FLOPs (``data/model_flops.json``,
counted per image at the input size a build feeds it) divided by the GPU's peak dense BF16
throughput (``data/gpus.json``, with sources) times the fraction of that peak such work
reaches (its utilisation, measured on an H100 by ``bench/latency.py``).  Generation counts
the UNet evaluations the build really makes (:func:`unet_evals_per_unit`): the steps before
the LoRA window and the scale-0 image are computed once per (class, seed) and shared by
every shift and scale (``pipeline.models.sampler.SliderSampler.generate_group``).

Wall time on N GPUs divides the GPU-seconds by N and by the pipeline's efficiency at N
GPUs, as projected from the pool layout and the CPU costs measured on a simulated cluster
(``data/scale_efficiency.json``; docs/scale.md, "Projection (`projected_efficiency`,
`pipeline/data/scale_efficiency.json`)"): a projection, not a measured efficiency.
The same latency model times the stand-in stages of that simulation (``bench/standins.py``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import BuildConfig

DATA = Path(__file__).resolve().parents[1] / "data"
TRAIN_TIMESTEPS = 1000  # SD2's DDIM scheduler: 1,000 training steps, "leading" spacing, offset 1
STEPS_OFFSET = 1
GENERATING_FAMILIES = ("slider",)  # families whose UNet work the model counts
BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
HEADROOM_GIB = 2.0  # CUDA context, allocator slack and the images in flight


@lru_cache(maxsize=None)
def _load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def gpu_table() -> dict[str, dict]:
    return _load("gpus.json")["gpus"]


def utilisation() -> dict:
    return _load("gpus.json")["utilisation"]


def gpu_spec(name: str) -> dict:
    """The GPU called ``name`` (case-insensitive); ValueError listing the known ones."""
    table = gpu_table()
    key = name.lower()
    if key not in table:
        raise ValueError(f"--gpu {name!r}: unknown GPU; known: {', '.join(sorted(table))} (pipeline/data/gpus.json)")
    return {"key": key, **table[key]}


def model_flops(model: str) -> dict | None:
    return _load("model_flops.json")["models"].get(model)


def generator_flops(model: str) -> dict | None:
    gens = _load("model_flops.json")["generators"]
    return gens.get(model) or gens.get(model.rstrip("/").rsplit("/", 2)[-1] if "/" in model else model)


def ddim_timesteps(steps: int) -> list[int]:
    """The timesteps of SD2's DDIM scheduler for ``steps`` steps (981, 961, ..., 1 for 50)."""
    ratio = TRAIN_TIMESTEPS // steps
    return [i * ratio + STEPS_OFFSET for i in reversed(range(steps))]


def unet_evals_per_unit(steps: int, threshold: int, n_shifts: int, scales: list[float], cfg_scale: float) -> dict:
    """UNet sample-evaluations of one (class, seed) unit as the build makes them.

    The steps before the window run once; the scale-0 image and every (shift, non-zero
    scale) branch run the window's steps.  A classifier-free-guidance step counts 2."""
    timesteps = ddim_timesteps(steps)
    prefix = sum(1 for t in timesteps if t > threshold)
    window = steps - prefix
    branches = 1 + n_shifts * sum(1 for s in scales if s != 0)
    per_step = 2 if cfg_scale > 1.0 else 1
    images = n_shifts * len(scales)
    return {
        "prefix_steps": prefix,
        "window_steps": window,
        "branches": branches,
        "evals": per_step * (prefix + branches * window),
        "evals_unshared": per_step * steps * images,
        "images": images,
    }


def unet_utilisation(images_per_forward: int) -> float:
    """Utilisation of a UNet forward of ``images_per_forward`` images (piecewise linear, flat beyond)."""
    table = sorted((int(k), v) for k, v in utilisation()["unet_by_images_per_forward"].items())
    if images_per_forward <= table[0][0]:
        return table[0][1]
    for (n0, u0), (n1, u1) in zip(table, table[1:]):
        if images_per_forward <= n1:
            return u0 + (u1 - u0) * (images_per_forward - n0) / (n1 - n0)
    return table[-1][1]


@dataclass
class StageCost:
    name: str
    gpu_seconds: float
    detail: str
    per_item_seconds: float = 0.0  # one unit (generate) or one image (filter, classify)


@dataclass
class Estimate:
    gpu: dict
    n_gpus: int
    images: int
    units: int
    unet_evals: int
    unet_evals_unshared: int
    stages: list[StageCost]
    efficiency: float
    efficiency_source: str
    generate_memory_gib: float
    memory_detail: str
    price_per_hour: float | None = None
    assumptions: list[str] = field(default_factory=list)

    @property
    def gpu_seconds(self) -> float:
        return sum(s.gpu_seconds for s in self.stages)

    @property
    def wall_seconds(self) -> float:
        return self.gpu_seconds / (self.n_gpus * self.efficiency)

    @property
    def cost(self) -> float | None:
        if self.price_per_hour is None:
            return None
        return self.wall_seconds / 3600 * self.n_gpus * self.price_per_hour

    def lines(self) -> list[str]:
        g = self.gpu
        out = [
            f"GPU: {g['name']} ({g['bf16_tflops']:g} dense BF16 TFLOP/s, {g['memory_gib']:g} GiB) x {self.n_gpus}",
            f"images: {self.images:,} in {self.units:,} generation units (class, seed)",
            f"UNet evaluations: {self.unet_evals:,} ({self.unet_evals / max(1, self.images):.1f} per image; "
            f"{self.unet_evals_unshared:,} without sharing the pre-window steps and scale 0)",
            f"generate actor memory: {self.generate_memory_gib:.1f} GiB of {g['memory_gib']:g} ({self.memory_detail})",
            "GPU time per stage:",
        ]
        for s in self.stages:
            out.append(f"  {s.name:<9} {s.gpu_seconds / 3600:10.2f} GPU-hours  ({s.detail})")
        out.append(f"  {'total':<9} {self.gpu_seconds / 3600:10.2f} GPU-hours")
        out.append(
            f"wall time on {self.n_gpus} GPUs: {self.wall_seconds / 3600:.2f} h "
            f"(pipeline efficiency {self.efficiency:.2f}, {self.efficiency_source})"
        )
        if self.cost is not None:
            out.append(f"cost: {self.cost:,.2f} at {self.price_per_hour:g} per GPU-hour ({self.n_gpus} GPUs for the wall time)")
        out.append("assumptions:")
        out.extend(f"  - {a}" for a in self.assumptions)
        return out


def efficiency_at(n_gpus: int) -> tuple[float, str]:
    """The pipeline's efficiency at ``n_gpus``, interpolated in log(GPUs) between the
    projections of ``data/scale_efficiency.json`` (``bench/scale.py``: the pool layout, capped by
    the CPU costs measured on a simulated cluster)."""
    if not (DATA / "scale_efficiency.json").is_file():
        return 1.0, "no efficiency projection (pipeline/data/scale_efficiency.json): 1.0 assumed"
    data = _load("scale_efficiency.json")
    points = sorted((int(k), float(v)) for k, v in data["efficiency"].items())
    if n_gpus < points[0][0]:
        return points[0][1], data["source"] + f"; below {points[0][0]} GPUs its {points[0][0]}-GPU value"
    if n_gpus == points[0][0]:
        return points[0][1], data["source"]
    for (n0, e0), (n1, e1) in zip(points, points[1:]):
        if n_gpus <= n1:
            w = (math.log(n_gpus) - math.log(n0)) / (math.log(n1) - math.log(n0))
            return e0 + w * (e1 - e0), data["source"]
    return points[-1][1], data["source"] + f"; beyond {points[-1][0]} GPUs the last value is kept"


def generate_memory(cfg: "BuildConfig") -> tuple[float, str]:
    """GiB a generate actor holds: the SD2 weights at the configured dtype, plus the larger of
    one branch batch's UNet forward (with CFG) and its VAE decode, at the resolution.

    Activation figures are peaks measured in bf16 at 768 px on an H100 (``data/gpus.json``),
    scaled by the pixels."""
    gen = cfg.generator
    flops = generator_flops(gen.model) or generator_flops("stabilityai/stable-diffusion-2")
    params = (flops["unet_params_m"] + flops["text_encoder_params_m"] + flops["vae_params_m"]) * 1e6
    weights = params * BYTES.get(gen.dtype, 2) / 2**30
    util = utilisation()
    px = (gen.resolution / flops["resolution"]) ** 2
    samples = (2 if gen.guidance_scale > 1.0 else 1) * gen.branch_batch_size
    unet = util["unet_activation_gib_per_sample"] * samples * px
    decode = util["vae_decode_activation_gib_per_image"] * gen.branch_batch_size * px
    total = weights + max(unet, decode) + HEADROOM_GIB
    return total, (
        f"weights {weights:.1f} GiB ({params / 1e9:.2f} B parameters), activations {max(unet, decode):.1f} GiB "
        f"(UNet forward of {samples} samples {unet:.1f}, VAE decode of {gen.branch_batch_size} images {decode:.1f}, "
        f"at {gen.resolution} px), {HEADROOM_GIB:g} GiB headroom"
    )


def unit_seconds(cfg: "BuildConfig", spec: dict, n_shifts: int, scales: list[float]) -> tuple[float, dict]:
    """GPU-seconds of one (class, seed) unit of ``n_shifts`` slider shifts on the GPU ``spec``,
    and its UNet evaluation counts (:func:`unet_evals_per_unit`)."""
    gen = cfg.generator
    peak = spec["bf16_tflops"] * 1e12
    gflop = generator_flops(gen.model) or generator_flops("stabilityai/stable-diffusion-2")
    px = (gen.resolution / gflop["resolution"]) ** 2
    e = unet_evals_per_unit(gen.steps, gen.lora_timestep_threshold, n_shifts, scales, gen.guidance_scale)
    per_step = 2 if gen.guidance_scale > 1.0 else 1
    per_sample = gflop["unet_gflop_per_sample"] * 1e9 * px / peak
    # The prefix runs one image per forward; the branches branch_batch_size per forward.
    prefix_evals = e["prefix_steps"] * per_step
    prefix_s = prefix_evals * per_sample / unet_utilisation(1)
    # The window's forwards carry the rows' sliders (per-row LoRA hooks): measured slower than
    # the bare UNet by ``slider_window_factor`` (pipeline/data/gpus.json).
    window_s = (e["evals"] - prefix_evals) * per_sample / unet_utilisation(min(gen.branch_batch_size, e["branches"]))
    window_s *= utilisation().get("slider_window_factor", 1.0)
    decode_s = e["branches"] * gflop["vae_gflop_per_decode"] * 1e9 * px / (peak * utilisation()["vae_decode"])
    return prefix_s + window_s + decode_s, e


def image_seconds(cfg: "BuildConfig", spec: dict, stage: str) -> tuple[float, float, list[str]]:
    """GPU-seconds per image of the ``filter`` or ``classify`` stage on ``spec``, its GFLOPs per
    image, and the models missing from the FLOP table (counted as 0)."""
    if stage == "filter":
        models = [cfg.filter.clip.model, cfg.filter.dino.model] if cfg.filter.enabled else []
        names = models
    else:
        models = [c.model for c in cfg.classifiers]
        names = [c.name for c in cfg.classifiers]
    gflop, missing = 0.0, []
    for model, name in zip(models, names):
        f = model_flops(model)
        if f is None:
            missing.append(name)
        gflop += f["gflop"] if f else 0.0
    seconds = gflop * 1e9 / (spec["bf16_tflops"] * 1e12 * utilisation()[stage if stage == "filter" else "classifier"])
    return seconds, gflop, missing


def estimate(cfg: "BuildConfig", gpu: str, n_gpus: int, price_per_hour: float | None = None) -> Estimate:
    """The cost of building ``cfg`` on ``n_gpus`` GPUs of kind ``gpu`` (see the module doc)."""
    from pipeline import plan
    if n_gpus < 1:
        raise ValueError(f"--gpus must be at least 1, got {n_gpus}")
    spec = gpu_spec(gpu)
    util = utilisation()
    summary = plan.summarize(cfg)
    gen = cfg.generator
    assumptions = [
        f"peak dense BF16 throughput from {spec['source']}",
        f"utilisation of that peak measured on an H100 ({util['source']}) and assumed on this GPU: "
        f"UNet {unet_utilisation(1):.3f} (1 image per forward) to {unet_utilisation(gen.branch_batch_size):.3f} "
        f"({gen.branch_batch_size} per forward), VAE decode {util['vae_decode']:.3f}, window steps with the rows' "
        f"sliders {util.get('slider_window_factor', 1.0):g}x the bare UNet (fitted to one H200 run of the sampler), "
        f"classifiers {util['classifier']:.3f}, filter {util['filter']:.3f} (float32, as those stages run; "
        f"measured on an H200 by bench/rehearsal_gpu.py)",
        "model FLOPs per image from pipeline/data/model_flops.json (torch.utils.flop_counter on each model's timm twin); "
        "UNet and VAE FLOPs scale with the latent pixels",
    ]
    if generator_flops(gen.model) is None:
        assumptions.append(f"generator {gen.model!r} not in the FLOP table: counted as Stable Diffusion 2")
    units, evals, unshared, decodes, gen_s = 0, 0, 0, 0, 0.0
    for group in cfg.family_groups():
        if group.kind not in GENERATING_FAMILIES:
            assumptions.append(f"family {group.kind} ({len(group.shifts)} shifts) runs no UNet: its GPU time is not counted")
            continue
        n = summary.n_classes * summary.n_seeds
        units = max(units, n)
        seconds, e = unit_seconds(cfg, spec, len(group.shifts), list(group.scales))
        gen_s += n * seconds
        evals += n * e["evals"]
        unshared += n * e["evals_unshared"]
        decodes += n * e["branches"]
    images = summary.n_images
    filter_per_image, filter_g, missing = image_seconds(cfg, spec, "filter")
    assumptions += [f"filter model {m!r} not in the FLOP table: counted as 0" for m in missing]
    clf_per_image, clf_g, missing = image_seconds(cfg, spec, "classify")
    if missing:
        assumptions.append(f"classifiers not in the FLOP table, counted as 0: {', '.join(missing)}")
    per_unit = gen_s / units if units else 0.0
    stages = [
        StageCost("generate", gen_s, f"{evals:,} UNet evaluations, {decodes:,} VAE decodes", per_unit),
        StageCost("filter", images * filter_per_image, f"{filter_g:,.0f} GFLOP per image", filter_per_image),
        StageCost("classify", images * clf_per_image, f"{len(cfg.classifiers)} classifiers, {clf_g:,.0f} GFLOP per image", clf_per_image),
    ]
    eff, source = efficiency_at(n_gpus)
    assumptions.append(f"wall time = GPU time / (GPUs x pipeline efficiency); efficiency {eff:.2f} at {n_gpus} GPUs from {source}")
    memory, memory_detail = generate_memory(cfg)
    return Estimate(
        gpu=spec,
        n_gpus=n_gpus,
        images=images,
        units=units,
        unet_evals=evals,
        unet_evals_unshared=unshared,
        stages=stages,
        efficiency=eff,
        efficiency_source=source,
        generate_memory_gib=memory,
        memory_detail=memory_detail,
        price_per_hour=price_per_hour,
        assumptions=assumptions,
    )
