"""The measured and published figures the cost model reads: ``pipeline/data/*.json``, read once per process.

``gpus.json`` (each GPU's peak dense BF16 throughput and memory, from its datasheet, and the
utilisations measured for each kind of model work: :mod:`pipeline.perf.gpus`), ``model_flops.json``
(:mod:`pipeline.perf.flops`), ``startup.json`` (:mod:`pipeline.perf.startup`) and
``scale_efficiency.json`` (:mod:`pipeline.perf.efficiency`).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

from pipeline.errors import CnsbenchError
from pipeline.io.files import write_text_atomic

DATA = Path(__file__).resolve().parents[1] / "data"


@functools.lru_cache(maxsize=None)
def load_data(name: str) -> dict:
    """``pipeline/data/<name>`` parsed (read once per process)."""
    return json.loads((DATA / name).read_text())


def gpu_table() -> dict[str, dict]:
    return load_data("gpus.json")["gpus"]


def utilisation() -> dict:
    return load_data("gpus.json")["utilisation"]


def gpu_spec(name: str) -> dict:
    """The GPU called ``name`` (case-insensitive); ValueError listing the known ones."""
    table = gpu_table()
    key = name.lower()
    if key not in table:
        raise CnsbenchError(f"--gpu {name!r}: unknown GPU; known: {', '.join(sorted(table))} (pipeline/data/gpus.json)")
    return {"key": key, **table[key]}


def emit(path: Path, doc: Any, write: bool) -> int:
    """A generated data file: ``doc`` as JSON written to ``path`` (``--write``, atomically, said on
    stderr), else printed for review.  Returns the exit code (0)."""
    text = json.dumps(doc, indent=1) + "\n"
    if write:
        write_text_atomic(str(path), text)
        print(f"wrote {path}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
