"""One stage actor's start-up, measured in a fresh process: its imports, then each model's loading.

Run by ``bench/rehearsal.py startup`` once per stage (``python bench/rehearsal_startup.py JOB``,
JOB a JSON file: ``stage``, ``config``, ``sets``, ``started`` = the parent's clock when it
started this process).  The stage's real code does the work: the generate and filter stages'
``setup`` (every model of the stage), and for classify each classifier built alone, as a
classify actor builds it (``registry.CLASSIFIERS``), then freed.  Prints one JSON object:
``imports_s`` (the process's CPU seconds from its start to the stage's module and its model
libraries imported), ``models``: name -> ``load_s`` (CPU seconds), ``weights_bytes`` (the
parameters and buffers built, as held in memory); each with its wall seconds beside it
(``*_wall_s``: on a machine shared with other jobs, longer).  CPU seconds are what an actor
with a core of its own takes, whatever else the machine runs.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

# What each stage's actor imports before its first model loads (its module, its libraries).
LIBRARIES = {
    "generate": ("torch", "diffusers", "transformers", "pipeline.stages.generate"),
    "filter": ("torch", "timm", "open_clip", "pipeline.stages.filter"),
    "classify": ("torch", "timm", "open_clip", "pipeline.stages.classify"),
    "write": ("pyarrow", "PIL.Image", "pipeline.stages.write"),
}


def held_bytes(obj, seen: set[int] | None = None) -> int:
    """Bytes of the torch parameters and buffers of every module reachable as an attribute of ``obj``."""
    import torch

    seen = set() if seen is None else seen
    total = 0
    modules = [v for v in vars(obj).values() if isinstance(v, torch.nn.Module)] if hasattr(obj, "__dict__") else []
    for value in (vars(obj).values() if hasattr(obj, "__dict__") else []):
        if isinstance(value, (list, tuple)):
            modules += [v for v in value if isinstance(v, torch.nn.Module)]
    for module in modules:
        for t in [*module.parameters(), *module.buffers()]:
            key = t.data_ptr()
            if key not in seen:
                seen.add(key)
                total += t.numel() * t.element_size()
    return total


def stage_bytes(stage) -> int:
    """Parameters and buffers held by a stage's objects (its families, samplers, filter, models)."""
    seen: set[int] = set()
    total, todo, visited = 0, [stage], set()
    while todo:  # two levels of plain objects below the stage are enough for the stages' layouts
        obj = todo.pop()
        if id(obj) in visited or not hasattr(obj, "__dict__"):
            continue
        visited.add(id(obj))
        total += held_bytes(obj, seen)
        if len(visited) < 200:
            for value in vars(obj).values():
                items = value if isinstance(value, (list, tuple)) else [value]
                for item in items:
                    if isinstance(item, tuple):
                        todo.extend(item)
                    elif hasattr(item, "__dict__") and not type(item).__module__.startswith("torch"):
                        todo.append(item)
    return total


def measure(job: dict) -> dict:
    import importlib

    for name in LIBRARIES[job["stage"]]:
        importlib.import_module(name)
    imports_s, imports_wall_s = time.process_time(), time.time() - job["started"]
    from pipeline import registry
    from pipeline.config import load_config

    cfg = load_config(job["config"], sets=job.get("sets") or [])
    models: dict[str, dict] = {}
    stage = job["stage"]
    if stage == "classify":
        labels = cfg.benchmark.label_space
        for spec in cfg.classifiers:
            t0, w0 = time.process_time(), time.perf_counter()
            clf = registry.CLASSIFIERS.get(spec.kind)(spec, "cpu", labels)
            models[spec.name] = {"load_s": round(time.process_time() - t0, 3),
                                 "load_wall_s": round(time.perf_counter() - w0, 3), "weights_bytes": held_bytes(clf)}
            del clf
            gc.collect()
    elif stage in ("generate", "filter"):
        module = importlib.import_module(f"pipeline.stages.{stage}")
        cls = getattr(module, f"{stage.capitalize()}Stage")
        t0, w0 = time.process_time(), time.perf_counter()
        st = cls(cfg, device="cpu")
        st.setup()
        models[stage] = {"load_s": round(time.process_time() - t0, 3), "load_wall_s": round(time.perf_counter() - w0, 3),
                         "weights_bytes": stage_bytes(st)}
    return {"stage": stage, "imports_s": round(imports_s, 3), "imports_wall_s": round(imports_wall_s, 3),
            "models": models}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(json.dumps(measure(json.loads(Path(args[0]).read_text()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
