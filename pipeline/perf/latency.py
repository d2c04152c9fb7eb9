"""The latency model: GPU-seconds of each stage's model work on a GPU of a kind.

A model's work is its FLOPs per image (``data/model_flops.json``, :mod:`pipeline.perf.flops`;
a model missing from the table is counted on the meta device when timm knows it) divided by
the GPU's peak dense BF16 throughput (``data/gpus.json``, with its datasheet) times the
fraction of that peak such work reaches (its utilisation, measured: ``data/gpus.json`` names
the runs).  Generation counts the UNet evaluations the build makes (:mod:`pipeline.perf.evals`).
This is the one latency model of the project: ``cnsbench estimate``, the rehearsal's GPU
projection and the scale simulation's stand-in stages all time model work with it.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Sequence

from pipeline.perf.data import load_data, utilisation
from pipeline.perf.evals import unit_evals
from pipeline.perf.flops import classifier_flops_model

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import BuildConfig

REFERENCE_GENERATOR = "stabilityai/stable-diffusion-2"


def model_gflop(model: str, model_kwargs: dict | None = None) -> float | None:
    """GFLOPs of one image through ``model`` (built with ``model_kwargs``): the table's figure,
    else counted on the meta device (:func:`pipeline.perf.flops.count_model`), else None (a
    model timm does not know, e.g. one defined by a local config file)."""
    entry = None if model_kwargs else load_data("model_flops.json")["models"].get(model)
    if entry is not None:
        return float(entry["gflop"])
    try:
        from pipeline.perf.flops import count_model

        return float(count_model(model, json.dumps(model_kwargs or {}, sort_keys=True))["gflop"])
    except Exception:  # noqa: BLE001 - a local checkpoint or an unknown name: no count
        return None


def _tabled(model: str) -> dict | None:
    gens = load_data("model_flops.json")["generators"]
    tail = model.rstrip("/").rsplit("/", 2)[-1] if "/" in model else model
    return gens.get(model) or gens.get(tail)


@functools.lru_cache(maxsize=16)
def _counted(model: str, resolution: int) -> dict | None:
    try:
        from pipeline.perf.flops import count_generator

        return count_generator(model, resolution)
    except Exception:  # noqa: BLE001 - its diffusers configs are not here (a hub id not cached)
        return None


def generator_flops(model: str, resolution: int = 768) -> dict:
    """The generator's FLOP entry: the table's, else counted on the meta device from its
    diffusers configs (a local directory, the hub cache), else SD2's (:func:`generator_source`)."""
    return _tabled(model) or _counted(model, resolution) or load_data("model_flops.json")["generators"][REFERENCE_GENERATOR]


def generator_source(model: str, resolution: int = 768) -> str:
    """``table``, ``counted`` (its configs, on the meta device) or ``sd2`` (counted as SD2)."""
    return "table" if _tabled(model) else "counted" if _counted(model, resolution) else "sd2"


def unet_utilisation(images_per_forward: int) -> float:
    """Utilisation of a UNet forward of ``images_per_forward`` images (piecewise linear, flat beyond)."""
    table = sorted((int(k), v) for k, v in utilisation()["unet_by_images_per_forward"].items())
    if images_per_forward <= table[0][0]:
        return table[0][1]
    for (n0, u0), (n1, u1) in zip(table, table[1:]):
        if images_per_forward <= n1:
            return u0 + (u1 - u0) * (images_per_forward - n0) / (n1 - n0)
    return table[-1][1]


