"""Every package ``pipeline/`` imports is declared in pyproject.toml, the core ones with a floor.

The imports are read from the source (every ``import x`` / ``from x import ...``, also inside
functions), mapped to their distributions through the installed metadata
(``importlib.metadata.packages_distributions``), and looked up in ``[project].dependencies`` and
the optional extras.  A package only an extra declares (s3fs, scikit-learn, xformers) may be
imported only where that extra is needed; the rest of the project must not need it.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(.*)$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(spec: list[str]) -> dict[str, str]:
    """``{normalised distribution name: version specifier}`` of requirement strings."""
    out = {}
    for line in spec:
        m = _NAME.match(line.split(";")[0])
        assert m, f"pyproject.toml: cannot read the requirement {line!r}"
        out[_norm(m.group(1))] = m.group(3).strip()
    return out


def declared() -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return requirements(project["dependencies"]), {k: requirements(v) for k, v in project["optional-dependencies"].items()}


def imported_modules(root: Path = ROOT / "pipeline") -> dict[str, set[str]]:
    """Top-level module name -> the files of ``root`` importing it (absolute imports only)."""
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(root.parent)))
    return found


def third_party(found: dict[str, set[str]]) -> dict[str, set[str]]:
    return {m: files for m, files in found.items() if m not in sys.stdlib_module_names and m != "pipeline"}


def test_every_import_of_pipeline_is_a_declared_dependency():
    core, extras = declared()
    optional = {name for reqs in extras.values() for name in reqs}
    dists = packages_distributions()
    missing, only_extra = [], []
    for module, files in sorted(third_party(imported_modules()).items()):
        names = {_norm(d) for d in dists.get(module, [])}
        assert names, f"{module} (imported by {sorted(files)[0]}) is not installed: no distribution provides it"
        if names & set(core):
            continue
        (only_extra if names & optional else missing).append(f"{module} ({', '.join(sorted(names))}): {sorted(files)}")
    assert not missing, "imported but not declared in pyproject.toml:\n" + "\n".join(missing)
    # Only the world's retraining needs scikit-learn (the 'world' extra) and only Benchmark.hf_dataset needs
    # datasets (the 'datasets' extra, imported where it is used and named when missing); nothing else
    # imports an extra's package.
    allowed = {"sklearn": "pipeline/demo/", "datasets": "pipeline/api/loaders.py"}
    assert all(line.split(" ", 1)[0] in allowed and allowed[line.split(" ", 1)[0]] in line for line in only_extra), only_extra


def test_core_dependencies_have_floors():
    core, _ = declared()
    loose = sorted(name for name, spec in core.items() if ">=" not in spec)
    assert not loose, f"dependencies without a floor (>=): {loose}"
    for name in ("fastapi", "starlette", "huggingface-hub", "numpy", "tokenizers", "pathspec", "filelock"):
        assert name in core, f"{name} is imported directly and must be declared"
    assert "statsmodels" not in core and all("statsmodels" not in reqs for reqs in declared()[1].values())


def test_the_reader_finds_imports_inside_functions(tmp_path):
    """The import reader sees an import inside a function and ignores relative ones (it can fail)."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text("import os\nfrom . import x\n\ndef f():\n    import numpy.linalg\n    from yaml import safe_load\n")
    found = third_party({k: v for k, v in imported_modules(pkg).items()})
    assert set(found) == {"numpy", "yaml"}
