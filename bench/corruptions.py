"""Corruption throughput: the batched tensor corruptions vs a straightforward per-image NumPy/PIL loop.

Batched = :func:`pipeline.families.corruption.corrupt` on a batch of images (one random
field set per image, as in a build).  Per-image = ``tests/corruption_reference.py``: the
published formulas one HxWx3 NumPy image at a time (SciPy / PIL / Matplotlib), the
straightforward way ImageNet-C was made.  Both run in this process on the same images
at the same severity; corruptions without a per-image reference (snow, frost, spatter:
the release needs ImageMagick, OpenCV and frost photographs) report only the batched rate.

    python bench/corruptions.py --json                          # 224 px, severity 3, CPU
    python bench/corruptions.py --device cuda --batch 64 --json  # on a GPU

Prints one JSON object (``--json``): images/s per corruption for both and the speed-up.
Rates are per second of this process's CPU time by default (``--clock cpu``), so a
busy shared machine changes them little; ``--clock wall`` for elapsed time (GPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def images(n: int, size: int, seed: int = 0):
    """``n`` photo-like test images (smooth gradients, edges, a little texture), HxWx3 in [0, 1] on 8-bit levels."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    yy, xx = np.mgrid[0:size, 0:size] / size
    for _ in range(n):
        a, b, c = rng.uniform(2, 8, 3)
        img = np.stack([0.5 + 0.4 * np.sin(a * xx + c), 0.5 + 0.4 * np.cos(b * yy), 0.3 + 0.5 * xx * yy], -1)
        y0, x0 = rng.integers(0, size // 2, 2)
        img[y0 : y0 + size // 3, x0 : x0 + size // 3] = rng.uniform(0, 1, 3)
        img += rng.normal(0, 0.03, img.shape)
        out.append(np.round(np.clip(img, 0, 1) * 255) / 255)
    return out


def reference_call(name: str, x, params: tuple, rng):
    """One image through the per-image reference, drawing its random inputs with NumPy."""
    import corruption_reference as ref
    import numpy as np

    h, w = x.shape[:2]
    if name == "gaussian_noise":
        return ref.gaussian_noise(x, params[0], rng.normal(size=x.shape))
    if name == "speckle_noise":
        return ref.speckle_noise(x, params[0], rng.normal(size=x.shape))
    if name == "shot_noise":
        return ref.shot_noise(x, params[0], rng)
    if name == "impulse_noise":
        return ref.impulse_noise(x, params[0], rng.uniform(size=x.shape), rng.uniform(size=x.shape))
    if name == "gaussian_blur":
        return ref.gaussian_blur(x, params[0])
    if name == "defocus_blur":
        return ref.defocus_blur(x, params[0], params[1])
    if name == "glass_blur":
        d = int(params[1])
        return ref.glass_blur(x, params[0], d, int(params[2]), rng.integers(-d, d, size=(3, h, w, 2)))
    if name == "motion_blur":
        return ref.motion_blur(x, params[0], params[1], rng.uniform(-45, 45))
    if name == "zoom_blur":
        return ref.zoom_blur(x, params[0], params[1])
    if name == "fog":
        return ref.fog(x, params[0], params[1], rng)
    if name == "brightness":
        return ref.brightness(x, params[0])
    if name == "contrast":
        return ref.contrast(x, params[0])
    if name == "saturate":
        return ref.saturate(x, params[0], params[1])
    if name == "elastic_transform":
        return ref.elastic_transform(x, *params, rng.uniform(size=(3, 2)), rng.uniform(size=(h, w)), rng.uniform(size=(h, w)))
    if name == "pixelate":
        return ref.pixelate(x, params[0])
    if name == "jpeg_compression":
        return ref.jpeg_compression(x, params[0])
    return None  # snow, frost, spatter: no per-image reference
    del np


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=224, help="image side in pixels (ImageNet-C: 224)")
    p.add_argument("--batch", type=int, default=8, help="images per batch")
    p.add_argument("--severity", type=float, default=3.0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--corruptions", default="all", help="comma-separated names, or all")
    p.add_argument("--no-reference", action="store_true", help="time the batched implementation only")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--clock", choices=("cpu", "wall"), default="cpu",
        help="cpu: this process's CPU time (robust on a shared machine; equals wall time with one thread "
        "when the machine is quiet); wall: elapsed time (use on a GPU)",
    )
    args = p.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    import numpy as np
    import torch

    from pipeline.families.corruption import corrupt
    from pipeline.families.corruption import params as P
    from pipeline.families.corruption.ops import Fields

    if args.threads:
        torch.set_num_threads(args.threads)
    names = list(P.ALL) if args.corruptions == "all" else [n.strip() for n in args.corruptions.split(",")]
    imgs = images(args.batch, args.size)
    x = torch.from_numpy(np.stack(imgs)).float().permute(0, 3, 1, 2).contiguous().to(args.device)
    fields = [Fields(i) for i in range(args.batch)]
    sev = [args.severity] * args.batch
    results = {}
    for name in names:
        corrupt(name, x[:1], sev[:1], fields[:1])  # warm-up (imports, kernels)
        fresh = [Fields(1000 + i) for i in range(args.batch)]  # fields drawn inside the timing
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = clock()
        corrupt(name, x, sev, fresh)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        batched = args.batch / (clock() - t0)
        entry: dict = {"batched_images_per_s": round(batched, 2), "reference_images_per_s": None, "speedup": None}
        if not args.no_reference:
            rng = np.random.default_rng(0)
            step = P.severity_plan(name, args.severity)
            params = P.params_at(name, step.hi)
            if reference_call(name, imgs[0], params, rng) is not None:
                t0 = clock()
                for img in imgs:
                    reference_call(name, img, params, rng)
                per_image = args.batch / (clock() - t0)
                entry["reference_images_per_s"] = round(per_image, 2)
                entry["speedup"] = round(batched / per_image, 2)
        results[name] = entry
    sp = [e["speedup"] for e in results.values() if e["speedup"]]
    out = {
        "size": args.size,
        "batch": args.batch,
        "severity": args.severity,
        "device": args.device,
        "clock": args.clock,
        "torch_threads": torch.get_num_threads(),
        "corruptions": results,
        "geomean_speedup": round(math.exp(sum(math.log(s) for s in sp) / len(sp)), 2) if sp else None,
    }
    if args.json:
        print(json.dumps(out))
    else:
        for name, e in results.items():
            print(f"{name:18s} batched {e['batched_images_per_s']:8.1f} img/s   per-image {e['reference_images_per_s']}   x{e['speedup']}")
    return out


if __name__ == "__main__":
    main()
