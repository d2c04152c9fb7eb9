"""The shape of the code: packages in layers with no loop, public interfaces between modules,
modules small enough to read, executors alone branch on the runner, a map that names real files.

Read from the source files with :mod:`ast` (nothing is imported), so the checks are fast
and hold for modules that need heavy dependencies.  Every import statement counts, wherever
it stands (module level, inside a function, under ``if TYPE_CHECKING:``): that is how a
reader and the structure tools see a module's dependencies.

The layers are declared once, in ``docs/architecture.md`` (the block under "## Layers"):
a package may import only from its own package or a lower layer.  Each check is a function
of a source tree, so the tests at the end run it on small synthetic trees and show that it
can fail.
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "pipeline"
DOC = ROOT / "docs" / "architecture.md"
MAX_LINES = 600


class Import(NamedTuple):
    module: str  # the importing module
    line: int
    target: str  # the pipeline module it names (the longest known prefix)
    names: tuple[str, ...]  # the names a ``from`` import takes from the target


def modules(pkg: Path = PKG) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file below ``pkg`` (a package is its ``__init__``)."""
    mods = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _resolve(target: str, known: set[str] | dict[str, Path]) -> str:
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target


def imports_of(name: str, path: Path, known: set[str] | dict[str, Path]) -> list[Import]:
    """Every import of a known module anywhere in the file: each Import/ImportFrom node of its tree."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (t := _resolve(alias.name, known)) and t != name:
                    found.append(Import(name, node.lineno, t, ()))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            plain = []
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:  # ``from pipeline.io import fs``: the module fs itself
                    if sub != name:
                        found.append(Import(name, node.lineno, sub, ()))
                else:
                    plain.append(alias.name)
            if plain and (t := _resolve(base, known)) and t != name:
                found.append(Import(name, node.lineno, t, tuple(plain)))
    return found


def all_imports(pkg: Path = PKG) -> list[Import]:
    mods = modules(pkg)
    return [imp for name, path in mods.items() for imp in imports_of(name, path, mods)]


def unit(module: str) -> str:
    """The layered unit of a module: its top-level package under the root, or the root module itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def declared_layers(doc: Path = DOC) -> list[list[str]]:
    """The layers of the doc's "## Layers" block, bottom first; each a list of units.

    The block is the first fenced block after the heading, top layer first, one layer a
    line: ``units  description`` (units separated by ", ", two spaces before the text).
    """
    text = doc.read_text()
    section = text.split("\n## Layers", 1)[1]
    block = section.split("```", 2)[1]
    layers = []
    for line in block.splitlines()[1:]:
        if line.strip():
            head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
            layers.append([u.strip() for u in head.split(",")])
    return layers[::-1]


def layer_violations(pkg: Path = PKG, layers: list[list[str]] | None = None) -> list[str]:
    """Imports of a unit in a higher layer, and units no layer declares."""
    layers = declared_layers() if layers is None else layers
    rank = {u: i for i, layer in enumerate(layers) for u in layer}
    root = pkg.name
    units = {unit(m) for m in modules(pkg) if m != root}
    problems = [f"{root}.{u} is in no layer of docs/architecture.md" for u in sorted(units - set(rank))]
    for imp in all_imports(pkg):
        a, b = unit(imp.module), unit(imp.target)
        if imp.target == root or a == b or a not in rank or b not in rank:
            continue
        if rank[b] > rank[a]:
            problems.append(f"{imp.module}:{imp.line} imports {imp.target} ({b} is above {a})")
    return problems


def package_loops(pkg: Path = PKG) -> list[list[str]]:
    """Groups of units that import each other, directly or round a loop (strongly connected)."""
    root = pkg.name
    graph: dict[str, set[str]] = {}
    for imp in all_imports(pkg):
        a, b = unit(imp.module), unit(imp.target)
        if imp.target != root and a != b:
            graph.setdefault(a, set()).add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[list[str]] = []
    counter = itertools.count()

    def visit(v: str) -> None:
        index[v] = low[v] = next(counter)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            group.append(v)
            if len(group) > 1:
                loops.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return loops


