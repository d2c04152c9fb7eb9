"""Measured GPU seconds per image of the paper's stages at real size, against the FLOP projection.

    python bench/rehearsal_gpu.py --json                 # on a GPU node: configs/cns_bench.yaml at 768 px
    python bench/rehearsal_gpu.py --json --smoke         # anywhere: tiny shapes, two classifiers, CPU allowed

Every model of the paper's config is built with random weights at its real architecture
(timing does not depend on the weights) on the device, and timed forward by forward with
the device synchronised: the SD2 UNet at the config's resolution and dtype, at a CFG batch
of 2 (the shared steps before the LoRA window, one image) and of 2 x ``branch_batch_size``
(the window, that many branches per forward), the VAE decode, the filter's CLIP ViT-B/16
and DINOv2-L at 518 px, every timm classifier at its input size and every CLIP image tower
in float32 at the classify batch (as the stages run them), and the text-tower work of one
zero-shot head (1000 classes x 80 templates).  Per image the generate stage costs the
grid's UNet evaluations of each kind (the shared-prefix count, as in bench/rehearsal.py)
plus one decode; filter and classify one forward of each model.  The FLOPs of
pipeline/perf/flops.py give each stage's achieved TFLOP/s, and the latency model's projection
(pipeline/perf/latency.py) stands beside the measured seconds.  ``--smoke`` swaps in small models (the SD2
blocks at small widths, 64 px, CLIP RN50, a small DINOv2) to check the script on a CPU.

Only the config's YAML is read (no ``pipeline`` import), so the script runs on a GPU node
that has torch, diffusers, timm and open_clip and nothing else of the project.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from pipeline.perf.flops import open_clip_image_flops, timm_flops, unet_flops, vae_decode_flops  # noqa: E402

TEMPLATES = 80  # the OpenAI ImageNet prompt templates per class
CLASSES = 1000


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str, repeats: int, warmup: int = 2) -> float:
    """Median seconds of one call of ``fn`` after ``warmup`` calls."""
    import torch

    with torch.inference_mode():
        for _ in range(warmup):
            fn()
        _sync(device)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            _sync(device)
            times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def unet_evals_per_image(gen: dict[str, Any], bench: dict[str, Any]) -> tuple[float, float]:
    """UNet sample-evaluations per image of the grid: (the shared prefix before the LoRA window,
    run once per (class, seed) at a batch of one; the window, run per distinct image in
    batches of ``branch_batch_size``), as :func:`pipeline.perf.evals.unet_evals_per_unit` counts them."""
    from pipeline.perf.evals import unet_evals_per_unit

    e = unet_evals_per_unit(gen["steps"], gen["lora_timestep_threshold"], len(bench["shifts"]),
                            list(bench["scales"]), gen["guidance_scale"])
    factor = 2 if gen["guidance_scale"] > 1 else 1
    pre = factor * e["prefix_steps"]
    return round(pre / e["images"], 3), round((e["evals"] - pre) / e["images"], 3)


def _row(name: str, seconds: float, flops: float, per_image: float = 1.0, **extra: Any) -> dict[str, Any]:
    row = {"model": name, "seconds_per_image": round(seconds * per_image, 6),
           "achieved_tflops": round(flops / seconds / 1e12, 1) if seconds > 0 else None}
    row.update(extra)
    return row


def measure_generate(res: int, dtype, device: str, repeats: int, small: bool, batches: list[int]) -> dict[str, Any]:
    """Seconds per UNet sample-evaluation at each CFG batch of ``batches`` and of one VAE decode."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from rehearsal_cache import SD2_UNET, SD2_VAE, SMALL

    unet_cfg = dict(SD2_UNET, **(SMALL["unet"] if small else {}))
    vae_cfg = dict(SD2_VAE, **(SMALL["vae"] if small else {}))
    side = res // 8
    with torch.device(device):
        unet = UNet2DConditionModel(**unet_cfg).to(dtype).eval()
    flops = unet_flops(unet_cfg, res)  # one sample-evaluation (batch 1)
    per_eval = {}
    for n in batches:  # a CFG step on n/2 images: n sample-evaluations
        x = torch.randn(n, 4, side, side, device=device, dtype=dtype)
        ctx = torch.randn(n, 77, unet_cfg["cross_attention_dim"], device=device, dtype=dtype)
        t = torch.full((n,), 500, device=device)
        seconds = timed(lambda x=x, t=t, ctx=ctx: unet(x, t, encoder_hidden_states=ctx), device, repeats)
        per_eval[n] = _row(f"unet batch {n}", seconds / n, flops)
        print(f"[rehearsal_gpu] {per_eval[n]}", file=sys.stderr)
    unet = None  # freed before the VAE is built
    with torch.device(device):
        vae = AutoencoderKL(**vae_cfg).to(dtype).eval()
    z = torch.randn(1, 4, side, side, device=device, dtype=dtype)
    decode = timed(lambda: vae.decode(z), device, max(2, repeats // 2))
    vae_flops = vae_decode_flops(vae_cfg, res)
    vae = None
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"unet_eval": per_eval, "unet_flops_per_eval": flops, "vae_decode": _row("vae decode", decode, vae_flops),
            "vae_flops": vae_flops}


def _image_model(kind: str, model: str, device: str, side: int | None = None):
    """(callable, input side) for a timm model (at ``side`` if given) or an open_clip image tower."""
    import torch

    if kind == "timm":
        import timm

        with torch.device(device):  # initialised where it runs: a GPU builds a 600M model in a blink
            net = timm.create_model(model, pretrained=False, **({"img_size": side} if side else {})).eval()
        return net, side or net.pretrained_cfg.get("input_size", (3, 224, 224))[-1]
    import open_clip

    with torch.device(device):
        clip = open_clip.create_model(model, pretrained=None, device=device).eval()
    side = clip.visual.image_size
    side = side[0] if isinstance(side, (tuple, list)) else side
    del clip.transformer  # the image tower is all a classify forward runs (the head is a matmul)
    return (lambda x: clip.encode_image(x)), side


def _flops(kind: str, model: str, side: int, sized: bool) -> int:
    if kind == "timm":
        return timm_flops(model, side, **({"img_size": side} if sized else {}))
    return open_clip_image_flops(model, side)


def measure_image_models(models: list[tuple[str, str, str]], batch: int, device: str, repeats: int,
                         side_override: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """One float32 forward of each (name, kind, model) at ``batch``; seconds per image."""
    import torch

    rows = []
    for name, kind, model in models:
        sized = (side_override or {}).get(name)
        try:
            fn, side = _image_model(kind, model, device, sized)
            x = torch.randn(batch, 3, side, side, device=device)
            sec = timed(lambda fn=fn, x=x: fn(x), device, repeats) / batch
            fn = x = None  # freed before the next model is built
            rows.append(_row(name, sec, _flops(kind, model, side, bool(sized)), input_side=side))
        except Exception as exc:  # one model's failure is reported, the others still measured
            rows.append({"model": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
        print(f"[rehearsal_gpu] {name}: {rows[-1]}", file=sys.stderr)
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def _total(rows: list[dict[str, Any]]) -> float:
    return round(sum(r.get("seconds_per_image", 0.0) for r in rows), 5)


def measure_zero_shot_head(model: str, device: str, batch: int, smoke: bool) -> dict[str, Any]:
    """Seconds to encode one zero-shot head's prompts (1000 classes x 80 templates) on ``device``."""
    import open_clip
    import torch

    with torch.device(device):
        clip = open_clip.create_model(model, pretrained=None, device=device).eval()
    tokens = torch.randint(1, 49_000, (batch, 77), device=device)
    per_batch = timed(lambda: clip.encode_text(tokens), device, 3)
    prompts = (1 if smoke else CLASSES) * TEMPLATES
    return {"model": model, "prompts": prompts, "seconds_per_head": round(per_batch * prompts / batch, 2)}


def main(argv: list[str] | None = None) -> int:
    import torch
    import yaml

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(HERE.parent / "configs" / "cns_bench.yaml"))
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, two classifiers: checks the script anywhere")
    ap.add_argument("--repeats", type=int, default=5)
    ints = lambda text: [int(v) for v in text.split(",") if v]  # noqa: E731
    ap.add_argument("--unet-batches", type=ints, default=[], help="more UNet batches to time, e.g. 8,64")
    ap.add_argument("--classify-batches", type=ints, default=[], help="classify totals at these batches too")
    ap.add_argument("--tf32", action="store_true", help="also time classify with TF32 matmuls")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    cfg = yaml.safe_load(Path(args.config).read_text())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.smoke:
        print("rehearsal_gpu: no CUDA device (use --smoke to check the script on the CPU)", file=sys.stderr)
        return 2
    gen, bench, res_cfg = cfg["generator"], cfg["benchmark"], cfg["resources"]
    dtype = getattr(torch, gen.get("dtype", "float32"))
    res = 64 if args.smoke else gen["resolution"]
    repeats = 1 if args.smoke else args.repeats
    batch = res_cfg["classify"]["batch_size"]

    clfs = [(c["name"], c.get("kind", "timm"), c["model"]) for c in cfg["classifiers"]
            if c.get("kind", "timm") in ("timm", "open_clip_zeroshot")]
    if args.smoke:
        clfs = [c for c in clfs if c[2] in ("resnet18.a1_in1k", "RN50")][:2]
    flt = cfg["filter"]
    dino = "vit_small_patch14_dinov2.lvd142m" if args.smoke else flt["dino"]["model"]
    filters = [("clip", "open_clip", "RN50" if args.smoke else flt["clip"]["model"]), ("dino", "timm", dino)]

    pre, window = unet_evals_per_image(gen, bench)
    branch = 2 * gen.get("branch_batch_size", 16) if gen["guidance_scale"] > 1 else gen.get("branch_batch_size", 16)
    if args.smoke:
        branch = 4
    out: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                           "torch": torch.__version__, "resolution": res, "dtype": str(dtype).split(".")[-1],
                           "unet_evals_per_image": {"prefix_batch_2": pre, f"window_batch_{branch}": window}}
    start = time.perf_counter()
    g = measure_generate(res, dtype, device, repeats, args.smoke, sorted({2, branch, *args.unet_batches}))
    unet = g["unet_eval"]
    gen_s = pre * unet[2]["seconds_per_image"] + window * unet[branch]["seconds_per_image"] \
        + g["vae_decode"]["seconds_per_image"]
    gen_flops = g["unet_flops_per_eval"] * (pre + window) + g["vae_flops"]
    out["generate"] = {"unet_eval_by_batch": {str(k): v for k, v in unet.items()}, "vae_decode": g["vae_decode"],
                       "seconds_per_image": round(gen_s, 4), "tflop_per_image": round(gen_flops / 1e12, 3),
                       "achieved_tflops": round(gen_flops / gen_s / 1e12, 1)}
    filter_rows = measure_image_models(filters, 1 if args.smoke else res_cfg["filter"]["batch_size"], device, repeats,
                                       side_override={"dino": 70 if args.smoke else 518})
    out["filter"] = {"models": filter_rows, "seconds_per_image": _total(filter_rows)}
    if args.smoke:
        batch = 1
    image_models = [(n, "timm" if k == "timm" else "open_clip", m) for n, k, m in clfs]
    clf_rows = measure_image_models(image_models, batch, device, repeats)
    out["classify"] = {"models": clf_rows, "batch": batch, "seconds_per_image": _total(clf_rows)}
    for n in args.classify_batches:  # the stage's total at other batch sizes (the original evaluates at 128)
        out["classify"][f"seconds_per_image_batch_{n}"] = _total(measure_image_models(image_models, n, device, repeats))
    if device == "cuda" and args.tf32:  # TF32 matmuls too (PyTorch's default has TF32 convolutions only)
        torch.backends.cuda.matmul.allow_tf32 = True
        for n in [batch, *args.classify_batches]:
            out["classify"][f"tf32_seconds_per_image_batch_{n}"] = _total(
                measure_image_models(image_models, n, device, repeats))
        torch.backends.cuda.matmul.allow_tf32 = False
    zs = [m for _, k, m in clfs if k == "open_clip_zeroshot"]
    if zs:
        out["zero_shot_head"] = measure_zero_shot_head(max(zs, key=lambda m: ("L" in m, len(m))), device,
                                                       batch=8 if args.smoke else 1000, smoke=args.smoke)
    from pipeline.config import load_config  # the latency model's projection of the config's grid on an H100
    from pipeline.perf.data import gpu_spec
    from pipeline.perf.latency import grid_seconds_per_image

    projected = grid_seconds_per_image(load_config(args.config), gpu_spec("h100"))
    out["projection_assumption"] = "pipeline.perf.latency on an H100 (pipeline/data/gpus.json's utilisations)"
    out["projected_seconds_per_image"] = {k: round(v["seconds"], 4) for k, v in projected.items()}
    out["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
