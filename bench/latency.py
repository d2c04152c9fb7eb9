"""Model latencies that calibrate the stand-in stages of ``bench/scale.py``: the SD2 UNet's
seconds per evaluation (random weights, the real architecture, classifier-free guidance
batch of 2 per image), the VAE decode per image, and a few timm classifiers' seconds per
image at their real size, each with its FLOPs (counted by ``torch.utils.flop_counter``)
and the achieved TFLOP/s.

    python bench/latency.py --json                         # on a GPU: full SD2 at 768 px
    python bench/latency.py --json --size tiny --device cpu --models resnet18 --iters 1

FLOPs are counted by :mod:`pipeline.perf.flops` (``python -m pipeline.perf.flops --write`` writes
the table the latency model reads); the UNet and VAE utilisations measured here go into
``pipeline/data/gpus.json`` with ``python -m pipeline.perf.gpus --gpu h100 --latency FILE --write``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_MODELS = [
    "resnet50",
    "vit_base_patch16_224",
    "convnext_large",
    "deit3_huge_patch14_224",
    "vit_base_patch16_clip_224",
    "vit_large_patch14_reg4_dinov2",
]


def _timed(fn, device: str, iters: int, warmup: int = 2) -> float:
    """Mean seconds per call of ``fn`` after ``warmup`` calls."""
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters


def _flops(fn) -> float:
    from pipeline.perf.flops import count

    return float(count(fn))


def unet_latency(size: str, resolution: int, dtype_name: str, device: str, iters: int, images: list[int]) -> dict:
    """Seconds per UNet evaluation on a CFG batch of 2 and per VAE decode of one image."""
    import torch
    from diffusers import UNet2DConditionModel

    from pipeline.demo.tiny_sd import ARCH, sd_vae

    arch = ARCH[size]
    dtype = getattr(torch, dtype_name)
    unet = UNet2DConditionModel(in_channels=4, out_channels=4, **arch["unet"]).to(device, dtype).eval()
    vae = sd_vae(arch["vae"]).to(device, dtype).eval()
    lat = resolution // 8 if size == "full" else arch["unet"]["sample_size"]
    x = torch.randn(2, 4, lat, lat, device=device, dtype=dtype)
    ctx = torch.randn(2, 77, arch["unet"]["cross_attention_dim"], device=device, dtype=dtype)
    t = torch.tensor([500, 500], device=device)
    z = torch.randn(1, 4, lat, lat, device=device, dtype=dtype)

    @torch.inference_mode()
    def step():
        unet(x, t, encoder_hidden_states=ctx)

    @torch.inference_mode()
    def decode():
        vae.decode(z)

    n_params = sum(p.numel() for p in unet.parameters())
    per_image = {}
    for n in images:
        xb, cb, tb = x[:1].repeat(2 * n, 1, 1, 1), ctx[:1].repeat(2 * n, 1, 1), t[:1].repeat(2 * n)
        with torch.inference_mode():
            per_image[n] = _timed(lambda: unet(xb, tb, encoder_hidden_states=cb), device, max(1, iters // 2)) / n
    s_eval = _timed(step, device, iters)
    memory = {}
    if device.startswith("cuda"):
        # Peak memory beyond the weights: one CFG forward of the largest batch, one decode.
        for what, fn in (("unet", lambda: unet(xb, tb, encoder_hidden_states=cb)), ("vae_decode", decode)):
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            with torch.inference_mode():
                fn()
            torch.cuda.synchronize()
            memory[what] = (torch.cuda.max_memory_allocated() - base) / 2**30
        memory["unet_gib_per_sample"] = memory["unet"] / xb.shape[0]
        memory["weights_gib"] = base / 2**30
    s_decode = _timed(decode, device, max(1, iters // 4), warmup=1)
    f_eval, f_decode = _flops(step), _flops(decode)
    return {
        "size": size,
        "latent": lat,
        "dtype": dtype_name,
        "unet_params": n_params,
        "seconds_per_unet_eval_cfg2": s_eval,
        "seconds_per_image_eval_by_batch": per_image,
        "unet_gflop_per_eval_cfg2": f_eval / 1e9,
        "unet_tflops_achieved": f_eval / s_eval / 1e12,
        "seconds_per_vae_decode": s_decode,
        "activation_memory_gib": memory,
        "vae_gflop_per_decode": f_decode / 1e9,
    }


def classifier_latency(name: str, batch: int, dtype_name: str, device: str, iters: int) -> dict:
    """Seconds per image of a timm model (random weights) on a batch at its input size."""
    import timm
    import torch

    dtype = getattr(torch, dtype_name)
    model = timm.create_model(name, pretrained=False).to(device, dtype).eval()
    size = model.pretrained_cfg.get("input_size", (3, 224, 224))
    x = torch.randn(batch, *size, device=device, dtype=dtype)

    @torch.inference_mode()
    def fwd():
        model(x)

    s = _timed(fwd, device, iters)
    f = _flops(fwd)
    return {
        "model": name,
        "input": list(size),
        "batch": batch,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "seconds_per_image": s / batch,
        "gflop_per_image": f / batch / 1e9,
        "tflops_achieved": f / s / 1e12,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=["tiny", "full"], default="full")
    p.add_argument("--resolution", type=int, default=768)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    p.add_argument("--models", nargs="*", default=DEFAULT_MODELS)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--unet-images", type=int, nargs="*", default=[4], help="also time CFG batches of these many images")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    import torch

    result: dict = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"}
    result["unet"] = [unet_latency(args.size, args.resolution, d, args.device, args.iters, args.unet_images) for d in args.dtypes]
    result["classifiers"] = [
        classifier_latency(m, args.batch, args.dtypes[0], args.device, max(1, args.iters // 2)) for m in args.models
    ]
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
