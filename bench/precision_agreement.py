"""Agreement of the filter's and the classifiers' reduced precisions with float32, on the demo world.

    python bench/precision_agreement.py --json                    # builds the demo world first (configs/demo.yaml)
    python bench/precision_agreement.py --world runs/demo --json  # an existing `cnsbench demo` output
    python bench/precision_agreement.py --smoke --json            # a 1-class, 1-seed, 1-shift world at 4 steps

Every image of the world's build (filtered out or not, all trajectories) goes through the
filter stage and the classify stage of the world's config (``FilterStage``,
``ClassifyStage``: the world's trained CLIP + DINOv2 filter and its four trained
classifiers) with ``resources.<stage>.precision`` set to each setting: float32, tf32,
bfloat16, and float32 and bfloat16 with ``channels_last``, on this machine's device (the
CPU unless a GPU is there; on a CPU tf32 is float32).  Per setting it reports, against
the float32 run: per classifier the share of images whose top-1 is float32's, and the
accuracy; for the filter the share of keep decisions that are float32's, per detector the
share of its pass decisions that are float32's and the largest score difference; and
each stage's seconds.  The float32 run is also checked against the build's stored keep
decisions and predictions (equal when the build ran on this machine).

``--json`` prints one JSON object; without it, the same indented.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SETTINGS = [("float32", False), ("tf32", False), ("bfloat16", False), ("float32", True), ("bfloat16", True)]
# The smoke world: one trajectory, a few steps, a report without figures (the suite runs it).
SMOKE_SETS = ["benchmark.classes=[zero]", "benchmark.seeds=[1]", "benchmark.shifts=[blur]", "generator.steps=4",
              "aggregate.plots=false", "aggregate.bootstrap.resamples=0", "aggregate.strips.count=0"]


def build_world(config: Path, out: Path, sets: list[str]) -> None:
    """``cnsbench build`` of ``config`` in this process into ``out``."""
    from pipeline.cli import main

    args = ["build", str(config), "--output", str(out), "--runner", "local"]
    for s in sets:
        args += ["--set", s]
    if main(args) != 0:
        raise SystemExit(f"precision_agreement: the world build into {out} failed")


def read_world(out: Path) -> tuple[list[dict[str, Any]], Any, Any]:
    """The build's trajectories as filter-stage input rows (images as stored), and its samples
    and predictions tables."""
    import pandas as pd

    from pipeline.io.webdataset import iter_tar

    samples = pd.concat([pd.read_parquet(p) for p in sorted((out / "samples").glob("*.parquet"))])
    preds = pd.concat([pd.read_parquet(p) for p in sorted((out / "predictions").glob("*.parquet"))])
    images: dict[str, bytes] = {}
    for tar in sorted((out / "images").glob("*.tar")):
        for key, members in iter_tar(tar.read_bytes(), str(tar)):
            images[key] = next(v for ext, v in members.items() if ext != "json")
    rows = []
    for tid, group in samples.sort_values(["trajectory_id", "scale"]).groupby("trajectory_id", sort=True):
        first = group.iloc[0]
        rows.append({
            "trajectory_id": tid, "unit_id": tid, "class_id": int(first["class_id"]),
            "class_name": first["class_name"], "seed": int(first["seed"]), "shift": first["shift"],
            "scales": [float(s) for s in group["scale"]], "sample_ids": list(group["sample_id"]),
            "images": [images[s] for s in group["sample_id"]], "params": None, "error": None,
        })
    return rows, samples.set_index("sample_id"), preds


def run_setting(config: Path, sets: list[str], precision: str, channels_last: bool, rows: list[dict], device: str):
    """The filter and classify stages at one setting over ``rows``: per-image results and seconds."""
    from pipeline.config import load_config
    from pipeline.stages.classify import ClassifyStage
    from pipeline.stages.filter import FilterStage

    extra = [f"resources.{stage}.{key}={value}" for stage in ("filter", "classify")
             for key, value in (("precision", precision), ("channels_last", str(channels_last).lower()))]
    cfg = load_config(config, sets=[*sets, *extra])
    seconds = {}
    filtered = rows
    for name, stage in (("filter", FilterStage(cfg, device=device)), ("classify", ClassifyStage(cfg, device=device))):
        stage.ensure_setup()
        start = time.perf_counter()
        filtered = stage.process(filtered)
        seconds[name] = round(time.perf_counter() - start, 3)
    names = [c.name for c in cfg.classifiers]
    per_image: dict[str, dict[str, Any]] = {}
    for r in filtered:
        for i, sid in enumerate(r["sample_ids"]):
            per_image[sid] = {
                "class_id": r["class_id"], "kept": bool(r["kept"][i]), "n_pass": int(r["n_pass"][i]),
                "scores": {c: float(r[c][i]) for c in ("clip_text", "clip_shift_text", "clip_image", "dino_image")},
                "top1": dict(zip(names, r["pred_top1"][i], strict=True)),
            }
    return per_image, seconds, names, cfg.filter.thresholds


def compare(base: dict, other: dict, names: list[str], thresholds) -> dict[str, Any]:
    """``other`` against ``base`` (float32), over the images both have."""
    ids = sorted(base)
    n = len(ids)
    out: dict[str, Any] = {
        "top1_agreement": {c: round(sum(base[s]["top1"][c] == other[s]["top1"][c] for s in ids) / n, 4) for c in names},
        "accuracy": {c: round(sum(other[s]["top1"][c] == other[s]["class_id"] for s in ids) / n, 4) for c in names},
        "kept_agreement": round(sum(base[s]["kept"] == other[s]["kept"] for s in ids) / n, 4),
        "kept_changed": sum(base[s]["kept"] != other[s]["kept"] for s in ids),
        "n_pass_agreement": round(sum(base[s]["n_pass"] == other[s]["n_pass"] for s in ids) / n, 4),
        "kept_share": round(sum(other[s]["kept"] for s in ids) / n, 4),
    }
    detectors = {}
    for d in ("clip_text", "clip_shift_text", "clip_image", "dino_image"):
        t = getattr(thresholds, d)
        same = sum((base[s]["scores"][d] > t) == (other[s]["scores"][d] > t) for s in ids)
        diff = max(abs(base[s]["scores"][d] - other[s]["scores"][d]) for s in ids)
        detectors[d] = {"pass_agreement": round(same / n, 4), "max_abs_score_diff": float(f"{diff:.4g}")}
    out["detectors"] = detectors
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    ap.add_argument("--world", help="an existing build of --config (default: build one in a temporary directory)")
    ap.add_argument("--smoke", action="store_true", help="a 1-class, 1-seed, 1-shift world at 4 steps")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = Path(args.config)
    sets = SMOKE_SETS if args.smoke else []
    with tempfile.TemporaryDirectory(prefix="precision-agreement-") as tmp:
        world = Path(args.world) if args.world else Path(tmp) / "world"
        build_seconds = None
        if not args.world:
            start = time.perf_counter()
            build_world(config, world, sets)
            build_seconds = round(time.perf_counter() - start, 1)
        rows, samples, preds = read_world(world)
    runs = {}
    for precision, channels_last in SETTINGS:
        key = precision + ("+channels_last" if channels_last else "")
        runs[key] = run_setting(config, sets, precision, channels_last, rows, device)
        print(f"[precision_agreement] {key}: {runs[key][1]}", file=sys.stderr)
    base, _, names, thresholds = runs["float32"]
    stored_top1 = {(r.sample_id, r.classifier): int(r.top1) for r in preds.itertuples()}
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "config": str(config),
        "images": len(base),
        "trajectories": len(rows),
        "classifiers": names,
        "build_seconds": build_seconds,
        "float32_equals_build": {
            "kept": all(bool(samples.loc[s, "kept"]) == v["kept"] for s, v in base.items()),
            "top1": all(stored_top1[(s, c)] == v["top1"][c] for s, v in base.items() for c in names),
        },
        "settings": {},
    }
    for key, (per_image, seconds, _, _) in runs.items():
        result["settings"][key] = {**compare(base, per_image, names, thresholds), "seconds": seconds}
    print(json.dumps(result, indent=None if args.json else 1))
    return result


if __name__ == "__main__":
    main()
