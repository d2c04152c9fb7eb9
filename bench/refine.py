"""Refined failure points against a dense grid's, on the demo world (docs/refine.md).

    python bench/refine.py --json                 # the world, R = 3, its four classifiers
    python bench/refine.py --json --smoke         # the suite's size: 1 class, 1 seed, R = 1

Builds the world's CNS benchmark (configs/demo.yaml) twice with the same settings: on its
6-scale grid, and on a dense grid of 41 scales from 0 to 2.5 (steps of 1/16) as the truth.
Then runs ``cnsbench refine`` on the 6-scale build with R rounds for each of the world's
classifiers in turn (in process), and compares every refined trajectory (grid failure point
> 0) with the dense build's first failure over its kept images:

* ``agree_interval``: the share whose refined failure point is the dense first failure or
  one dense step from it (R = 3 on a 0.5 grid lands on the dense 1/16 grid);
* ``mean_abs_error``: mean |refined - dense first failure|;
* ``images_ratio``: refinement images made, summed over the classifiers, over the dense
  build's images;
* ``reuse_share``: of the later classifiers' points, the share already made;
* ``together``: the same classifiers refined in one run (``--classifier a,b,...``) on a copy
  of the unrefined build: its points and wall time against the runs one after another (which
  reuse the earlier runs' points) and its points against each classifier refined alone (in an
  output of its own), and whether its rows equal theirs (``same_rows``);
* ``recover_before_grid``: cases whose dense truth fails, recovers and fails again before
  the grid's last correct scale (no bisection of the grid interval can see it), and
  ``nonmonotone_in_interval``: cases whose dense truth fails earlier inside the interval
  than the bisection's answer (a failure the midpoints stepped over).

It also measures what the generation of a refinement point spends before the LoRA window
(``prefix``): a one-point call with the unit's prefix computed and cached, the UNet time
at timesteps above the threshold, against writing and reading that latent through the
output store (what a cache kept in the output would cost).
With ``--family corruptions|ximagenet|imagenet_e`` it measures that family's world build
instead (``configs/world_corruptions.yaml``, ``world_ximagenet.yaml``, ``world_imagenet_e.yaml``):
the build on its grid and on a dense grid of 16 steps per grid interval (1/16 of its grid
step, at the probes' exact scales) as the truth, the world's classifiers
refined together (``--classifier all``) with R rounds, and every refined trajectory of the
family compared with the dense build's first failure (``agree_interval`` within one dense
step of its interval, ``mean_abs_error``, ``images_ratio``: the family's refinement images
over its dense images).  The corruption world's slider part is cut to one shift at scales
0 and 0.5 (it only supplies the scale-0 image the corruptions start from); its refined
slider points are counted apart.  ``--subset`` restricts the world to fewer classes, seeds
and shifts (named in the JSON's ``subset``), so the measurement fits a 2-core machine.

    python bench/refine.py --family corruptions --json [--subset] [--smoke]

With ``--together`` it measures only the classifiers refined together against one after
another, on the world's grid build (no dense build): ``cnsbench refine OUT --classifier
a,b,... --rounds R --runner local`` (as ``--classifier all``) on one copy of the unrefined
build, and the same command once per classifier, one after another, on another copy (later
ones reuse the earlier ones' points), each command a process of its own as when typed one
after another (no model or prefix cache carries over).  It reports per command the points
it made (read from the refinement store's manifests), its wall and CPU seconds and the load
average before and after; the images each classifier refined alone would make (the rounds of
its rows: one probe each); whether the two ways give equal rows; and the ratios of the two
ways, measured in the same run.

    python bench/refine.py --together --json [--steps 50] [--smoke]

Prints one JSON object (``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
WORLD_MODELS = ("linear", "cnn", "vit", "clip-zs")
DENSE = [i / 16 for i in range(41)]


def quiet(_: str) -> None:
    pass


# The families with a world build of their own: config, the key of the family's scales, the
# index of its group, sets every build of the bench gets, and the subset of ``--subset`` and
# of ``--smoke`` (sets, and words for the JSON).
FAMILIES = {
    "corruptions": {
        "config": "world_corruptions.yaml", "scales_key": "families[0].scales", "group": 1,
        "sets": ["benchmark.shifts=[thick_strokes]", "benchmark.scales=[0,0.5]"],
        "subset": ["benchmark.classes=[zero,seven]", "benchmark.seeds=[1,2]",
                   "families[0].shifts=[gaussian_noise,defocus_blur,fog,contrast,pixelate,jpeg_compression]"],
        "subset_words": "classes zero, seven; seeds 1, 2; corruptions gaussian_noise, defocus_blur, fog, contrast, "
                        "pixelate, jpeg_compression (6 of 19)",
        "smoke": ["benchmark.classes=[seven]", "benchmark.seeds=[1]", "families[0].shifts=[gaussian_noise,contrast]"],
    },
    "ximagenet": {
        "config": "world_ximagenet.yaml", "scales_key": "benchmark.scales", "group": 0, "sets": [],
        "subset": ["benchmark.classes=[zero,three,seven]", "benchmark.seeds=[1,2]"],
        "subset_words": "classes zero, three, seven (3 of 9); seeds 1, 2 (2 of 6); all 12 scenarios",
        "smoke": ["benchmark.classes=[seven]", "benchmark.seeds=[1]", "benchmark.shifts=[image_grey,blur_object]"],
    },
    "imagenet_e": {
        "config": "world_imagenet_e.yaml", "scales_key": "benchmark.scales", "group": 0, "sets": [],
        "subset": ["benchmark.classes=[zero,seven]", "benchmark.seeds=[1,2]"],
        "subset_words": "classes zero, seven (2 of 5); seeds 1, 2 (2 of 4); all 5 attributes",
        "smoke": ["benchmark.classes=[seven]", "benchmark.seeds=[1]", "benchmark.shifts=[size,rotation]"],
    },
}


def dense_scales(grid: list[float], per_step: int = 16) -> list[float]:
    """``per_step`` steps in every grid interval, exact (the bisection's probes are exact
    midpoints, 2.9375 and not 2.938: a pixelation can differ between the two); distinct in
    thousandths, the outputs' scale resolution, for the grids of the worlds."""
    grid = sorted(grid)
    out = {round(grid[-1], 9)}
    for a, b in zip(grid, grid[1:]):
        out.update(round(a + (b - a) * j / per_step, 9) for j in range(per_step))
    if len({round(x * 1000) for x in out}) != len(out):
        raise SystemExit(f"bench/refine.py: the dense grid of {grid} repeats a scale in thousandths")
    return sorted(out)