def unit_seconds(cfg: "BuildConfig", spec: dict, n_shifts: int, scales: list[float], evals: dict | None = None,
                 hooked: bool = True) -> tuple[float, dict]:
    """GPU-seconds of one (class, seed) unit of ``n_shifts`` shifts on the GPU ``spec``, and
    its UNet evaluation counts: ``evals`` (a family's ``unet_cost``), by default the slider
    family's (:func:`pipeline.perf.evals.unet_evals_per_unit`); ``hooked``: the window's
    forwards carry slider hooks."""
    gen = cfg.generator
    peak = spec["bf16_tflops"] * 1e12
    gflop = generator_flops(gen.model, gen.resolution)
    px = (gen.resolution / gflop["resolution"]) ** 2
    e = evals if evals is not None else unit_evals(cfg, n_shifts, scales)
    per_step = 2 if gen.guidance_scale > 1.0 else 1
    per_sample = gflop["unet_gflop_per_sample"] * 1e9 * px / peak
    # The prefix runs one image per forward; the branches branch_batch_size per forward.
    prefix_evals = e["prefix_steps"] * per_step
    prefix_s = prefix_evals * per_sample / unet_utilisation(1)
    # The window's forwards carry the rows' sliders (per-row LoRA hooks): measured slower than
    # the bare UNet by ``slider_window_factor`` (pipeline/data/gpus.json).
    window_s = (e["evals"] - prefix_evals) * per_sample / unet_utilisation(min(gen.branch_batch_size, e["branches"]))
    window_s *= utilisation().get("slider_window_factor", 1.0) if hooked else 1.0
    decode_s = e["branches"] * gflop["vae_gflop_per_decode"] * 1e9 * px / (peak * utilisation()["vae_decode"])
    return prefix_s + window_s + decode_s, e


def stage_models(cfg: "BuildConfig", stage: str, members: Sequence[int] | None = None
                 ) -> list[tuple[str, str, dict]]:
    """(name, model, model_kwargs) of every model ``stage`` (``filter`` or ``classify``) runs on
    each image; ``members``: only these classifiers (a classify group)."""
    if stage == "filter":
        flt = cfg.filter
        if not flt.enabled or flt.kind == "none":
            return []
        return [("filter CLIP", flt.clip.model, {}), ("filter DINOv2", flt.dino.model, dict(flt.dino.model_kwargs))]
    specs = cfg.classifiers if members is None else [cfg.classifiers[i] for i in members]
    return [(c.name, *(classifier_flops_model(c) or (None, {}))) for c in specs]



def image_seconds(cfg: "BuildConfig", spec: dict, stage: str, members: Sequence[int] | None = None
                  ) -> tuple[float, float, list[str]]:
    """GPU-seconds per image of the ``filter`` or ``classify`` stage (``members``: one classify
    group) on ``spec``, its GFLOPs per image, and the models whose FLOPs are unknown (counted as 0)."""
    gflop, missing = 0.0, []
    for name, model, kwargs in stage_models(cfg, stage, members):
        g = model_gflop(model, kwargs) if model is not None else None
        if g is None:
            missing.append(name)
        gflop += g or 0.0
    util, _ = stage_utilisation(cfg, stage)
    return gflop * 1e9 / (spec["bf16_tflops"] * 1e12 * util), gflop, missing


def stage_utilisation(cfg: "BuildConfig", stage: str) -> tuple[float, str]:
    """The utilisation the ``filter`` or ``classify`` stage's time is projected at, and the
    precision it was measured at: the stage's own precision where ``data/gpus.json`` has a
    figure for it (``classifier_by_precision`` / ``filter_by_precision``), else float32's
    (conservative for tf32 and bfloat16, which run faster)."""
    util = utilisation()
    key = "filter" if stage == "filter" else "classifier"
    precision = getattr(cfg.resources, stage).precision
    measured = util.get(f"{key}_by_precision") or {}
    if precision in measured:
        return float(measured[precision]), precision
    return float(util[key]), "float32"


def grid_seconds_per_image(cfg: "BuildConfig", spec: dict) -> dict[str, dict[str, float]]:
    """Per stage, GPU-seconds and TFLOPs per image of ``cfg``'s own benchmark grid on ``spec``."""
    n_shifts, scales = len(cfg.benchmark.shifts), list(cfg.benchmark.scales)
    unit_s, e = unit_seconds(cfg, spec, n_shifts, scales)
    gflop = generator_flops(cfg.generator.model, cfg.generator.resolution)
    px = (cfg.generator.resolution / gflop["resolution"]) ** 2
    gen_tflop = (e["evals"] * gflop["unet_gflop_per_sample"] + e["branches"] * gflop["vae_gflop_per_decode"]) * px / 1e3
    out = {"generate": {"seconds": unit_s / e["images"], "tflop": gen_tflop / e["images"],
                        "unet_evals": e["evals"] / e["images"]}}
    for stage in ("filter", "classify"):
        seconds, g, _ = image_seconds(cfg, spec, stage)
        out[stage] = {"seconds": seconds, "tflop": g / 1e3}
    return out

