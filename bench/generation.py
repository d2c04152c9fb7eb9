"""Generation throughput and memory: the naive loop, the project's per-row slider bank, peft's mixed batches.

Three paths over the same classes, seeds, shifts, scales and steps:

* ``naive`` -- the reference: one diffusers pipeline call per (shift, scale) image with a
  per-step callback that toggles the slider at the timestep threshold;
* ``hooks`` -- the project's path: one ``SliderSampler.generate_group`` per (class, seed)
  (pre-window steps and the scale-0 image once, the other branches ``--branch-batch`` per
  UNet forward), each row's slider and multiplier applied by ``SliderBank``'s hooks
  (the loaded sliders stacked per layer and gathered by a per-row slot);
* ``peft`` -- the same ``generate_group`` (same branches, same batch size) with the rows'
  sliders applied by peft's mixed-adapter batches (``adapter_names``): each slider is
  loaded through diffusers' ``load_lora_adapter``, one adapter per (shift, scale) branch,
  the adapters of one slider sharing its tensors (``PeftMixedBank``, ``bench/peft_bank.py``);
* ``peft_copies`` -- the same as ``peft`` with each (shift, scale) adapter holding its own
  copy of the slider, as plain ``load_lora_weights`` per adapter gives.

Each path runs in a fresh subprocess, so its peak memory (RSS; on CUDA also the peak
allocated by torch) is its own.  The images of all paths are compared pixel by pixel.

    python bench/generation.py --json                      # tiny demo model, CPU
    python bench/generation.py --size full --naive-images 12 --json   # SD2 architecture (random weights), for a GPU

Prints one JSON object (``--json``): per path images/s, UNet evaluations per image, peak
memory and LoRA tensor bytes, the ratios to the naive baseline of the same run, and the
largest pixel difference between paths.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PATHS = ("naive", "hooks", "peft", "peft_copies")
SCALES = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=("tiny", "full"), default="tiny")
    p.add_argument("--classes", type=int, default=1)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--shifts", type=int, default=14)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--resolution", type=int, default=None, help="default: 64 (tiny) or 768 (full)")
    p.add_argument("--branch-batch", type=int, default=16)
    p.add_argument("--targets", choices=("attn", "attn_conv"), default="attn_conv", help="slider module set")
    p.add_argument("--dtype", default="bfloat16", help="used on GPU; CPU always float32")
    p.add_argument("--naive-images", type=int, default=None, help="time the naive loop on this many images only")
    p.add_argument("--repeats", type=int, default=1, help="time each path this many times, report the fastest")
    p.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset of " + ",".join(PATHS))
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", choices=PATHS, help=argparse.SUPPRESS)  # internal: run one path
    p.add_argument("--root", help=argparse.SUPPRESS)
    return p


def _coords(args):
    classes = list(range(1, 1 + args.classes))
    seeds = list(range(1, 1 + args.seeds))
    shifts = [f"shift_{i:02d}" for i in range(args.shifts)]
    return classes, seeds, shifts


def prepare(args, root: Path) -> None:
    """Model, class tokens and one random non-zero slider per (class, shift) under ``root``."""
    import torch
    from diffusers import UNet2DConditionModel

    from pipeline.demo.tiny_sd import build_sd2
    from pipeline.labels import label_space
    from pipeline.models.diffusion import ti_token
    from pipeline.models.lora import random_slider, save_slider_file

    classes, _, shifts = _coords(args)
    labels = label_space("imagenet")
    build_sd2(root / "model", size=args.size)
    tokens = root / "tokens"
    tokens.mkdir()
    hidden = 32 if args.size == "tiny" else 1024
    for c in classes:
        torch.save({ti_token(c, labels.name(c)): torch.randn(hidden)}, tokens / f"{c}.bin")
    unet = UNet2DConditionModel.from_pretrained(root / "model", subfolder="unet")
    for i, shift in enumerate(shifts):
        for c in classes:
            state = random_slider(unet, targets=args.targets, seed=i * 1000 + c, std=0.05)
            save_slider_file(state, str(root / "sl" / shift / f"{c:03d}.safetensors"))


def _lora_bytes(bank) -> int:
    """Bytes of the distinct LoRA tensors a bank holds (shared storage counted once)."""
    import torch

    from pipeline.models.lora import SliderBank

    if isinstance(bank, SliderBank):  # the stacks, all slots (as allocated)
        return bank.nbytes
    seen: dict[int, int] = {}
    # PeftMixedBank: the adapters' lora_A / lora_B weights in the UNet
    tensors = [p for n, p in bank.unet.named_parameters() if ".lora_A." in n or ".lora_B." in n]
    for t in tensors:
        if isinstance(t, torch.Tensor):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def run_worker(args) -> dict:
    """One path in this (fresh) process: load, warm up, time; images go to ``<root>/<path>.npz``."""
    import numpy as np
    import torch

    from pipeline.config import ClassTokens, GeneratorSpec
    from pipeline.labels import label_space
    from pipeline.models.sampler import SliderSampler
    from pipeline.stages.base import pick_device, pick_dtype

    root = Path(args.root)
    device = pick_device()
    dtype = pick_dtype(args.dtype, device)
    resolution = args.resolution or (64 if args.size == "tiny" else 768)
    classes, seeds, shifts = _coords(args)
    spec = GeneratorSpec(
        model=str(root / "model"),
        class_tokens=ClassTokens(kind="ti_folder", path=str(root / "tokens")),
        slider_store=str(root / "sl"),
        steps=args.steps,
        resolution=resolution,
        image_size=min(256, resolution),
        branch_batch_size=args.branch_batch,
        dtype=args.dtype,
    )
    sampler = SliderSampler(spec, device, dtype)
    sampler.setup(classes, label_space("imagenet"))
    peft = args.worker.startswith("peft")
    if peft:
        from bench.peft_bank import PeftMixedBank

        sampler.bank.detach()
        sampler.bank = PeftMixedBank(sampler.pipe.unet, share_weights=args.worker == "peft")
    t_load = time.perf_counter()
    sampler.bank.reserve(len(classes) * len(shifts))  # every slider stays loaded
    for c in classes:  # load every slider outside the timed region
        for s in shifts:
            sampler.load_slider(c, s)
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if peft:  # create every (shift, scale) adapter outside the timed region too
        for c in classes:
            for s in shifts:
                sampler.bank.route([f"{s}/{c}"] * (len(SCALES) - 1), [m for m in SCALES if m != 0])
        sampler.bank.clear_route()
    load_seconds = time.perf_counter() - t_load
    warm = [shifts[0]]
    if args.worker == "naive":
        sampler.reference_image(classes[0], 0, warm[0], 1.0)
    else:
        sampler.generate_group(classes[0], 0, warm, [0.0, 1.0])
    if cuda:
        torch.cuda.reset_peak_memory_stats()

    todo = [(c, seed, sh, sc) for c in classes for seed in seeds for sh in shifts for sc in SCALES]
    if args.worker == "naive":
        todo = todo[: args.naive_images or len(todo)]
    runs = []
    for _ in range(args.repeats):  # the minimum over repeats is the least disturbed by other load
        images, evals = {}, 0
        sync()
        t0 = time.perf_counter()
        if args.worker == "naive":
            for c, seed, sh, sc in todo:
                images[(c, seed, sh, sc)] = sampler.reference_image(c, seed, sh, sc)
            evals = len(todo) * spec.steps * (2 if spec.guidance_scale > 1 else 1)
        else:
            for c in classes:
                for seed in seeds:
                    g = sampler.generate_group(c, seed, shifts, SCALES)
                    evals += g.unet_evals
                    for sh in shifts:
                        for sc in SCALES:
                            images[(c, seed, sh, sc)] = g.image(sh, sc)
        sync()
        runs.append(time.perf_counter() - t0)
    seconds = min(runs)
    keys = sorted(images)
    np.savez(root / f"{args.worker}.npz", keys=np.array([list(map(str, k)) for k in keys]),
             images=np.stack([np.asarray(images[k]) for k in keys]))
    return {
        "images": len(images),
        "seconds": seconds,
        "seconds_per_repeat": runs,
        "images_per_s": len(images) / seconds,
        "slider_load_seconds": load_seconds,
        "unet_evals_per_image": evals / len(images),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cuda_peak_allocated_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        "lora_tensor_mb": _lora_bytes(sampler.bank) / 2**20,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch_threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> dict:
    args = _parser().parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(args)))
        return {}
    import numpy as np

    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        raise SystemExit(f"--paths: unknown {unknown}; choose from {list(PATHS)}")
    forwarded = [a for a in (argv if argv is not None else sys.argv[1:]) if a not in ("--json",)]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        prepare(args, root)
        for path in paths:
            proc = subprocess.run(
                [sys.executable, __file__, *forwarded, "--worker", path, "--root", str(root)],
                capture_output=True, text=True,
            )
            if proc.returncode:
                raise SystemExit(f"bench path {path} failed:\n{proc.stderr[-4000:]}")
            results[path] = json.loads(proc.stdout.strip().splitlines()[-1])
        arrays = {}
        for path in paths:
            data = np.load(root / f"{path}.npz")
            arrays[path] = {tuple(k): img.astype(np.int16) for k, img in zip(data["keys"], data["images"])}
    diffs = {}
    for i, a in enumerate(paths):
        for b in paths[i + 1 :]:
            common = set(arrays[a]) & set(arrays[b])
            diffs[f"{a}_vs_{b}"] = max(int(np.abs(arrays[a][k] - arrays[b][k]).max()) for k in common)
    first = next(iter(results.values()))
    result = {
        "device": first["device"],
        "size": args.size,
        "targets": args.targets,
        "resolution": args.resolution or (64 if args.size == "tiny" else 768),
        "steps": args.steps,
        "shifts": args.shifts,
        "scales": len(SCALES),
        "branch_batch": args.branch_batch,
        "torch_threads": first["torch_threads"],
        "paths": results,
        "max_pixel_diff": diffs,
    }
    if "naive" in results:
        base = results["naive"]["images_per_s"]
        result["speedup_vs_naive"] = {p: r["images_per_s"] / base for p, r in results.items()}
    for p in ("peft", "peft_copies"):
        if "hooks" in results and p in results:
            result[f"hooks_over_{p}"] = results["hooks"]["images_per_s"] / results[p]["images_per_s"]
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