def cns_settings(args) -> tuple[list[str], int]:
    """The ``--set``s of the demo world's builds and the rounds: ``--smoke`` cuts the world to
    one class and seed and one round."""
    sets = [f"generator.steps={args.steps}", "aggregate.plots=false", "aggregate.strips.count=0"]
    if args.smoke:
        return sets + ["benchmark.classes=[seven]", "benchmark.seeds=[1]"], 1
    return sets, args.rounds


def build(out: Path, sets: list[str], config: str = "demo.yaml") -> float:
    from pipeline.cli import main

    import contextlib

    t0 = time.perf_counter()
    args = ["build", str(ROOT / "configs" / config), "--output", str(out), "--runner", "local"]
    for s in sets:
        args += ["--set", s]
    with contextlib.redirect_stdout(sys.stderr):  # the build's progress; stdout is the JSON
        rc = main(args)
    if rc != 0:
        raise SystemExit(f"bench/refine.py: the build into {out} failed")
    return time.perf_counter() - t0


def dense_truth(out: Path, classifiers: list[str]):
    """Per (trajectory, classifier), the dense first failure over the kept images and whether
    the classifier is wrong at each kept dense scale."""
    from pipeline.aggregate.run import load_sound_tables
    from pipeline.io.store import OutputStore

    samples, preds, _ = load_sound_tables(OutputStore(str(out)), classifiers)
    rows = samples[samples["kept"].fillna(False).astype(bool)][["sample_id", "trajectory_id", "scale"]]
    rows = rows.merge(preds[["sample_id", "classifier", "correct"]], on="sample_id")
    truth = {}
    for (tid, clf), g in rows.groupby(["trajectory_id", "classifier"]):
        g = g.sort_values("scale")
        wrong = g.loc[~g["correct"].astype(bool), "scale"]
        truth[(tid, clf)] = (float(wrong.iloc[0]) if len(wrong) else None, g)
    return truth, len(samples)


