"""Load a script of the repository (``bench/*.py``, ``scripts/*.py``) as a module, for tests
that call its functions in this process."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str, name: str) -> ModuleType:
    """``relative`` (e.g. ``"bench/overhead.py"``) under the module name ``name``; a prefixed name
    keeps ``bench/pipeline.py`` from standing in for the package of that name."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
