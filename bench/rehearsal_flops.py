"""Projected GPU seconds per image from FLOPs, counted on PyTorch's ``meta`` device.

Every model is built on ``meta`` (no weights, no memory) and one forward at the build's
shapes runs under ``torch.utils.flop_counter.FlopCounterMode``; a GPU second is
``flops / (peak * utilisation)``.  Per image of the paper's protocol:

* generate: ``unet_evals_per_image`` UNet sample-evaluations (a CFG step on one image
  counts 2; the build reports its measured figure) + one VAE decode + the prompt encodings
  (once per class, left out);
* filter: one CLIP image forward and one DINOv2 forward;
* classify: one forward of every classifier.
"""

from __future__ import annotations

from typing import Any, Callable

H100_BF16_DENSE = 989e12  # FLOP/s, NVIDIA H100 SXM, dense bfloat16 tensor cores
UTILISATION = 0.4  # a stated assumption: 40 % of peak in large convolutions/attention


def count(fn: Callable[[], Any]) -> int:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def unet_flops(unet_config: dict[str, Any], resolution: int) -> int:
    """One UNet sample-evaluation (batch 1) at ``resolution`` px."""
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
    import torch
    from diffusers import AutoencoderKL

    with torch.device("meta"):
        vae = AutoencoderKL(**vae_config).eval()
        z = torch.empty(1, vae_config["latent_channels"], resolution // 8, resolution // 8)
    return count(lambda: vae.decode(z))


def timm_flops(name: str, size: int | None = None, **kwargs: Any) -> int:
    import timm
    import torch

    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, **kwargs).eval()
        side = size or model.pretrained_cfg.get("input_size", (3, 224, 224))[-1]
        x = torch.empty(1, 3, side, side)
    return count(lambda: model(x))


def open_clip_image_flops(name: str, size: int | None = None) -> int:
    import open_clip
    import torch

    model = open_clip.create_model(name, pretrained=None, device="meta").eval()
    side = size or model.visual.image_size
    side = side[0] if isinstance(side, (tuple, list)) else side
    with torch.device("meta"):
        x = torch.empty(1, 3, side, side)
    return count(lambda: model.encode_image(x))


def projection(cfg, unet_config: dict[str, Any], vae_config: dict[str, Any], unet_evals_per_image: float,
               classifiers: list[Any]) -> dict[str, Any]:
    """Per stage: TFLOP per image and projected seconds per image on an H100 at :data:`UTILISATION`."""
    res = cfg.generator.resolution
    unet = unet_flops(unet_config, res)
    gen = unet * unet_evals_per_image + vae_decode_flops(vae_config, res)
    flt = cfg.filter
    filt = open_clip_image_flops(flt.clip.model) + timm_flops(flt.dino.model, 518, num_classes=0)
    clf = 0
    for spec in classifiers:
        if spec.kind == "timm":
            clf += timm_flops(spec.model)
        elif spec.kind == "open_clip_zeroshot":
            clf += open_clip_image_flops(spec.model)
    rate = H100_BF16_DENSE * UTILISATION

    def row(flops: float) -> dict[str, float]:
        return {"tflop_per_image": round(flops / 1e12, 3), "gpu_seconds_per_image": round(flops / rate, 4)}

    return {
        "assumption": f"H100 bf16 dense peak {H100_BF16_DENSE / 1e12:.0f} TFLOP/s at {UTILISATION:.0%} utilisation",
        "unet_tflop_per_eval": round(unet / 1e12, 3),
        "unet_evals_per_image": unet_evals_per_image,
        "generate": row(gen), "filter": row(filt), "classify": row(clf),
    }
