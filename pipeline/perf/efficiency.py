"""The pipeline's efficiency on N GPUs, as measured on a simulated cluster (``bench/scale.py``).

Efficiency = the modelled GPU work of a build / (GPUs x its wall time).  ``bench/scale.py``
measures it on a simulated cluster (docs/scale.md) with the actors' start-up inside the wall
time, and also without it (``efficiency_without_startup``: the wall time less the modelled
start-up of the first unit's path, :func:`pipeline.perf.startup.chain_seconds`).  ``cnsbench
estimate`` adds the start-up itself, so it divides by the latter.

``data/scale_efficiency.json`` keeps the measured runs, one per GPU count; this module
writes a run into it from the bench's JSON output (the bench writes only its own output)::

    python bench/scale.py --gpus 16 --images 84000 --json > scale-16.json
    python -m pipeline.perf.efficiency --write scale-16.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from pipeline.errors import CnsbenchError
from pipeline.perf.data import DATA, emit, load_data

FILE = DATA / "scale_efficiency.json"
KEPT = ("gpus", "images", "efficiency", "efficiency_without_startup", "compression", "cpu_utilisation",
        "cpu_utilisation_machine", "startup_s", "driver_peak_rss_mb", "wall_s", "command", "date", "machine", "load")


def runs() -> list[dict[str, Any]]:
    return load_data(FILE.name).get("runs", []) if FILE.is_file() else []


def efficiency_at(n_gpus: int) -> tuple[float, str]:
    """The measured efficiency (start-up excluded) at ``n_gpus``: the run at that GPU count, else
    the run nearest in log(GPUs), said so; 1.0 when nothing is measured."""
    measured = runs()
    if not measured:
        return 1.0, "no measured efficiency (pipeline/data/scale_efficiency.json): 1.0 assumed"
    run = min(measured, key=lambda r: (abs(math.log(r["gpus"]) - math.log(n_gpus)), -r["gpus"]))
    where = (f"measured at {run['gpus']} simulated GPUs" if run["gpus"] == n_gpus
             else f"measured at {run['gpus']} simulated GPUs, assumed at {n_gpus}")
    return float(run["efficiency_without_startup"]), (
        f"{where} ({run['images']:,} images, {run['efficiency']:.3f} with the start-up), "
        f"`{run['command']}` on {run['machine']}, {run['date']}")


def with_run(data: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """``data`` (the file's contents) with the bench's ``result`` as the run at its GPU count."""
    missing = [k for k in ("gpus", "images", "efficiency", "efficiency_without_startup", "command") if k not in result]
    if missing:
        raise CnsbenchError(f"not a bench/scale.py --json result: no {', '.join(missing)}")
    run = {k: result[k] for k in KEPT if k in result}
    kept = [r for r in data.get("runs", []) if r["gpus"] != run["gpus"]]
    return {
        "source": "bench/scale.py on a simulated cluster (docs/scale.md, \"The simulation\"): the real driver, Ray "
                  "Data, object store and writers, the GPU nodes' work modelled as time; each run measured, with the "
                  "actors' start-up and without it",
        "runs": sorted([*kept, run], key=lambda r: r["gpus"]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.perf.efficiency", description=__doc__.splitlines()[0])
    p.add_argument("result", help="the JSON printed by `python bench/scale.py ... --json`")
    p.add_argument("--write", action="store_true", help="write pipeline/data/scale_efficiency.json (else print it)")
    args = p.parse_args(argv)
    text = Path(args.result).read_text().strip().splitlines()[-1]
    data = json.loads(FILE.read_text()) if FILE.is_file() else {}
    if "runs" not in data:
        data = {}  # the projections kept before runs were measured are not runs
    return emit(FILE, with_run(data, json.loads(text)), args.write)


if __name__ == "__main__":
    sys.exit(main())
