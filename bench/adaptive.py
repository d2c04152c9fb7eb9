"""Adaptive builds against the uniform build they sample from, on the demo world (docs/adaptive.md).

    python bench/adaptive.py --json            # the world over seeds 1..16, targets 0.3, 0.2, 0.15, 4 seed orders
    python bench/adaptive.py --json --smoke    # the suite's size: the tiny config over seeds 1..4

Builds the world's CNS benchmark (configs/demo_adaptive.yaml without its ``sampling``) uniformly
over every seed as the truth.  An adaptive build's images are a subset of it (ids and seeds from
coordinates) and its allocation is a pure function of what is committed, so every adaptive build
is replayed from the truth's committed tables (:func:`pipeline.aggregate.adaptive.replay`: the
rounds the build makes) at each target, repeated over other seed orders (the seed list rotated,
so each repetition's pilot and rounds take other seeds).  ``--smoke`` also runs the adaptive
build itself (in process) and checks that its allocation is the replay's and its images the
truth's.  Figures per target, over the repetitions:

* ``images_ratio``: the adaptive build's images over the uniform build's;
* ``coverage``: the share of reported cells (accuracy per (classifier, shift, scale), the drop
  at every non-zero scale, the mean failure point per (classifier, shift)) whose uniform value
  lies inside the adaptive build's interval;
* ``kendall_tau``: Kendall's τ of each shift's classifier ranking (mean accuracy over the scales)
  against the uniform build's, averaged over shifts and repetitions;
* ``efficiency``: the images a uniform build needs for the adaptive build's achieved widths,
  over the adaptive build's images.  Both designs' widths are computed from the truth's
  per-stratum variances (the design's precision, not one draw's): the uniform build needs the
  fewest seeds per stratum whose widest cell (width over its target) is no wider than the
  adaptive build's widest; both counts include every image (the pilot's too).  The widest
  cell, not each cell: a uniform build held to every cell's width would be charged for the
  cells an adaptive build made narrower than their targets ask, so any departure from equal
  seeds (one stratum with a seed more) would score above 1;
* ``oracle_efficiency``: the same figure for the allocation made knowing the truth's
  per-stratum variances (:func:`oracle`: from the pilot, each trajectory where it narrows the
  widest cell most) within the adaptive build's images: the ceiling any allocation rule
  reaches on this world, as the pilot's few seeds can only estimate those variances;
* ``efficiency_fractional``, ``oracle_efficiency_fractional``: the same two figures with the
  uniform design's seeds per stratum a real number (not rounded up to whole seeds): how much of
  the efficiency is the uniform build's rounding up (a diagnostic; the contract's figure is
  ``efficiency``, whole seeds, as a uniform build is made).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.aggregate import stratified  # noqa: E402
from pipeline.aggregate.adaptive import group_arrays, group_cells, replay, stratum_costs  # noqa: E402
from pipeline.aggregate.run import load_sound_tables  # noqa: E402
from pipeline.config import parse_config  # noqa: E402
from pipeline.io.store import OutputStore  # noqa: E402
from pipeline.plan.adaptive import strata_of  # noqa: E402


def world_raw(seeds: int) -> dict:
    raw = yaml.safe_load((ROOT / "configs" / "demo_adaptive.yaml").read_text())
    raw["benchmark"]["seeds"] = f"1..{seeds}"
    return raw


def smoke_raw(directory: Path) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from buildproc import tiny_config

    from pipeline.demo.assets import ensure_tiny_assets

    # Built once per checkout; its notice goes to stderr, so that --json's stdout stays JSON.
    ensure_tiny_assets(echo=lambda m: print(m, file=sys.stderr))
    raw = yaml.safe_load(tiny_config(directory).read_text())
    raw["benchmark"]["seeds"] = "1..4"
    raw["aggregate"] = {**raw.get("aggregate", {}), "bootstrap": {"resamples": 0}}
    raw["sampling"] = {"target": 0.3, "max_images": 96, "pilot": 2, "round_size": 2}
    return raw


def uniform(raw: dict) -> dict:
    return {k: v for k, v in raw.items() if k != "sampling"}


def build(raw: dict, out: Path, base: Path) -> None:
    from pipeline.build import build as run_build

    run_build(parse_config(raw, "bench", base), str(out), runner="local", echo=lambda m: None)


def cell_values(found: stratified.Cells) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimates, half-widths, targets' index 0 accuracy / 1 failure point) of the reported cells."""
    _, _, s = found.shape
    drop_mask = np.ones(found.drop.estimate.shape, dtype=bool).reshape(-1, s)
    drop_mask[:, 0] = False
    est = np.concatenate([found.accuracy.estimate, found.drop.estimate[drop_mask.ravel()], found.fp_mean.estimate])
    half = np.concatenate([found.accuracy.half, found.drop.half[drop_mask.ravel()], found.fp_mean.half])
    kind = np.concatenate([np.zeros(found.accuracy.estimate.size + int(drop_mask.sum())), np.ones(found.fp_mean.estimate.size)])
    loads = np.concatenate([found.accuracy.load, found.drop.load[:, drop_mask.ravel()], found.fp_mean.load], axis=1)
    return est, half, kind, loads


