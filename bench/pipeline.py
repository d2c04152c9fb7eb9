"""Pipeline overhead: the full Ray build (generate -> filter -> classify -> write) vs the
bare generation stage on the same work, and the driver's peak memory for two plan sizes.

Both timings include loading the models (the Ray actors load theirs inside the timed
region too); Ray's own start-up is excluded (``ray.init`` runs before the clock starts).
The driver-memory measurement runs each plan size in a fresh subprocess and reads that
process's peak RSS.

    python bench/pipeline.py --json
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
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def make_config(tmp: Path, shifts: int, seeds: int, steps: int):
    """The demo config with ``shifts`` random sliders per class in a temporary store."""
    import yaml
    from diffusers import UNet2DConditionModel

    from pipeline.cli import TINY_CONFIG
    from pipeline.config import parse_config
    from pipeline.demo.assets import ensure_tiny_assets
    from pipeline.models.lora import random_slider, save_slider_file

    assets = ensure_tiny_assets()
    raw = yaml.safe_load(TINY_CONFIG.read_text().replace("../assets/", str(assets.parent) + "/"))
    names = [f"shift_{i:02d}" for i in range(shifts)]
    store = tmp / "sliders"
    if not store.exists():
        unet = UNet2DConditionModel.from_pretrained(assets / "sd2-tiny", subfolder="unet")
        for i, name in enumerate(names):
            for c in (1, 22):
                save_slider_file(random_slider(unet, seed=i * 100 + c, std=0.3), str(store / name / f"{c:03d}.safetensors"))
    raw["benchmark"].update(shifts=names, seeds=list(range(1, seeds + 1)))
    raw["generator"].update(slider_store=str(store), steps=steps)
    raw["output"]["trajectories_per_shard"] = 8
    return parse_config(raw)


def driver_peak(shifts: int, seeds: int, steps: int) -> dict:
    """Run a full Ray build in this process; report wall time and this driver's peak RSS."""
    import ray

    from pipeline import plan
    from pipeline.runners.ray_runner import init_ray, run_ray

    with tempfile.TemporaryDirectory() as tmp:
        cfg = make_config(Path(tmp), shifts, seeds, steps)
        units = plan.plan_units(cfg.benchmark)
        init_ray(None, cfg)
        t0 = time.perf_counter()
        shards = sum(1 for _ in run_ray(cfg, units, str(Path(tmp) / "out")))
        wall = time.perf_counter() - t0
        ray.shutdown()
    return {
        "images": plan.summarize(cfg.benchmark).n_images,
        "shards": shards,
        "wall_s": wall,
        "driver_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def overhead(shifts: int, seeds: int, steps: int) -> dict:
    import pyarrow as pa
    import ray

    from pipeline import plan, schema
    from pipeline.runners.ray_runner import init_ray, run_ray
    from pipeline.stages.generate import GenerateStage

    with tempfile.TemporaryDirectory() as tmp:
        cfg = make_config(Path(tmp), shifts, seeds, steps)
        units = plan.plan_units(cfg.benchmark)
        n_images = plan.summarize(cfg.benchmark).n_images

        # Bare generation: the same stage class, in this process, with the thread count
        # the Ray actor gets (its num_cpus).
        t0 = time.perf_counter()
        stage = GenerateStage(cfg, threads=max(1, int(cfg.resources.generate.num_cpus)))
        for u in units:
            stage(pa.Table.from_pylist([u.to_row()], schema=schema.UNIT))
        bare = time.perf_counter() - t0
        del stage

        init_ray(None, cfg)
        t0 = time.perf_counter()
        for _ in run_ray(cfg, units, str(Path(tmp) / "out")):
            pass
        full = time.perf_counter() - t0
        ray.shutdown()
    return {
        "images": n_images,
        "bare_generation_s": bare,
        "full_pipeline_s": full,
        "overhead": full / bare - 1.0,
        "images_per_s_bare": n_images / bare,
        "images_per_s_full": n_images / full,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shifts", type=int, default=14)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--memory-seeds", type=int, nargs=2, default=[2, 8], help="two plan sizes (seeds)")
    p.add_argument("--driver-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    if args.driver_only:
        print(json.dumps(driver_peak(args.shifts, args.seeds, args.steps)))
        return {}

    result = overhead(args.shifts, args.seeds, args.steps)
    for seeds in args.memory_seeds:
        out = subprocess.run(
            [sys.executable, __file__, "--driver-only", "--shifts", "2", "--steps", "10", "--seeds", str(seeds)],
            capture_output=True, text=True, check=True,
        ).stdout.strip().splitlines()[-1]
        result[f"driver_plan_{seeds}_seeds"] = json.loads(out)
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
