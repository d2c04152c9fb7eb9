"""cnsbench: robustness benchmarks for image classifiers from continuous generative nuisance shifts.

The package follows the data: ``plan`` -> ``stages.generate`` -> ``stages.filter`` ->
``stages.classify`` -> ``stages.write`` -> ``aggregate``; ``executors`` run the stages
(on Ray Data, or in-process for tests and benchmarks); ``cli`` is the entry point.

The Python API (docs/python.md) is exposed here lazily (PEP 562): ``import pipeline`` loads
no model library; a name's module is imported when the name is first used.

* ``open_output(path)`` -> :class:`pipeline.api.output.Benchmark` (tables, metrics, images, datasets)
* ``evaluate(model, output, ...)``, ``card(model, suite, ...)``: a model held in memory
* ``build(config, output)``, ``refine(output, classifier)``, ``leaderboard(cards, output)``
* ``CnsbenchError``: the one exception type for bad input
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__version__ = "0.1.0"

# name -> the module that defines it
_API = {
    "CnsbenchError": "pipeline.errors",
    "open_output": "pipeline.api.output",
    "Benchmark": "pipeline.api.output",
    "evaluate": "pipeline.api.models",
    "card": "pipeline.api.models",
    "build": "pipeline.api.commands",
    "refine": "pipeline.api.commands",
    "leaderboard": "pipeline.api.commands",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))


class _Package(types.ModuleType):
    """``pipeline.card`` names the API's function although ``pipeline/card/`` is a package: the
    import system's binding of such a subpackage to the package's attribute is skipped, so the
    name keeps meaning the function once the subpackage is imported (which stays reachable as
    ``from pipeline.card import ...`` and ``sys.modules["pipeline.card"]``)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _API and isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
