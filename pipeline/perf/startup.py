"""How long a stage's actor takes to start: its process and imports, then its models' loading.

An actor of a stage costs, before its first batch, the process start and the imports of
that stage (measured per stage), its models' weights read and built at the stage's measured
rate (seconds per GiB of weights, as built in float32; timm's models are built initialised,
then loaded), and, for a zero-shot CLIP classifier, its head (the
text tower over 1000 classes x 80 templates, measured on a GPU).  The figures are measured by
the rehearsal (``bench/rehearsal.py startup``: every stage's real ``setup`` on the
rehearsal's model cache, in a fresh process each) and kept in ``data/startup.json``, which
this module regenerates from that command's JSON output::

    python bench/rehearsal.py startup --cache /tmp/rh --json > startup-run.json
    python -m pipeline.perf.startup --write startup-run.json

Stages load their models at their first batch (``Stage.ensure_setup``), so along a chain the
first unit waits for each stage's start-up in turn: :func:`chain_seconds` sums them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pipeline.perf.data import DATA, emit, load_data

FILE = DATA / "startup.json"
GIB = 1024**3
STAGES = ("generate", "filter", "classify", "write")


def known() -> bool:
    return FILE.is_file()


def actor_seconds(stage: str, weight_bytes: int, zero_shot_heads: int = 0) -> float:
    """Start-up of one actor of ``stage`` that loads ``weight_bytes`` of weights (as stored)
    and builds ``zero_shot_heads`` zero-shot heads (0 when nothing is measured)."""
    if not known():
        return 0.0
    data = load_data(FILE.name)
    rate = data["load_s_per_gib"].get(stage, data["load_s_per_gib"]["all"])
    return data["imports_s"].get(stage, 0.0) + weight_bytes / GIB * rate + zero_shot_heads * data["zero_shot_head_s"]


def source() -> str:
    """Where the start-up figures come from, for an estimate's assumptions."""
    if not known():
        return "no start-up measurement (pipeline/data/startup.json): start-up counted as 0"
    data = load_data(FILE.name)
    return f"{data['source']}; zero-shot heads: {data['zero_shot_head_source']}"


def chain_seconds(actors: list[tuple[str, float]]) -> float:
    """The first unit's wait along a chain of (stage, start-up seconds): each stage loads at its first batch."""
    return sum(seconds for _, seconds in actors)


def from_rehearsal(run: dict[str, Any]) -> dict[str, Any]:
    """``data/startup.json`` from the JSON of ``bench/rehearsal.py startup``."""
    actors = run["actors"]

    def rate(models: list[dict]) -> float:  # seconds per GiB of the weights these loads built
        gib = sum(m["weights_bytes"] for m in models) / GIB
        return round(sum(m["load_s"] for m in models) / gib, 3) if gib else 0.0

    loaded = {stage: [m for m in a.get("models", {}).values() if m.get("weights_bytes")] for stage, a in actors.items()}
    every = [m for models in loaded.values() for m in models]
    return {
        "source": (f"`{run['command']}` on {run['machine']}, {run['date']} (docs/rehearsal.md, \"Actor start-up\"): "
                   f"each stage's setup in a fresh process, in CPU seconds (an actor with a core of its own), "
                   f"weights from the page cache"),
        "imports_s": {stage: round(actors[stage]["imports_s"], 2) for stage in STAGES if stage in actors},
        "load_s_per_gib": {"all": rate(every), **{stage: rate(models) for stage, models in loaded.items() if models}},
        "loaded": {stage: {"models": len(models), "gib": round(sum(m["weights_bytes"] for m in models) / GIB, 2),
                           "seconds": round(sum(m["load_s"] for m in models), 1)} for stage, models in loaded.items()},
        "zero_shot_head_s": run["zero_shot_head_s"],
        "zero_shot_head_source": run["zero_shot_head_source"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.perf.startup", description=__doc__.splitlines()[0])
    p.add_argument("run", help="the JSON output of `bench/rehearsal.py startup --json`")
    p.add_argument("--write", action="store_true", help="write pipeline/data/startup.json (else print it)")
    args = p.parse_args(argv)
    return emit(FILE, from_rehearsal(json.loads(Path(args.run).read_text())), args.write)


if __name__ == "__main__":
    sys.exit(main())