def compare(table, truth, step: float, grid_step: float = 0.5, grid: list[float] | None = None) -> dict:
    """``grid``: the build's scales; each row's grid step is then its own grid interval's and
    ``step`` its 1/16 (a dense step)."""
    refined = table[table["status"] == "refined"]
    n = agree = recover = nonmono = 0
    errors = []
    for r in refined.itertuples():
        first, g = truth.get((r.trajectory_id, r.classifier), (None, None))
        if first is None:
            continue  # the dense build kept none of its wrong images
        if grid is not None:
            grid_step = r.grid_fp - max(x for x in grid if x < r.grid_fp - 1e-9)
            step = grid_step / 16
        n += 1
        errors.append(abs(r.refined_fp - first))
        agree += abs(r.refined_fp - first) <= step + 1e-9
        if first <= r.grid_fp - grid_step + 1e-9:
            recover += 1  # the dense truth fails at or before the grid's last correct scale
        elif first < r.interval_low - 1e-9:
            nonmono += 1
    return {"n": n, "agree_interval": agree / n if n else None,
            "mean_abs_error": sum(errors) / n if n else None,
            "recover_before_grid": recover, "nonmonotone_in_interval": nonmono}


def prefix_cost(cfg_path: Path, sets: list[str]) -> dict:
    """What a refinement point's generation spends before the LoRA window: a one-point call of
    :func:`pipeline.stages.refine_sampling.generate_points` with the unit's prefix computed
    (cold) and cached (warm), the UNet seconds at timesteps above the threshold, and a
    latent's round trip through the output store (what a cache kept in the output, for
    actor pools that live one round, would cost per unit)."""
    import io

    import torch

    from pipeline.config import load_config
    from pipeline.families.slider import shared_sampler
    from pipeline.io.store import OutputStore
    from pipeline.stages.refine_sampling import PrefixCache, generate_points

    cfg = load_config(str(cfg_path), sets=sets)
    sampler = shared_sampler(cfg, "slider", "cpu", torch.float32)
    threshold = cfg.generator.lora_timestep_threshold
    spent = {"prefix": 0.0, "window": 0.0}
    run_unet = sampler.run_unet

    def timed(sample, t, embeds):
        t0 = time.perf_counter()
        out = run_unet(sample, t, embeds)
        spent["prefix" if int(t) > threshold else "window"] += time.perf_counter() - t0
        return out

    sampler.run_unet = timed
    class_id, shift, calls = int(cfg.benchmark.classes[0]), cfg.benchmark.shifts[0], 5
    generate_points(sampler, class_id, 99, [(shift, 1.25)], PrefixCache())  # warm-up
    cache = PrefixCache()
    spent.update(prefix=0.0, window=0.0)
    t0 = time.perf_counter()
    for seed in range(1, calls + 1):
        generate_points(sampler, class_id, seed, [(shift, 1.25)], cache)
    cold_s = (time.perf_counter() - t0) / calls
    prefix_s = spent["prefix"] / calls
    t0 = time.perf_counter()
    for seed in range(1, calls + 1):
        generate_points(sampler, class_id, seed, [(shift, 1.125)], cache)
    warm_s = (time.perf_counter() - t0) / calls
    latent = sampler.pipe.unet.config.in_channels, cfg.generator.resolution // sampler.pipe.vae_scale_factor
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "cnsbench-bench-refine-cache"
    store = OutputStore(str(work))
    t0 = time.perf_counter()
    for i in range(calls):
        buf = io.BytesIO()
        torch.save(torch.randn(1, latent[0], latent[1], latent[1]), buf)
        store.write_bytes(f"latents/{i}.pt", buf.getvalue())
        torch.load(io.BytesIO(store.read_bytes(f"latents/{i}.pt")))
    cache_s = (time.perf_counter() - t0) / calls
    shutil.rmtree(work, ignore_errors=True)
    return {"call_cold_s": round(cold_s, 4), "call_warm_s": round(warm_s, 4), "prefix_unet_s": round(prefix_s, 4),
            "prefix_share": round(prefix_s / cold_s, 3), "cache_hits": cache.hits,
            "store_roundtrip_s": round(cache_s, 5)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default="/tmp/cnsbench-bench-refine", help="scratch folder for the two builds")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="generator.steps of both builds (the world's: 50)")
    p.add_argument("--classifiers", default=",".join(WORLD_MODELS))
    p.add_argument("--smoke", action="store_true", help="the smallest size: one class and seed, one round")
    p.add_argument("--family", choices=["cns", *FAMILIES], default="cns",
                   help="cns: the demo world's CNS benchmark (default); else that family's world build")
    p.add_argument("--subset", action="store_true", help="a family's world cut to fewer classes, seeds, shifts")
    p.add_argument("--together", action="store_true",
                   help="only the classifiers refined together against one after another, a process per command")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.family != "cns":
        return family_main(args)
    if args.together:
        return together_main(args)
    from pipeline.analyses.refined import read_refined
    from pipeline.io.store import OutputStore
    from pipeline.refine import refine

    classifiers = args.classifiers.split(",")
    sets, rounds = cns_settings(args)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.perf_counter()
    grid_s = build(work / "grid", sets)
    dense_s = build(work / "dense", sets + [f"benchmark.scales={DENSE}", "aggregate.margin_max_scale=3.0"])
    shutil.copytree(work / "grid", work / "together")
    runs = []
    for clf in classifiers:
        t1 = time.perf_counter()
        s = refine(str(work / "grid"), clf, rounds=rounds, runner="local", echo=quiet)
        runs.append({"classifier": clf, "refined": s.refined, "points_made": s.points_made,
                     "points_reused": s.points_reused, "wall_s": round(time.perf_counter() - t1, 2)})
    table = read_refined(OutputStore(str(work / "grid")))
    # The same classifiers in one run (`--classifier a,b,...`), on a copy of the unrefined build.
    t1 = time.perf_counter()
    together = refine(str(work / "together"), classifiers, rounds=rounds, runner="local", echo=quiet)
    together_s = time.perf_counter() - t1
    together_table = read_refined(OutputStore(str(work / "together")))
    key = ["classifier", "trajectory_id"]
    same = table.sort_values(key).reset_index(drop=True).equals(together_table.sort_values(key).reset_index(drop=True))
    truth, dense_images = dense_truth(work / "dense", classifiers)
    result = compare(table, truth, 2.5 / 40)
    made = sum(r["points_made"] for r in runs)
    later = runs[1:]
    later_points = sum(r["points_made"] + r["points_reused"] for r in later)
    result.update({
        "rounds": rounds, "steps": args.steps, "classifiers": classifiers, "smoke": args.smoke,
        "images_refinement": made, "images_dense": dense_images, "images_ratio": made / dense_images,
        "reuse_share": sum(r["points_reused"] for r in later) / later_points if later_points else None,
        "runs": runs, "build_grid_s": round(grid_s, 1), "build_dense_s": round(dense_s, 1),
        "refine_s": round(sum(r["wall_s"] for r in runs), 1),
        "together": {"points_made": together.points_made, "wall_s": round(together_s, 2), "same_rows": bool(same),
                     "images_vs_one_after_another": together.points_made / made if made else None,
                     # each alone (an output of its own): every point its bisection uses is made
                     "images_vs_each_alone": together.points_made / alone if (alone := sum(
                         r["points_made"] + r["points_reused"] for r in runs)) else None,
                     "wall_vs_one_after_another": together_s / sum(r["wall_s"] for r in runs) if runs else None},
        "prefix": prefix_cost(ROOT / "configs" / "demo.yaml", sets),
        "wall_s": round(time.perf_counter() - t0, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    })
    print(json.dumps(result, indent=None if args.json else 1))
    return result


def command(out: Path, classifier: str, rounds: int) -> dict:
    """``cnsbench refine OUT --classifier CLASSIFIER`` in a process of its own: its wall and CPU
    seconds, the points it committed and the load average around it."""
    from pipeline.io.store import OutputStore
    from pipeline.refine import refine_uri

    def committed() -> int:
        store = refine_uri(str(out))
        return sum(len(m.trajectories) for m in OutputStore(store).manifests()) if Path(store).is_dir() else 0

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    argv = [sys.executable, "-m", "pipeline.cli", "refine", str(out), "--classifier", classifier,
            "--rounds", str(rounds), "--runner", "local"]
    before, load = committed(), os.getloadavg()[0]
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    sys.stderr.write(proc.stdout + proc.stderr)  # the command's progress; stdout is the JSON
    if proc.returncode != 0:
        raise SystemExit(f"bench/refine.py: {' '.join(argv[2:])} exited {proc.returncode}")
    return {"classifier": classifier, "points_made": committed() - before, "wall_s": round(wall, 2),
            "cpu_s": round(used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime, 2),
            "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}


def together_main(args) -> dict:
    """The classifiers refined together against one after another (``--together``)."""
    from pipeline.analyses.refined import read_refined
    from pipeline.io.store import OutputStore

    classifiers = args.classifiers.split(",")
    sets, rounds = cns_settings(args)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    load_start, t0 = [round(x, 2) for x in os.getloadavg()], time.perf_counter()
    grid_s = build(work / "grid", sets)
    seq, together = work / "one_after_another", work / "together"
    shutil.copytree(work / "grid", seq)
    shutil.copytree(work / "grid", together)
    runs = [command(seq, clf, rounds) for clf in classifiers]
    both = command(together, ",".join(classifiers), rounds)
    key = ["classifier", "trajectory_id"]
    tables = [read_refined(OutputStore(str(out))).sort_values(key).reset_index(drop=True) for out in (seq, together)]
    for run in runs:  # alone, a classifier makes every probe of its bisection: one per round of its rows
        run["points_alone"] = int(tables[0].loc[tables[0]["classifier"] == run["classifier"], "rounds"].sum())
    made = sum(r["points_made"] for r in runs)
    alone = sum(r["points_alone"] for r in runs)
    wall, cpu = sum(r["wall_s"] for r in runs), sum(r["cpu_s"] for r in runs)
    result = {
        "mode": "together", "classifiers": classifiers, "rounds": rounds, "steps": args.steps, "smoke": args.smoke,
        "extra_sets": sets, "refined_pairs": int((tables[1]["status"] == "refined").sum()),
        "same_rows": bool(tables[0].equals(tables[1])),
        "one_after_another": {"runs": runs, "points_made": made, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)},
        "together": both, "points_each_alone": alone,
        "images_ratio": both["points_made"] / made if made else None,
        "images_vs_each_alone": both["points_made"] / alone if alone else None,
        "wall_ratio": both["wall_s"] / wall if wall else None,
        "cpu_ratio": both["cpu_s"] / cpu if cpu else None,
        "build_grid_s": round(grid_s, 1), "wall_s": round(time.perf_counter() - t0, 1),
        "load_average_start": load_start, "load_average_end": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result, indent=None if args.json else 1))
    return result


