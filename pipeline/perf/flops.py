"""FLOPs of one image through each model a config names, counted on PyTorch's ``meta`` device.

Every model is built on ``meta`` (shapes only: no weights, no memory, no download) and one
forward at the input size a build feeds it runs under ``torch.utils.flop_counter``
(a multiply-add counts 2 FLOPs).  Classifiers and the filter's models are counted through
their timm twin (:data:`TIMM_TWINS`: torch-hub DINOv2 entries and open_clip image towers
have one); a text-to-image generator through its diffusers UNet and VAE configs, found as
``from_pretrained`` finds them (a local directory or the hub cache).

The table ``pipeline/data/model_flops.json`` is what :mod:`pipeline.perf.latency` reads;
this module regenerates it::

    python -m pipeline.perf.flops --write                       # the models of configs/cns_bench.yaml
    python -m pipeline.perf.flops --write configs/a.yaml configs/b.yaml

A generator whose configs cannot be found here keeps its recorded entry (the command says so).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from typing import Any, Callable

from pipeline.perf.data import DATA, emit

TABLE = DATA / "model_flops.json"
DEFAULT_CONFIGS = ("configs/cns_bench.yaml",)

# How the FLOPs of a config's model are counted: the same architecture in timm, at the
# input size the build feeds it (torch hub DINOv2 and open_clip towers have timm twins).
TIMM_TWINS = {
    "facebookresearch/dinov2:dinov2_vits14_lc": ("vit_small_patch14_dinov2", 224),
    "facebookresearch/dinov2:dinov2_vits14_reg_lc": ("vit_small_patch14_reg4_dinov2", 224),
    "facebookresearch/dinov2:dinov2_vitb14_lc": ("vit_base_patch14_dinov2", 224),
    "facebookresearch/dinov2:dinov2_vitb14_reg_lc": ("vit_base_patch14_reg4_dinov2", 224),
    "facebookresearch/dinov2:dinov2_vitl14_lc": ("vit_large_patch14_dinov2", 224),
    "facebookresearch/dinov2:dinov2_vitl14_reg_lc": ("vit_large_patch14_reg4_dinov2", 224),
    "facebookresearch/dinov2:dinov2_vitg14_lc": ("vit_giant_patch14_dinov2", 224),
    "facebookresearch/dinov2:dinov2_vitg14_reg_lc": ("vit_giant_patch14_reg4_dinov2", 224),
    "RN50": ("resnet50_clip.openai", 224),
    "RN101": ("resnet101_clip.openai", 224),
    "ViT-B-32": ("vit_base_patch32_clip_224.openai", 224),
    "ViT-B-16": ("vit_base_patch16_clip_224.openai", 224),
    "ViT-L-14": ("vit_large_patch14_clip_224.openai", 224),
    "ViT-L-14-336": ("vit_large_patch14_clip_336.openai", 336),
    "vit_large_patch14_reg4_dinov2.lvd142m": ("vit_large_patch14_reg4_dinov2", 518),
}


def count(fn: Callable[[], Any]) -> int:
    """FLOPs of ``fn()`` (``torch.utils.flop_counter``: a multiply-add is 2)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


@functools.lru_cache(maxsize=None)
def count_model(model: str, model_kwargs: str = "{}") -> dict[str, Any]:
    """GFLOPs and parameters of one image through ``model`` (a timm name or a :data:`TIMM_TWINS` key),
    built with ``model_kwargs`` (JSON: a config's ``model_kwargs``, e.g. a narrowed architecture).

    Raises whatever timm raises for a name it does not know."""
    import timm
    import torch

    arch, size = TIMM_TWINS.get(model, (model, None))
    kwargs = {"img_size": size} if size and "dinov2" in arch else {}
    kwargs.update(json.loads(model_kwargs))
    with torch.device("meta"):
        net = timm.create_model(arch, pretrained=False, **kwargs).eval()
    shape = (3, size, size) if size else tuple(net.pretrained_cfg.get("input_size", (3, 224, 224)))
    flops = count(lambda: net(torch.empty(1, *shape, device="meta")))
    return {
        "gflop": round(flops / 1e9, 3),
        "params_m": round(sum(p.numel() for p in net.parameters()) / 1e6, 3),
        "input": shape[-1],
        "counted_as": arch,
    }


def unet_flops(unet_config: dict[str, Any], resolution: int) -> int:
    """One UNet sample-evaluation (batch 1) at ``resolution`` px of a diffusers UNet config."""
    import torch
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        unet = UNet2DConditionModel(**unet_config).eval()
        side = resolution // 8
        x = torch.empty(1, unet_config["in_channels"], side, side)
        ctx = torch.empty(1, 77, unet_config["cross_attention_dim"])
        t = torch.tensor([500])
    return count(lambda: unet(x, t, encoder_hidden_states=ctx))