def design_width(loads: np.ndarray, n: np.ndarray, n_pop: int, z: float, goals: np.ndarray) -> float:
    """The widest cell (half-width over its target) of a design with ``n`` seeds per stratum."""
    fpc = np.clip(1 - n / n_pop, 0, 1) / np.maximum(n, 1)
    return float(np.nanmax(z * np.sqrt(loads.T @ fpc) / goals))


def uniform_need(loads: np.ndarray, width: float, n_pop: int, z: float, goals: np.ndarray, strata: int) -> int:
    """The fewest seeds per stratum of a uniform design whose widest cell is no wider than ``width``."""
    return next((n for n in range(1, n_pop + 1)
                 if design_width(loads, np.full(strata, float(n)), n_pop, z, goals) <= width + 1e-12), n_pop)


def uniform_need_fractional(loads: np.ndarray, width: float, n_pop: int, z: float, goals: np.ndarray,
                            strata: int) -> float:
    """:func:`uniform_need` without the rounding up to whole seeds: the seeds per stratum (a
    real number, by bisection) at which a uniform design's widest cell is ``width``.  A uniform
    build cannot make a fraction of a seed, so the efficiency rounds up; this shows how much of
    it is that rounding."""
    lo, hi = 1.0, float(n_pop)
    if design_width(loads, np.full(strata, lo), n_pop, z, goals) <= width:
        return lo
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if design_width(loads, np.full(strata, mid), n_pop, z, goals) <= width else (mid, hi)
    return hi


def oracle(loads: np.ndarray, goals: np.ndarray, n_pop: int, z: float, pilot: int, images: list[int],
           budget: int) -> tuple[np.ndarray, float]:
    """The allocation an adaptive build would make knowing the truth's variances: from the pilot,
    one trajectory at a time to the stratum that narrows the widest cells most (a soft maximum,
    the sum of each cell's width over its target to the 16th power, so that cells tied at the
    top do not stall it), within ``budget`` images; (seeds per stratum, its widest cell).  The
    ceiling of an allocation rule's efficiency, up to the greedy's own slack."""
    def soft(n: np.ndarray) -> float:
        fpc = np.clip(1 - n / n_pop, 0, 1) / np.maximum(n, 1)
        w = z * np.sqrt(loads.T @ fpc) / goals
        return float(np.nansum(w ** 16))

    n = np.full(len(images), float(pilot))
    spent = int(n @ np.asarray(images))
    while True:
        best, score = -1, soft(n)
        for h in range(len(n)):
            if n[h] >= n_pop or spent + images[h] > budget:
                continue
            n[h] += 1
            v = soft(n)
            n[h] -= 1
            if v < score:
                best, score = h, v
        if best < 0:
            return n, design_width(loads, n, n_pop, z, goals)
        n[best] += 1
        spent += images[best]