def family_main(args) -> dict:
    """A family's world build against its dense grid (``--family``)."""
    from pipeline.aggregate.run import load_sound_tables
    from pipeline.analyses.refined import read_refined
    from pipeline.config import load_config
    from pipeline.io.store import OutputStore
    from pipeline.refine import refine, refine_uri

    fam = FAMILIES[args.family]
    classifiers = args.classifiers.split(",")
    sets = [f"generator.steps={args.steps}", "aggregate.plots=false", "aggregate.strips.count=0", *fam["sets"]]
    rounds, subset = args.rounds, "the whole world"
    if args.smoke:
        sets += fam["smoke"]
        rounds, subset = 1, "smoke: " + ", ".join(fam["smoke"])
    elif args.subset:
        sets += fam["subset"]
        subset = fam["subset_words"]
    group = load_config(str(ROOT / "configs" / fam["config"]), sets=sets).family_groups()[fam["group"]]
    grid, shifts = list(group.scales), set(group.shifts)
    dense = dense_scales(grid)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.perf_counter()
    grid_s = build(work / "grid", sets, fam["config"])
    dense_s = build(work / "dense", sets + [f"{fam['scales_key']}={dense}"], fam["config"])
    t1 = time.perf_counter()
    summary = refine(str(work / "grid"), classifiers, rounds=rounds, runner="local", echo=quiet)
    refine_s = time.perf_counter() - t1
    table = read_refined(OutputStore(str(work / "grid")))
    table = table[table["shift"].isin(shifts)]
    truth, _ = dense_truth(work / "dense", classifiers)
    dense_samples, _, _ = load_sound_tables(OutputStore(str(work / "dense")), classifiers)
    images_dense = int(dense_samples["shift"].isin(shifts).sum())
    made, _, _ = load_sound_tables(OutputStore(refine_uri(str(work / "grid"))), classifiers)
    images_family = int(made["shift"].isin(shifts).sum())
    result = compare(table, truth, 0.0, grid=grid)
    result.update({
        "family": args.family, "kind": group.kind, "config": f"configs/{fam['config']}", "subset": subset,
        "extra_sets": sets, "grid": grid, "dense_scales": len(dense), "shifts": sorted(shifts),
        "rounds": rounds, "steps": args.steps, "classifiers": classifiers, "smoke": args.smoke,
        "failing_pairs": int((table["status"] == "refined").sum()),
        "images_refinement": images_family, "images_dense": images_dense,
        "images_ratio": images_family / images_dense if images_dense else None,
        "images_refinement_other_families": int(len(made) - images_family),
        "points_made": summary.points_made, "refine_rejected": int(table["rejected"].sum()),
        "build_grid_s": round(grid_s, 1), "build_dense_s": round(dense_s, 1), "refine_s": round(refine_s, 1),
        "wall_s": round(time.perf_counter() - t0, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    })
    print(json.dumps(result, indent=None if args.json else 1))
    return result


if __name__ == "__main__":
    main()
