"""The Ray path's CPU per image at HEAD against a reference commit, back to back on one machine.

Runs ``bench/scale.py --calibrate-only`` (the simulated build's calibration: real driver, Ray
Data, object store and writer, stand-in models) alternately from the reference commit's tree
and from this one (reference, HEAD, reference, HEAD, ...: the machine's drift falls on both),
each from its own tree with ``PYTHONPATH`` at it, and prints the medians and their ratios:

* ``cpu_s_per_image``: every process of the simulation, per image, in the steady part;
* ``driver_cpu_s_per_1000_images``: the driver's main thread over the build;
* ``workers_cpu_s_per_1000_images``: the Ray workers (``default_worker.py``) over the build,
  on a cluster (else the stage actors' own batch CPU: ``--cluster none``).

The reference is recorded in ``bench/overhead_reference.json``; it moves only when a cost is
accepted on purpose, with the reason in BENCHMARKS.md ("Per-image overhead against a
reference commit: the Ray path's CPU bisected (2026-12-07)").  The reference tree is a
detached git worktree made for the run and removed after it (``--reference-tree``: an
existing checkout instead).  A shared machine's load is printed with
each run: compare CPU seconds, not wall time, and read medians.

    python bench/overhead.py --json                           # the contract's size, 3 runs each
    python bench/overhead.py --runs 1 --smallest --json       # the suite's size
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_FILE = ROOT / "bench" / "overhead_reference.json"
# The suite's size: one class, two seeds, two shifts, three classifiers, in this process's own Ray.
SMALLEST = ["--cluster", "none", "--gpus", "1", "--classes", "1", "--seeds", "2", "--shifts", "2",
            "--classifiers", "3", "--writers", "1", "--calibrate-units", "2", "--calibrate-hold-s", "3"]
METRICS = ("cpu_s_per_image", "driver_cpu_s_per_1000_images", "workers_cpu_s_per_1000_images")


def recorded_reference() -> dict:
    """The recorded reference: ``{"commit": sha, "reason": why}``."""
    try:
        ref = json.loads(REFERENCE_FILE.read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"{REFERENCE_FILE}: cannot read the recorded reference commit: {err}") from None
    if not isinstance(ref, dict) or not isinstance(ref.get("commit"), str):
        raise SystemExit(f"{REFERENCE_FILE}: no \"commit\" string in it")
    return ref


def git(*args: str) -> str:
    proc = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"git {' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip()


def figures(cal: dict) -> dict:
    """The three figures of one calibration (``bench/scale.py --calibrate-only --json``)."""
    per_k = cal["cpu_s_per_1000_images"]
    workers = cal.get("cpu_s_by_process", {}).get("default_worker.py")
    if workers is not None:
        workers = workers * 1000 / max(1, cal["images"])
    else:  # no cluster meter (--cluster none): the stage actors' own CPU in their batches
        workers = sum(v for k, v in per_k.items() if k == "writer" or k.endswith("_batches"))
    return {"cpu_s_per_image": cal["cpu_s_per_image"], "driver_cpu_s_per_1000_images": per_k["driver"],
            "workers_cpu_s_per_1000_images": workers}


def calibrate(tree: Path, size: list[str]) -> dict:
    """One calibration from ``tree``'s own bench and package, with this machine's load around it."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    load0, t0 = os.getloadavg()[0], time.time()
    proc = subprocess.run([sys.executable, str(tree / "bench" / "scale.py"), "--calibrate-only", "--json", *size],
                          cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{tree}: bench/scale.py --calibrate-only failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    cal = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**figures(cal), "wall_s": round(time.time() - t0, 1), "load": [round(load0, 1), round(os.getloadavg()[0], 1)],
            "cpu_s_by_process": cal.get("cpu_s_by_process", {})}  # where a ratio above 1 comes from


def compare(ref_runs: list[dict], head_runs: list[dict]) -> dict:
    """Medians of each figure, and HEAD's over the reference's."""
    out = {}
    for m in METRICS:
        ref, head = statistics.median(r[m] for r in ref_runs), statistics.median(r[m] for r in head_runs)
        out[m] = {"reference": round(ref, 6), "head": round(head, 6), "ratio": round(head / ref, 3) if ref > 0 else None}
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reference", help="the reference commit (default: bench/overhead_reference.json's)")
    p.add_argument("--reference-tree", type=Path, help="an existing checkout to use as the reference")
    p.add_argument("--runs", type=int, default=3, help="calibrations of each tree, alternating")
    p.add_argument("--smallest", action="store_true", help="the suite's size (in-process Ray, 24 images)")
    p.add_argument("--json", action="store_true")
    args, size = p.parse_known_args(argv)
    if args.runs < 1:
        raise SystemExit("--runs must be at least 1")
    size = [*(SMALLEST if args.smallest else []), *size]
    workdir, ref_tree = None, args.reference_tree
    if ref_tree is not None:
        if not (ref_tree / "bench" / "scale.py").is_file():
            raise SystemExit(f"--reference-tree {ref_tree}: no bench/scale.py there")
        commit = git("-C", str(ref_tree), "rev-parse", "HEAD") if (ref_tree / ".git").exists() else str(ref_tree)
    else:
        commit = git("rev-parse", "--verify", (args.reference or recorded_reference()["commit"]) + "^{commit}")
        workdir = Path(tempfile.mkdtemp(prefix="cnsoverhead-"))
        ref_tree = workdir / commit[:12]
        git("worktree", "add", "--detach", str(ref_tree), commit)
    runs: dict[str, list[dict]] = {"reference": [], "head": []}
    try:
        for i in range(args.runs):
            for name, tree in (("reference", ref_tree), ("head", ROOT)):
                run = calibrate(tree, size)
                runs[name].append(run)
                print(f"[overhead] {name} run {i + 1}: {json.dumps(run)}", file=sys.stderr, flush=True)
    finally:
        if workdir is not None:
            git("worktree", "remove", "--force", str(ref_tree))
            shutil.rmtree(workdir, ignore_errors=True)
    result = {"reference": commit, "head": git("rev-parse", "HEAD"), "runs": runs,
              **compare(runs["reference"], runs["head"]),
              "command": " ".join(["python bench/overhead.py", *(argv if argv is not None else sys.argv[1:])]),
              "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
