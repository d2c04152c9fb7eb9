"""Pipeline overhead: the full Ray build (generate -> filter -> classify -> write) vs the
bare generation stage on the same work, and the driver's peak memory for two plan sizes.

Two baselines for the generation stage alone: in this process (models loaded inside the
clock, but torch and diffusers already imported), and on Ray (the same actor pool as in the
build, so a fresh worker that imports torch and loads the model, with the rows drained by
the driver).  All timings include loading the models; Ray's own start-up is excluded
(``ray.init`` runs before the clocks start).  The driver-memory measurement runs each plan
size in a fresh subprocess and reads that process's peak RSS.

    python bench/pipeline.py --json [--seeds 6] [--repeats 2]
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


def init_ray(address, cfg) -> None:
    """The Ray the build would start for ``cfg``: sized from the build's chain."""
    from pipeline.build import build_chain
    from pipeline.executors.ray_data import init_ray as init

    init(address, build_chain(cfg))


def run_build(cfg, units, out: str):
    """The build's chain (generate -> filter -> classify -> write) on the Ray Data executor."""
    from pipeline.plan import schema
    from pipeline.build import build_chain
    from pipeline.executors.ray_data import RayDataExecutor

    rows = [u.to_row() for u in units]
    return RayDataExecutor(cfg).run(rows, out, build_chain(cfg), num_blocks=len(rows), first_schema=schema.UNIT)


def generation_only(cfg, rows: list[dict], out: str):
    """The generation stage alone on the same actor pool as in the build; rows drained here."""
    from pipeline.executors import Chain, StageSpec
    from pipeline.executors.ray_data import RayDataExecutor
    from pipeline.stages.generate import GenerateStage

    return RayDataExecutor(cfg).run(rows, out, Chain(cfg, [StageSpec(GenerateStage)]), num_blocks=len(rows))


def driver_peak(shifts: int, seeds: int, steps: int) -> dict:
    """Run a full Ray build in this process; report wall time and this driver's peak RSS."""
    import ray

    from pipeline import plan
    with tempfile.TemporaryDirectory() as tmp:
        cfg = make_config(Path(tmp), shifts, seeds, steps)
        units = plan.plan_units(cfg)
        started = not ray.is_initialized()  # a caller's Ray (tests) stays up
        init_ray(None, cfg)
        t0 = time.perf_counter()
        shards = sum(1 for _ in run_build(cfg, units, str(Path(tmp) / "out")))
        wall = time.perf_counter() - t0
        if started:
            ray.shutdown()
    return {
        "images": plan.summarize(cfg).n_images,
        "shards": shards,
        "wall_s": wall,
        "driver_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def overhead(shifts: int, seeds: int, steps: int, repeats: int = 1) -> dict:
    """Time the three ways of running the same work ``repeats`` times, interleaved; the
    minimum of each is reported (the run least disturbed by other load on the machine)."""
    import pyarrow as pa
    import ray

    from pipeline import plan

    from pipeline.plan import schema
    from pipeline.stages.generate import GenerateStage

    times: dict[str, list[float]] = {"bare_generation_s": [], "ray_generation_s": [], "full_pipeline_s": []}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = make_config(Path(tmp), shifts, seeds, steps)
        units = plan.plan_units(cfg)
        rows = [u.to_row() for u in units]
        n_images = plan.summarize(cfg).n_images
        gen = cfg.resources.generate
        started = not ray.is_initialized()  # a caller's Ray (tests) stays up
        init_ray(None, cfg)
        for i in range(repeats):
            # Bare generation: the same stage class, in this process, with the thread count
            # the Ray actor gets (its num_cpus).
            t0 = time.perf_counter()
            stage = GenerateStage(cfg, threads=max(1, int(gen.num_cpus)))
            for row in rows:
                stage(pa.Table.from_pylist([row], schema=schema.UNIT))
            times["bare_generation_s"].append(time.perf_counter() - t0)
            del stage
            # The generation stage alone on Ray: the same actor pool as in the build (a
            # fresh worker process that imports torch and loads the model), rows drained here.
            t0 = time.perf_counter()
            for _ in generation_only(cfg, rows, f"{tmp}/gen{i}"):
                pass
            times["ray_generation_s"].append(time.perf_counter() - t0)
            # The full build: generate -> filter -> classify -> write.
            t0 = time.perf_counter()
            for _ in run_build(cfg, units, f"{tmp}/out{i}"):
                pass
            times["full_pipeline_s"].append(time.perf_counter() - t0)
        if started:
            ray.shutdown()
    bare, ray_gen, full = (min(v) for v in times.values())
    return {
        "images": n_images,
        "repeats": repeats,
        "bare_generation_s": bare,
        "ray_generation_s": ray_gen,
        "full_pipeline_s": full,
        "overhead": full / bare - 1.0,
        "overhead_vs_ray_generation": full / ray_gen - 1.0,
        "images_per_s_bare": n_images / bare,
        "images_per_s_full": n_images / full,
        "all_runs_s": {k: [round(x, 2) for x in v] for k, v in times.items()},
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shifts", type=int, default=14)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--repeats", type=int, default=1, help="interleaved repeats; the minimum of each timing is kept")
    p.add_argument("--memory-seeds", type=int, nargs="*", default=[2, 8], help="plan sizes (seeds) whose driver memory is measured")
    p.add_argument("--driver-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    if args.driver_only:
        print(json.dumps(driver_peak(args.shifts, args.seeds, args.steps)))
        return {}

    result = overhead(args.shifts, args.seeds, args.steps, args.repeats)
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
