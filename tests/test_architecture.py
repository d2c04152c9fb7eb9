"""The shape of the code: no import cycles, modules small enough to read, executors alone branch on the runner.

Read from the source files with :mod:`ast` (nothing is imported), so the checks are fast
and hold for modules that need heavy dependencies.  Every import statement counts, wherever
it stands (module level, inside a function, under ``if TYPE_CHECKING:``): that is how a
reader and the structure tools see a module's dependencies.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "pipeline"
MAX_LINES = 700


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """pipeline modules imported anywhere in the module: every Import/ImportFrom node of its tree."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def test_no_import_cycles_inside_pipeline():
    mods = _modules()
    graph = {name: _imports(name, path, set(mods)) for name, path in mods.items()}
    # A package's __init__ importing its own submodules is not a cycle users can hit.
    for name in graph:
        graph[name] = {d for d in graph[name] if not d.startswith(name + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_module_over_700_lines():
    long = {str(p.relative_to(PKG.parent)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_runner_branches_only_in_the_executors():
    pattern = re.compile(r"runner\s*(==|!=|in\s*\()")
    offenders = [
        f"{p.relative_to(PKG.parent)}:{i}"
        for p in PKG.rglob("*.py")
        if "executors" not in p.parts
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders, offenders


def test_the_web_page_is_static_files_of_the_serve_package():
    static = PKG / "serve" / "static"
    assert {"index.html", "app.css", "app.js"} <= {p.name for p in static.iterdir()}
    for path in (PKG / "serve").glob("*.py"):
        text = path.read_text()
        assert "<html" not in text.lower() and "<body" not in text.lower(), path


def test_the_library_does_not_import_the_cli():
    mods = _modules()
    for name, path in mods.items():
        if name == "pipeline.cli" or name.startswith("pipeline.cli."):
            continue
        text = path.read_text()
        assert not re.search(r"^\s*(from pipeline\.cli\b|from pipeline import cli\b|import pipeline\.cli\b)", text, re.M), name


def test_lazy_and_type_checking_imports_count(tmp_path):
    """The import graph sees an import inside a function and one under ``TYPE_CHECKING``."""
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pipeline.config import BuildConfig\n"
        "def f():\n    from pipeline.io import fs\n    return fs\n"
    )
    known = {"pipeline.config", "pipeline.io", "pipeline.io.fs", "pipeline.x"}
    assert _imports("pipeline.x", path, known) == {"pipeline.config", "pipeline.io", "pipeline.io.fs"}


def test_the_split_packages_are_in_the_graph():
    """The config sections and the per-layout source modules are modules the checks above read."""
    mods = _modules()
    for name in ("pipeline.config", "pipeline.config.base", "pipeline.config.training", "pipeline.sources",
                 "pipeline.sources.common", "pipeline.sources.detect", "pipeline.sources.cns",
                 "pipeline.sources.webdataset", "pipeline.sources.folders", "pipeline.stages.load"):
        assert name in mods, name
    assert not (PKG / "config.py").exists(), "pipeline/config.py and the package pipeline/config/ both exist"
