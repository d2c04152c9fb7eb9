"""Robustness cards over a suite, timed as a user runs them: ``cnsbench card`` per model, then
``cnsbench leaderboard``, each a command of its own.

    python bench/card.py --json        # the world's four classifiers over configs/suite_world.yaml

Two phases (``--phases``): ``fresh`` starts from nothing built (the suite's outputs folder
``WORK/outputs`` and the cards removed first: the first card builds every benchmark),
``built`` runs the same commands again on the outputs the first phase left (the cards
removed, the outputs kept: each card only computes its metrics, and adds nothing).  Each
command runs in its own interpreter (``python -m pipeline.cli``, offline, ``--runner local``
by default) as typed at a shell; its wall time and CPU time (children's user + system)
are measured, with the machine's load average before and after (a shared machine
stretches wall time).  Prints one JSON object (``--json``).
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
WORLD_MODELS = ("linear", "cnn", "vit", "clip-zs")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_step(name: str, argv: list[str], log: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cpu0, t0 = _cpu(), time.perf_counter()
    with open(log, "a") as out:
        out.write(f"$ cnsbench {' '.join(argv)}\n")
        out.flush()
        rc = subprocess.run([sys.executable, "-m", "pipeline.cli", *argv], cwd=ROOT, env=env, stdout=out,
                            stderr=subprocess.STDOUT).returncode
    wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
    if rc != 0:
        raise SystemExit(f"bench/card.py: `cnsbench {' '.join(argv)}` exited {rc}; see {log}")
    return {"step": name, "command": "cnsbench " + " ".join(argv), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}


def phase(name: str, suite: str, models: list[str], work: Path, runner: str, log: Path) -> dict:
    if name == "fresh":
        shutil.rmtree(work / "outputs", ignore_errors=True)
    shutil.rmtree(work / "cards", ignore_errors=True)
    shutil.rmtree(work / "leaderboard", ignore_errors=True)
    load0 = os.getloadavg()
    steps = []
    for m in models:
        steps.append(run_step(f"card {m}", ["card", m, "--suite", suite, "--output", str(work / "cards" / m),
                                            "--outputs", str(work / "outputs"), "--runner", runner], log))
    steps.append(run_step("leaderboard", ["leaderboard", *(str(work / "cards" / m) for m in models),
                                          "--output", str(work / "leaderboard")], log))
    return {
        "steps": steps,
        "wall_s": round(sum(s["wall_s"] for s in steps), 2),
        "cpu_s": round(sum(s["cpu_s"] for s in steps), 2),
        "load_average_before": [round(x, 2) for x in load0],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default=str(ROOT / "configs" / "suite_world.yaml"))
    p.add_argument("--models", default=",".join(WORLD_MODELS), help="comma-separated models (MODEL of cnsbench card)")
    p.add_argument("--work", default="/tmp/cnsbench-bench-card", help="scratch folder: outputs/, cards/, leaderboard/")
    p.add_argument("--phases", default="fresh,built", help="fresh (from nothing built), built (outputs kept)")
    p.add_argument("--runner", default="local", choices=("local", "ray"))
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "commands.log"
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    out = {"suite": args.suite, "models": models, "runner": args.runner, "cpus": os.cpu_count(), "log": str(log)}
    for name in [x.strip() for x in args.phases.split(",") if x.strip()]:
        if name not in ("fresh", "built"):
            raise SystemExit(f"--phases: unknown phase {name!r} (fresh, built)")
        out[name] = phase(name, args.suite, models, work, args.runner, log)
    if args.json:
        print(json.dumps(out))
    else:
        for name in ("fresh", "built"):
            if name in out:
                print(f"{name}: {out[name]['wall_s']:.1f} s wall, {out[name]['cpu_s']:.1f} CPU-s")
                for s in out[name]["steps"]:
                    print(f"  {s['step']:<16} {s['wall_s']:8.1f} s {s['cpu_s']:8.1f} CPU-s")
    return out


if __name__ == "__main__":
    main()
