"""Generation throughput: shared prefix + batched multi-slider branches vs the naive loop.

Naive = the reference: one diffusers pipeline call per (shift, scale) image with a
per-step callback that toggles the slider at the timestep threshold.  Ours = one
``SliderSampler.generate_group`` call per (class, seed): pre-window steps and the scale-0
image once, the other branches several per UNet forward.  Both run in this process on the
same classes, seeds, shifts and scales.

    python bench/generation.py --json                      # tiny demo model, CPU
    python bench/generation.py --size full --json          # SD2 architecture (random weights), for a GPU

Prints one JSON object (``--json``) with images, UNet evaluations per image and images/s
for both, the speed-up, and how far the images agree.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=("tiny", "full"), default="tiny")
    p.add_argument("--classes", type=int, default=1)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--shifts", type=int, default=14)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--resolution", type=int, default=None, help="default: 64 (tiny) or 768 (full)")
    p.add_argument("--branch-batch", type=int, default=16)
    p.add_argument("--dtype", default="bfloat16", help="used on GPU; CPU always float32")
    p.add_argument("--naive-images", type=int, default=None, help="time the naive loop on this many images only")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    import numpy as np
    import torch
    from diffusers import UNet2DConditionModel

    from pipeline.config import ClassTokens, GeneratorSpec
    from pipeline.demo.tiny_sd import build_sd2
    from pipeline.labels import label_space
    from pipeline.models.diffusion import ti_token
    from pipeline.models.lora import random_slider, save_slider_file
    from pipeline.models.sampler import SliderSampler
    from pipeline.stages.base import pick_device, pick_dtype

    device = pick_device()
    dtype = pick_dtype(args.dtype, device)
    resolution = args.resolution or (64 if args.size == "tiny" else 768)
    scales = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    classes = list(range(1, 1 + args.classes))
    seeds = list(range(1, 1 + args.seeds))
    shifts = [f"shift_{i:02d}" for i in range(args.shifts)]
    labels = label_space("imagenet")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_sd2(root / "model", size=args.size)
        tokens = root / "tokens"
        tokens.mkdir()
        hidden = 32 if args.size == "tiny" else 1024
        for c in classes:
            torch.save({ti_token(c, labels.name(c)): torch.randn(hidden)}, tokens / f"{c}.bin")
        unet = UNet2DConditionModel.from_pretrained(root / "model", subfolder="unet")
        for i, shift in enumerate(shifts):
            for c in classes:
                save_slider_file(random_slider(unet, seed=i * 1000 + c, std=0.05), str(root / "sl" / shift / f"{c:03d}.safetensors"))
        del unet
        spec = GeneratorSpec(
            model=str(root / "model"),
            class_tokens=ClassTokens(kind="ti_folder", path=str(tokens)),
            slider_store=str(root / "sl"),
            steps=args.steps,
            resolution=resolution,
            image_size=min(256, resolution),
            branch_batch_size=args.branch_batch,
            dtype=args.dtype,
        )
        sampler = SliderSampler(spec, device, dtype)
        sampler.setup(classes, labels)
        for c in classes:  # load sliders and warm up outside the timed regions
            for s in shifts:
                sampler.load_slider(c, s)
        sampler.generate_group(classes[0], 0, shifts[:1], [0.0, 1.0])

        n_images = len(classes) * len(seeds) * len(shifts) * len(scales)
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

        sync()
        t0 = time.perf_counter()
        groups, evals = {}, 0
        for c in classes:
            for seed in seeds:
                g = sampler.generate_group(c, seed, shifts, scales)
                groups[(c, seed)] = g
                evals += g.unet_evals
        sync()
        ours_s = time.perf_counter() - t0

        naive_total = args.naive_images or n_images
        todo = [(c, seed, sh, sc) for c in classes for seed in seeds for sh in shifts for sc in scales][:naive_total]
        sync()
        t0 = time.perf_counter()
        max_diff = 0
        for c, seed, sh, sc in todo:
            img = sampler.reference_image(c, seed, sh, sc)
            ref = np.asarray(img).astype(np.int16)
            got = np.asarray(groups[(c, seed)].image(sh, sc)).astype(np.int16)
            max_diff = max(max_diff, int(np.abs(ref - got).max()))
        sync()
        naive_s = time.perf_counter() - t0
        per_image_naive = spec.steps * (2 if spec.guidance_scale > 1 else 1)

    result = {
        "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu",
        "size": args.size,
        "resolution": resolution,
        "steps": args.steps,
        "images": n_images,
        "shifts": len(shifts),
        "scales": len(scales),
        "unet_evals_per_image_naive": per_image_naive,
        "unet_evals_per_image": evals / n_images,
        "unet_eval_reduction": per_image_naive / (evals / n_images),
        "images_per_s_naive": len(todo) / naive_s,
        "images_per_s": n_images / ours_s,
        "speedup": (n_images / ours_s) / (len(todo) / naive_s),
        "naive_images_timed": len(todo),
        "max_pixel_diff_vs_naive": max_diff,
        "torch_threads": torch.get_num_threads(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>28}: {v}")
    return result


if __name__ == "__main__":
    main()