def kendall(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import kendalltau

    tau = kendalltau(a, b).statistic
    return float(tau) if np.isfinite(tau) else 1.0


def measure(raw: dict, truth_out: Path, targets: list[float], repeats: int, base: Path) -> dict:
    truth_cfg = parse_config(uniform(raw), "truth", base)
    samples, predictions, _ = load_sound_tables(OutputStore(str(truth_out)), [c.name for c in truth_cfg.classifiers])
    attempted = set(samples["trajectory_id"].astype(str))
    seeds = list(truth_cfg.benchmark.seeds)
    results = {}
    for target in targets:
        rows = []
        for r in range(repeats):
            shift = (r * len(seeds)) // repeats
            rraw = json.loads(json.dumps(raw))
            rraw["benchmark"]["seeds"] = seeds[shift:] + seeds[:shift]
            rraw["sampling"]["target"] = target
            rraw["sampling"].pop("failure_point_target", None)
            cfg = parse_config(rraw, "adaptive", base)
            sched = replay(cfg, samples, predictions, attempted)
            strata = sched.strata
            images, _ = stratum_costs(cfg, strata)
            alloc = np.asarray(sched.current)
            n_img = int((alloc * np.asarray(images)).sum())
            full = len(seeds) * int(sum(images))
            top = max(max(g.scales) for g in cfg.family_groups())
            z = stratified.z_of(cfg.sampling.level)
            hit = total = 0
            taus, worst_adaptive, loads_all, goals_all = [], [], [], []
            for ga in group_arrays(cfg, samples, predictions, strata):
                truth = group_cells(cfg, ga)
                found = group_cells(cfg, ga, ga.rank < alloc[ga.stratum])
                t_est, _, kind, loads = cell_values(truth)
                a_est, a_half, _, _ = cell_values(found)
                ok = np.isfinite(t_est) & np.isfinite(a_est)
                hit += int((np.abs(t_est - a_est)[ok] <= a_half[ok] + 1e-12).sum())
                total += int(ok.sum())
                c, h, s = truth.shape
                t_rank = truth.accuracy.estimate.reshape(c, h, s).mean(axis=2)
                a_rank = found.accuracy.estimate.reshape(c, h, s).mean(axis=2)
                taus += [kendall(t_rank[:, k], a_rank[:, k]) for k in range(h)]
                goals = np.where(kind == 1, cfg.sampling.fp_target(top), target)
                loads_all.append(loads)
                goals_all.append(goals)
            loads, goals = np.concatenate(loads_all, axis=1), np.concatenate(goals_all)
            achieved = design_width(loads, alloc.astype(float), len(seeds), z, goals)
            need = uniform_need(loads, achieved, len(seeds), z, goals, len(alloc))
            fractional = uniform_need_fractional(loads, achieved, len(seeds), z, goals, len(alloc))
            best, best_width = oracle(loads, goals, len(seeds), z, cfg.sampling.pilot, images, n_img)
            best_need = uniform_need(loads, best_width, len(seeds), z, goals, len(alloc))
            best_fractional = uniform_need_fractional(loads, best_width, len(seeds), z, goals, len(alloc))
            best_images = int(best @ np.asarray(images))
            rows.append({"images": n_img, "uniform_images": full, "rounds": len(sched.rounds), "stop": sched.stop,
                         "coverage": hit / total if total else float("nan"), "kendall_tau": float(np.mean(taus)),
                         "uniform_seeds_needed": need, "efficiency": need * int(sum(images)) / n_img,
                         "efficiency_fractional": fractional * int(sum(images)) / n_img,
                         "oracle_efficiency": best_need * int(sum(images)) / best_images,
                         "oracle_efficiency_fractional": best_fractional * int(sum(images)) / best_images})
        results[str(target)] = {
            "images_ratio": float(np.mean([x["images"] / x["uniform_images"] for x in rows])),
            "coverage": float(np.mean([x["coverage"] for x in rows])),
            "kendall_tau": float(np.mean([x["kendall_tau"] for x in rows])),
            "efficiency": float(np.mean([x["efficiency"] for x in rows])),
            "efficiency_fractional": float(np.mean([x["efficiency_fractional"] for x in rows])),
            "oracle_efficiency": float(np.mean([x["oracle_efficiency"] for x in rows])),
            "oracle_efficiency_fractional": float(np.mean([x["oracle_efficiency_fractional"] for x in rows])),
            "repeats": rows,
        }
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="the tiny config over seeds 1..4, a real adaptive build too")
    ap.add_argument("--seeds", type=int, default=16, help="seeds of the uniform truth (at least 16 for the record)")
    ap.add_argument("--targets", default="0.3,0.2,0.15")
    ap.add_argument("--repeats", type=int, default=4, help="seed orders per target")
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench_adaptive"), help="where the truth is built (reused)")
    args = ap.parse_args(argv)
    work = Path(args.work) / ("smoke" if args.smoke else f"world_{args.seeds}")
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    doc: dict = {}
    if args.smoke:
        raw, base, targets, repeats = smoke_raw(work), work, [0.3], 2
    else:
        raw, base = world_raw(args.seeds), ROOT / "configs"
        targets, repeats = [float(t) for t in args.targets.split(",")], args.repeats
    build(uniform(raw), work / "truth", base)
    doc["truth_build_s"] = round(time.perf_counter() - start, 1)
    if args.smoke:  # the build itself: its allocation is the replay's, its images the truth's
        import shutil

        from pipeline.io.digest import output_digest  # noqa: F401 - the same reader the digest uses
        from pipeline.io.tables import load_samples

        shutil.rmtree(work / "adaptive", ignore_errors=True)
        build(raw, work / "adaptive", base)
        mine = load_samples(OutputStore(str(work / "adaptive")))
        theirs = load_samples(OutputStore(str(work / "truth")))
        report = json.loads((work / "adaptive" / "report" / "metrics.json").read_text())
        truth_samples, truth_preds, _ = load_sound_tables(OutputStore(str(work / "truth")))
        cfg = parse_config(raw, "adaptive", base)
        sched = replay(cfg, truth_samples, truth_preds, set(truth_samples["trajectory_id"]))
        built = [r["seeds"] for r in report["sampling"]["seeds_per_stratum"]]
        doc["build"] = {"subset_of_uniform": set(mine["sample_id"]) <= set(theirs["sample_id"]),
                        "same_allocation_as_replay": built == list(sched.current),
                        "every_accuracy_row_has_interval": all(
                            r.get("accuracy_ci_low") is not None and r.get("accuracy_ci_high") is not None
                            for r in report["accuracy"] if r.get("accuracy") is not None),
                        "images": int(len(mine)), "stop": report["sampling"]["stop"]}
    doc["targets"] = measure(raw, work / "truth", targets, repeats, base)
    doc["wall_s"] = round(time.perf_counter() - start, 1)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        for t, r in doc["targets"].items():
            print(f"target {t}: images_ratio {r['images_ratio']:.3f}  coverage {r['coverage']:.3f}  "
                  f"kendall_tau {r['kendall_tau']:.3f}  efficiency {r['efficiency']:.2f}  "
                  f"(fractional {r['efficiency_fractional']:.2f})  oracle_efficiency {r['oracle_efficiency']:.2f} "
                  f"(fractional {r['oracle_efficiency_fractional']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