def module_cycles(pkg: Path = PKG) -> list[list[str]]:
    """Import cycles between modules (a package's ``__init__`` importing its own submodules excepted)."""
    graph: dict[str, set[str]] = {m: set() for m in modules(pkg)}
    for imp in all_imports(pkg):
        if not imp.target.startswith(imp.module + "."):
            graph[imp.module].add(imp.target)
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
    return cycles


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(pkg: Path = PKG, also: tuple[Path, ...] = ()) -> list[str]:
    """Underscore names a module takes from another module: ``from m import _x``, or ``m._x``
    on a module it imported.  ``also``: more trees (e.g. ``bench/``) whose imports of ``pkg`` count."""
    mods = modules(pkg)
    files = dict(mods)
    for tree in also:
        files.update(modules(tree))
    problems = []
    for name, path in files.items():
        tree = ast.parse(path.read_text())
        bound: dict[str, str] = {}  # local name -> the pipeline module it is
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in mods and alias.asname:
                        bound[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in mods:
                        bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        for imp in imports_of(name, path, mods):
            for n in imp.names:
                if _private(n):
                    problems.append(f"{name}:{imp.line} imports {imp.target}.{n}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute) and _private(node.attr)
                and isinstance(node.value, ast.Name) and bound.get(node.value.id, name) != name
            ):
                problems.append(f"{name}:{node.lineno} uses {bound[node.value.id]}.{node.attr}")
    return problems


def long_modules(pkg: Path = PKG, limit: int = MAX_LINES) -> dict[str, int]:
    return {
        str(p.relative_to(pkg.parent)): n
        for p in sorted(pkg.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > limit
    }


PATH = re.compile(r"\b((?:pipeline|tests|bench|docs|configs|deploy|docker|scripts)/[\w./{},*-]*\w)")


def missing_doc_paths(doc: Path = DOC, root: Path = ROOT) -> list[str]:
    """Paths the doc names (``a/{b,c}.py`` stands for two) that are not in the tree."""
    missing = []
    for match in PATH.findall(doc.read_text()):
        head, brace, rest = match.partition("{")
        names = [match]
        if brace:
            inner, _, tail = rest.partition("}")
            names = [head + part + tail for part in inner.split(",")]
        for rel in names:
            if "*" in rel:
                found = any(root.glob(rel))
            else:
                found = (root / rel).exists()
            if not found:
                missing.append(rel)
    return missing


# -- the tree as it is --------------------------------------------------------------------


def test_packages_import_only_their_own_layer_or_lower():
    problems = layer_violations()
    assert not problems, "imports against the layers of docs/architecture.md:\n" + "\n".join(problems)


def test_no_loop_between_packages():
    loops = package_loops()
    assert not loops, "packages that import each other: " + "; ".join(" <-> ".join(g) for g in loops)


def test_no_import_cycles_between_modules():
    cycles = module_cycles()
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_module_takes_another_modules_private_names():
    problems = private_imports(also=(ROOT / "bench",))
    assert not problems, "underscore names used across modules:\n" + "\n".join(problems)


def test_no_module_over_600_lines():
    long = long_modules()
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_every_path_the_architecture_page_names_exists():
    missing = missing_doc_paths()
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_library_does_not_import_the_bench_or_the_tests():
    text = "\n".join(p.read_text() for p in PKG.rglob("*.py"))
    assert not re.search(r"^\s*(from|import) (bench|tests)\b", text, re.M)


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


def test_the_split_packages_are_in_the_graph():
    """The config sections and the per-layout source modules are modules the checks above read."""
    mods = modules()
    for name in ("pipeline.config", "pipeline.config.base", "pipeline.config.training", "pipeline.sources",
                 "pipeline.sources.detect", "pipeline.sources.cns", "pipeline.sources.webdataset",
                 "pipeline.sources.folders", "pipeline.stages.load", "pipeline.plan.schema"):
        assert name in mods, name
    assert not (PKG / "config.py").exists(), "pipeline/config.py and the package pipeline/config/ both exist"
    assert [u for layer in declared_layers() for u in layer][:2] == ["data", "io"]
    assert declared_layers()[-1] == ["cli"]


def bench_only_modules(pkg: Path = PKG, bench: Path = ROOT / "bench") -> list[str]:
    """Modules of ``pkg`` that the bench imports but the product does not use: no module of the
    package imports them, no registry string names them (``"pipeline.x.y:Name"``), and they are
    no entry point of their own (``if __name__ == "__main__"``) nor a command of ``cli``."""
    mods = modules(pkg)
    known = set(mods)
    used: set[str] = set()
    text = ""
    for name, path in mods.items():
        used.update(i.target for i in imports_of(name, path, known))
        text += path.read_text()
    named = set(re.findall(r"[\"']((?:%s)(?:\.\w+)+)[:\"']" % re.escape(pkg.name), text))
    benched: set[str] = set()
    for path in sorted(bench.glob("*.py")):
        benched.update(i.target for i in imports_of(f"bench.{path.stem}", path, known))
    return sorted(
        m for m in benched
        if m not in used and m not in named and mods[m].name != "__init__.py"
        and ".cli." not in f"{m}." and "__main__" not in mods[m].read_text()
    )


def bench_writes_into_the_package(bench: Path = ROOT / "bench", pkg_name: str = "pipeline") -> list[str]:
    """Places in the bench that could write into the package: a path literal into it
    (``"pipeline/data/x.json"``, ``... / "pipeline" / ...``), or the package's own data-file
    handles (``DATA``, ``FILE``, ``emit`` of ``pipeline.perf``), which only its generators use."""
    found = []
    path_literal = re.compile(r"^(\./)?%s(/\S*)?$" % re.escape(pkg_name))
    for path in sorted(bench.glob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and path_literal.match(node.value)):
                found.append(f"{path.name}:{node.lineno}: path {node.value!r}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(f"{pkg_name}.perf"):
                found += [f"{path.name}:{node.lineno}: imports {a.name} from {node.module}"
                          for a in node.names if a.name in ("DATA", "FILE", "emit")]
    return found


def test_no_module_of_the_package_serves_only_the_bench():
    only = bench_only_modules()
    assert not only, f"used only by bench/ (move them there): {only}"


def test_the_bench_writes_nothing_into_the_package():
    found = bench_writes_into_the_package()
    assert not found, "bench/ must write only its own output; pipeline/perf generates pipeline/data:\n" + "\n".join(found)


LIFECYCLE = ("check_compatible", "clean_uncommitted", "write_config", "finish_run", "archive_previous")


def lifecycle_calls(pkg: Path = PKG, run_module: str = "pipeline.output_run") -> list[str]:
    """Calls of the steps of an output's run (by name or as an attribute) outside the run module:
    every driver goes through :class:`pipeline.output_run.OutputRun`."""
    run_module = run_module.replace("pipeline", pkg.name, 1)
    found = []
    for name, path in modules(pkg).items():
        if name == run_module:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if called in LIFECYCLE:
                    found.append(f"{name}:{node.lineno} calls {called}")
    return found


def test_only_the_run_module_performs_the_steps_of_a_run():
    found = lifecycle_calls()
    assert not found, "steps of an output's run outside pipeline/output_run.py (use OutputRun):\n" + "\n".join(found)


STAGE_NAMES = ("generate", "filter", "classify", "write", "load", "reclassify", "train")


def stages_named_in(path: Path, function: str) -> list[str]:
    """Stage names that ``function`` of ``path`` spells (as a string or an attribute): the
    executor sizes a local Ray from the chain it is handed, knowing no stage by name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            body = node.body[1:] if ast.get_docstring(node) else node.body
            for sub in (n for stmt in body for n in ast.walk(stmt)):
                if isinstance(sub, ast.Constant) and sub.value in STAGE_NAMES:
                    found.append(f"{function}:{sub.lineno} names {sub.value!r}")
                elif isinstance(sub, ast.Attribute) and sub.attr in STAGE_NAMES:
                    found.append(f"{function}:{sub.lineno} reads .{sub.attr}")
    return found


def test_init_ray_names_no_stage():
    path = PKG / "executors" / "ray_data.py"
    assert "def init_ray(" in path.read_text()
    found = stages_named_in(path, "init_ray")
    assert not found, "init_ray must size a local Ray from the chain it is given:\n" + "\n".join(found)


# -- registries and executors ----------------------------------------------------------------
def registries(path: Path) -> dict[str, tuple[str | None, list[tuple[str, str]]]]:
    """Each ``NAME = Registry(kind, base=...)`` of the registry module: its base (a
    ``"module:attribute"`` string, None when it declares none) and the entries registered there
    (key, ``"module:attribute"``)."""
    tree = ast.parse(path.read_text())
    found: dict[str, tuple[str | None, list[tuple[str, str]]]] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Call) and getattr(value.func, "id", "") == "Registry":
            given = [k.value for k in value.keywords if k.arg == "base"] + value.args[1:2]
            found[target.id] = (given[0].value if given and isinstance(given[0], ast.Constant) else None, [])
    for node in ast.walk(tree):
        f = getattr(node, "func", None)
        if (isinstance(node, ast.Call) and isinstance(f, ast.Attribute) and f.attr == "register"
                and getattr(f.value, "id", None) in found and len(node.args) >= 2
                and all(isinstance(a, ast.Constant) for a in node.args[:2])):
            found[f.value.id][1].append((node.args[0].value, node.args[1].value))
    return found


def definition(target: str, mods: dict[str, Path], depth: int = 0) -> tuple[str, ast.AST] | None:
    """Where ``"module:name"`` is defined (its module and its class, function or assignment
    node), followed through ``from x import name`` re-exports; None when not found."""
    module, _, name = target.partition(":")
    path = mods.get(module)
    if path is None or depth > 8:
        return None
    body = ast.parse(path.read_text()).body
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            return module, node
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(getattr(t, "id", None) == name for t in targets):
            return module, node
    for node in body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    src = node.module or ""
                    if node.level:
                        above = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                        src = f"{above}.{src}" if src else above
                    return definition(f"{src}:{alias.name}", mods, depth + 1)
    return None


def ancestors(found: tuple[str, ast.AST], mods: dict[str, Path]) -> set[tuple[str, str]]:
    """A class and every class it derives from, as (module, name), as far as the tree defines them."""
    module, node = found
    out = {(module, node.name)}
    for base in node.bases if isinstance(node, ast.ClassDef) else []:
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
        parent = definition(f"{module}:{name}", mods) if isinstance(base, ast.Name) else None
        if parent is not None and isinstance(parent[1], ast.ClassDef):
            out |= ancestors(parent, mods)
    return out


def registry_problems(pkg: Path = PKG) -> list[str]:
    """Registries that declare no base, and entries that do not derive from their registry's base
    class (or, for a base that is a function type, are not a function of one argument)."""
    mods, out = modules(pkg), []
    for name, (base, entries) in registries(pkg / "registry.py").items():
        contract = definition(base, mods) if base else None
        if contract is None:
            out.append(f"{name} declares no base" if base is None else f"{name}: its base {base} is not defined")
            continue
        for key, target in entries:
            entry = definition(target, mods)
            if isinstance(contract[1], ast.ClassDef):
                ok = entry is not None and isinstance(entry[1], ast.ClassDef) and \
                    (contract[0], contract[1].name) in ancestors(entry, mods)
            else:  # a function type (Callable[[X], Y]): a function of one argument
                args = entry[1].args if entry is not None and isinstance(entry[1], ast.FunctionDef) else None
                ok = args is not None and len(args.posonlyargs + args.args) - len(args.defaults) == 1
            if not ok:
                out.append(f"{name} {key!r} ({target}) does not derive from its base {base}")
    return out


def executors_not_taking_a_chain(pkg: Path = PKG) -> list[str]:
    """Executors (the registry's base and entries) whose ``execute`` does not take ``chain: Chain``."""
    mods, out = modules(pkg), []
    base, entries = registries(pkg / "registry.py").get("EXECUTORS", (None, []))
    for key, target in [("base", base), *entries] if base else entries:
        found = definition(target, mods)
        methods = {n.name: n for n in getattr(found[1], "body", []) if isinstance(n, ast.FunctionDef)} if found else {}
        execute = methods.get("execute")
        ann = next((a.annotation for a in execute.args.args if a.arg == "chain"), None) if execute else None
        if not (isinstance(ann, ast.Name) and ann.id == "Chain" or isinstance(ann, ast.Constant) and ann.value == "Chain"):
            out.append(f"{key} ({target}): execute takes chain as {ast.unparse(ann) if ann else 'nothing'}, not a Chain")
    return out


def identifiers_named(name: str, roots: tuple[Path, ...]) -> list[str]:
    """Where code defines, imports or uses the identifier ``name`` (strings and comments do not count)."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                ident = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                         else node.name if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.alias)) else None)
                if ident == name:
                    found.append(f"{path.relative_to(root.parent)}:{getattr(node, 'lineno', 0)}")
    return found


def test_every_registry_declares_a_base_and_its_entries_derive_from_it():
    found = registry_problems()
    assert registries(PKG / "registry.py").keys() >= {"FAMILIES", "SOURCES", "MASKS", "FILTERS", "CLASSIFIERS",
                                                       "VQA_PROTOCOLS", "ANALYSES", "EXECUTORS", "SAMPLERS"}
    assert not found, "registries and their contracts:\n" + "\n".join(found)


def test_executors_take_a_chain():
    assert len(registries(PKG / "registry.py")["EXECUTORS"][1]) >= 2
    found = executors_not_taking_a_chain()
    assert not found, "an executor runs a Chain (pipeline/executors/chain.py), nothing else:\n" + "\n".join(found)


def test_no_as_chain():
    found = identifiers_named("as_chain", (PKG, ROOT / "bench", ROOT / "tests"))
    assert not found, "a bare list of stages is never wrapped into a Chain: build the Chain\n" + "\n".join(found)


# -- each check can fail (synthetic trees) --------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for d in [p for p in (tmp_path / "pkg").rglob("*") if p.is_dir()] + [tmp_path / "pkg"]:
        (d / "__init__.py").touch()
    return tmp_path / "pkg"


def test_an_import_inside_a_function_or_under_type_checking_counts(tmp_path):
    pkg = _tree(tmp_path, {
        "low/a.py": "",
        "high/b.py": "",
        "low/c.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from pkg.high import b\n"
            "def f():\n    from pkg.high.b import thing\n    return thing\n"
        ),
    })
    layers = [["low"], ["high"]]
    assert layer_violations(pkg, layers) == [
        "pkg.low.c:3 imports pkg.high.b (high is above low)",
        "pkg.low.c:5 imports pkg.high.b (high is above low)",
    ]
    assert layer_violations(pkg, [["high"], ["low"]]) == []
    assert layer_violations(pkg, [["low"]]) == ["pkg.high is in no layer of docs/architecture.md"]


def test_a_loop_between_packages_is_found_even_through_a_third(tmp_path):
    pkg = _tree(tmp_path, {
        "a/x.py": "from pkg.b import y\n",
        "b/y.py": "def f():\n    import pkg.c.z\n",
        "c/z.py": "from ..a import x\n",
        "d/w.py": "from pkg.a import x\n",
    })
    assert package_loops(pkg) == [["a", "b", "c"]]
    assert module_cycles(pkg) == [["pkg.a.x", "pkg.b.y", "pkg.c.z", "pkg.a.x"]]
    (pkg / "c" / "z.py").write_text("")
    assert package_loops(pkg) == [] and module_cycles(pkg) == []


def test_an_underscore_name_from_another_module_is_found(tmp_path):
    pkg = _tree(tmp_path, {
        "a/x.py": "def _helper(): pass\ndef helper(): pass\n_y = _helper()\n",
        "a/y.py": "from pkg.a.x import _helper, helper\n",
        "b/z.py": "from pkg.a import x\nx._helper()\nx.helper()\nx.__name__\n",
        "b/w.py": "import pkg.a.x as m\ndef f():\n    return m._y\n",
    })
    assert sorted(private_imports(pkg)) == [
        "pkg.a.y:1 imports pkg.a.x._helper",
        "pkg.b.w:3 uses pkg.a.x._y",
        "pkg.b.z:2 uses pkg.a.x._helper",
    ]


def test_a_long_module_is_found(tmp_path):
    pkg = _tree(tmp_path, {"a/long.py": "x = 1\n" * (MAX_LINES + 1), "a/short.py": "x = 1\n" * MAX_LINES})
    assert long_modules(pkg) == {"pkg/a/long.py": MAX_LINES + 1}


def test_a_path_the_page_names_that_does_not_exist_is_found(tmp_path):
    (tmp_path / "pipeline" / "io").mkdir(parents=True)
    for name in ("fs.py", "lease.py"):
        (tmp_path / "pipeline" / "io" / name).touch()
    doc = tmp_path / "architecture.md"
    doc.write_text(
        "Storage lives in `pipeline/io/fs.py` and pipeline/io/{lease,manifest}.py;\n"
        "the rest in pipeline/io/*.py and pipeline/gone/.\n"
        "## Layers\n\n```\ncli  top\nbuild, evaluate  root\nio  bottom\n```\n"
    )
    assert missing_doc_paths(doc, tmp_path) == ["pipeline/io/manifest.py", "pipeline/gone"]
    assert declared_layers(doc) == [["io"], ["build", "evaluate"], ["cli"]]


def test_a_module_only_the_bench_uses_is_found(tmp_path):
    pkg = _tree(tmp_path, {
        "a/used.py": "x = 1\n", "a/lazy.py": "x = 1\n", "a/tool.py": "x = 1\n", "a/entry.py": "if __name__ == '__main__':\n    pass\n",
        "b/user.py": "from pkg.a import used\nREG = {'k': 'pkg.a.lazy:Thing'}\n",
    })
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "one.py").write_text("from pkg.a import used, tool, entry, lazy\n")
    assert bench_only_modules(pkg, bench) == ["pkg.a.tool"]


def test_a_bench_that_writes_into_the_package_is_found(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "good.py").write_text(
        '"""Writes pipeline/data/x.json? No: its own --output."""\nprint("pipeline/data/gpus.json records it")\n'
        "from pipeline.perf.latency import image_seconds\n")
    (bench / "bad.py").write_text(
        "from pipeline.perf.data import DATA, load_data\n"
        "open('pipeline/data/x.json', 'w')\n"
        "out = ROOT / 'pipeline' / 'data'\n")
    assert bench_writes_into_the_package(bench) == [
        "bad.py:1: imports DATA from pipeline.perf.data",
        "bad.py:2: path 'pipeline/data/x.json'",
        "bad.py:3: path 'pipeline'",
    ]


def test_a_lifecycle_step_called_outside_the_run_module_is_found(tmp_path):
    pkg = _tree(tmp_path, {
        "output_run.py": "def write_config(s, c):\n    return 1\nwrite_config(1, 2)\n",
        "driver.py": "from pkg import output_run\n\ndef go(s, c):\n    output_run.write_config(s, c)\n",
        "other.py": "def f(run):\n    run.finish(aggregate=True)\n",
    })
    assert lifecycle_calls(pkg) == ["pkg.driver:4 calls write_config"]


def test_a_stage_named_in_init_ray_is_found(tmp_path):
    pkg = _tree(tmp_path, {"ray_data.py": (
        'def init_ray(address, cfg):\n    """Mentions generate in its docstring only."""\n'
        '    pools = (cfg.resources.generate, cfg.resources.filter)\n    return "write"\n')})
    assert stages_named_in(pkg / "ray_data.py", "init_ray") == [
        "init_ray:3 reads .generate", "init_ray:3 reads .filter", "init_ray:4 names 'write'"]


def test_a_registry_without_a_base_or_a_wrong_entry_is_found(tmp_path):
    pkg = _tree(tmp_path, {
        "registry.py": ('THINGS = Registry("thing", base="pkg.base:Thing")\n'
                        'THINGS.register("good", "pkg.impl:Good")\nTHINGS.register("bad", "pkg.impl:Bad")\n'
                        'LOOSE = Registry("loose")\nFUNCS = Registry("f", base="pkg.base:Fn")\n'
                        'FUNCS.register("one", "pkg.impl:one")\nFUNCS.register("two", "pkg.impl:two")\n'),
        "base.py": "class Thing:\n    pass\n\n\nFn = object\n",
        "impl.py": ("from pkg.base import Thing\n\n\nclass Mid(Thing):\n    pass\n\n\nclass Good(Mid):\n    pass\n\n\n"
                    "class Bad:\n    pass\n\n\ndef one(ctx):\n    pass\n\n\ndef two(ctx, other):\n    pass\n"),
    })
    assert registry_problems(pkg) == [
        "THINGS 'bad' (pkg.impl:Bad) does not derive from its base pkg.base:Thing",
        "LOOSE declares no base",
        "FUNCS 'two' (pkg.impl:two) does not derive from its base pkg.base:Fn",
    ]


def test_an_executor_that_takes_a_list_and_as_chain_are_found(tmp_path):
    pkg = _tree(tmp_path, {
        "registry.py": ('EXECUTORS = Registry("executor", base="pkg.base:Executor")\n'
                        'EXECUTORS.register("a", "pkg.runners:A")\nEXECUTORS.register("b", "pkg.runners:B")\n'),
        "base.py": "class Executor:\n    def execute(self, rows, output, chain: Chain, options):\n        pass\n",
        "runners.py": ("from pkg.base import Executor\n\n\nclass A(Executor):\n"
                       "    def execute(self, rows, output, chain: Chain, options):\n        pass\n\n\n"
                       "class B(Executor):\n    def execute(self, rows, output, chain: list, options):\n"
                       "        return as_chain(chain)\n"),
    })
    assert executors_not_taking_a_chain(pkg) == ["b (pkg.runners:B): execute takes chain as list, not a Chain"]
    assert identifiers_named("as_chain", (pkg,)) == ["pkg/runners.py:11"]