def vae_decode_flops(vae_config: dict[str, Any], resolution: int) -> int:
    """One VAE decode of a ``resolution`` px image of a diffusers VAE config."""
    import torch
    from diffusers import AutoencoderKL

    with torch.device("meta"):
        vae = AutoencoderKL(**vae_config).eval()
        z = torch.empty(1, vae_config["latent_channels"], resolution // 8, resolution // 8)
    return count(lambda: vae.decode(z))


def timm_flops(name: str, size: int | None = None, **kwargs: Any) -> int:
    """One image through the timm model ``name`` at ``size`` px (default: its own input size)."""
    import timm
    import torch

    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, **kwargs).eval()
        side = size or model.pretrained_cfg.get("input_size", (3, 224, 224))[-1]
        x = torch.empty(1, 3, side, side)
    return count(lambda: model(x))


def open_clip_image_flops(name: str, size: int | None = None) -> int:
    """One image through the image tower of the open_clip model ``name``."""
    import open_clip
    import torch

    model = open_clip.create_model(name, pretrained=None, device="meta").eval()
    side = size or model.visual.image_size
    side = side[0] if isinstance(side, (tuple, list)) else side
    with torch.device("meta"):
        x = torch.empty(1, 3, side, side)
    return count(lambda: model.encode_image(x))


def count_generator(model: str, resolution: int) -> dict[str, Any]:
    """GFLOPs of one UNet sample-evaluation and one VAE decode of the diffusers model ``model``
    at ``resolution`` px, and its components' parameters (millions)."""
    import torch

    from pipeline.perf.memory import diffusers_meta

    parts = diffusers_meta(model)
    unet, vae = parts["unet"], parts["vae"]
    side = resolution // 8
    with torch.device("meta"):
        x = torch.empty(1, unet.config.in_channels, side, side)
        context = torch.empty(1, 77, unet.config.cross_attention_dim)
        z = torch.empty(1, vae.config.latent_channels, side, side)
        t = torch.tensor([500])
    unet_flops = count(lambda: unet(x, t, encoder_hidden_states=context))
    decode_flops = count(lambda: vae.decode(z))

    def params(m) -> float:
        return round(sum(p.numel() for p in m.parameters()) / 1e6, 3)

    return {
        "unet_params_m": params(unet),
        "text_encoder_params_m": params(parts["text_encoder"]),
        "vae_params_m": params(vae),
        "unet_gflop_per_sample": round(unet_flops / 1e9, 3),
        "vae_gflop_per_decode": round(decode_flops / 1e9, 3),
        "resolution": resolution,
        "counted_as": f"the diffusers configs of {model} (unet/, vae/, text_encoder/) on the meta device",
    }


def classifier_flops_model(spec: Any) -> tuple[str, dict] | None:
    """(model, model_kwargs) whose FLOPs per image are the classifier's, as its kind states
    (``flops_model``, :mod:`pipeline.models.classifier_kind`); None: unknown."""
    from pipeline.registry import CLASSIFIERS

    if spec.kind not in CLASSIFIERS.keys():
        return None
    return CLASSIFIERS.get(spec.kind).flops_model(spec)


def config_models(cfg) -> list[str]:
    """Every classifier and filter model ``cfg`` names, in order, once."""
    models = [twin[0] for twin in map(classifier_flops_model, cfg.classifiers) if twin is not None]
    if cfg.filter.enabled:
        models += [cfg.filter.clip.model, cfg.filter.dino.model]
    return list(dict.fromkeys(models))


def table(configs: list[str], recorded: dict[str, Any], echo: Callable[[str], None]) -> dict[str, Any]:
    """The FLOP table of ``configs``' models and generators; entries of ``recorded`` are kept
    for the models of other configs and for generators whose configs are not found here."""
    from pipeline.config import load_config

    models = dict(recorded.get("models", {}))
    generators = dict(recorded.get("generators", {}))
    for path in configs:
        cfg = load_config(path)
        for model in config_models(cfg):
            try:
                models[model] = count_model(model)
            except Exception as err:  # noqa: BLE001 - a model timm cannot build has no twin here
                echo(f"{path}: {model}: not counted ({err}); {'kept' if model in models else 'left out'}")
        gen = cfg.generator
        try:
            generators[gen.model] = count_generator(gen.model, gen.resolution)
        except Exception as err:  # noqa: BLE001 - the generator's configs are not cached here
            echo(f"{path}: generator {gen.model}: configs not found ({err}); "
                 f"{'recorded entry kept' if gen.model in generators else 'left out'}")
    return {
        "note": "Per-image forward GFLOPs (torch.utils.flop_counter, multiply-add = 2 FLOPs) and parameters of the "
                "models configs name, at the input size a build feeds them, counted on the meta device from each "
                "model's timm twin (counted_as) by `python -m pipeline.perf.flops --write`. Generators: GFLOPs of one "
                "UNet sample-evaluation and one VAE decode at `resolution`.",
        "generators": generators,
        "models": models,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.perf.flops", description=__doc__.splitlines()[0])
    p.add_argument("configs", nargs="*", default=list(DEFAULT_CONFIGS))
    p.add_argument("--write", action="store_true", help=f"write {TABLE.relative_to(DATA.parents[1])} (else print it)")
    args = p.parse_args(argv)
    recorded = json.loads(TABLE.read_text()) if TABLE.is_file() else {}
    result = table(args.configs, recorded, lambda line: print(line, file=sys.stderr))
    return emit(TABLE, result, args.write)


if __name__ == "__main__":
    sys.exit(main())
