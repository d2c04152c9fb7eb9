"""cnsbench: robustness benchmarks for image classifiers from continuous generative nuisance shifts.

The public Python surface (docs/python.md).  ``pipeline`` is the implementation; this package
only names its API.  It is lazy (PEP 562): ``import cnsbench`` loads no model library, and a
name's module is imported when the name is first used.  ``__init__.pyi`` states every
signature for ``help()``'s readers, IDEs and type checkers.

* ``open_output(path)`` -> :class:`Benchmark` (tables, metrics, images, datasets)
* ``build(config, output)``: a benchmark from a config
* ``evaluate(classifiers, source, *, output)``: classifiers scored on a benchmark or on images
* ``refine(classifier, output)``: failure points below the grid
* ``card(model, suite, *, output)``, ``leaderboard(cards, *, output)``
* ``CnsbenchError``: the one base of every error about the user's input
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

__version__ = "0.1.0"

# name -> the module of pipeline/ that defines it
_API = {
    "CnsbenchError": "pipeline.errors",
    "open_output": "pipeline.api.output",
    "Benchmark": "pipeline.api.output",
    "build": "pipeline.api.commands",
    "evaluate": "pipeline.api.evaluate",
    "refine": "pipeline.api.commands",
    "card": "pipeline.api.commands",
    "leaderboard": "pipeline.api.commands",
}

__all__ = ["__version__", *_API]


def _bind_implementation() -> None:
    """Make ``pipeline`` mean the package installed beside this one.

    A user's own ``pipeline.py`` (a common file name in ML projects) in the working folder
    comes first on ``sys.path`` and would otherwise stand in for the implementation; the
    implementation's package is registered under its name before any of it is imported."""
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pipeline")
    loaded = sys.modules.get("pipeline")
    if loaded is not None and os.path.dirname(os.path.abspath(getattr(loaded, "__file__", "") or "")) == here:
        return
    init = os.path.join(here, "__init__.py")
    if not os.path.isfile(init):  # installed some other way: the import system's own pipeline
        return
    spec = importlib.util.spec_from_file_location("pipeline", init, submodule_search_locations=[here])
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["pipeline"] = module
    spec.loader.exec_module(module)


_bind_implementation()


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'cnsbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
