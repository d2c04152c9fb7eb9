"""The registries: each checks its contract when an entry loads, and every list of their keys
(in the docs, in the config's field descriptions, in `cnsbench ls`) says what they hold."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pipeline import registry

ROOT = Path(__file__).resolve().parents[1]
REGISTRIES = {name: reg for name, reg in vars(registry).items() if isinstance(reg, registry.Registry)}


@pytest.mark.parametrize("name", sorted(REGISTRIES))
def test_a_wrong_entry_fails_on_load_naming_it_and_the_base_it_lacks(name):
    real = REGISTRIES[name]
    reg = registry.Registry(real.kind, base=real.base)
    reg.register("wrong", "pipeline.errors:CnsbenchError")  # a class that is none of the contracts
    with pytest.raises(registry.PluginError) as err:
        reg.get("wrong")
    module, _, attr = real.base.partition(":")
    assert str(err.value).startswith(f"{real.kind} 'wrong' (pipeline.errors:CnsbenchError) is not ")
    assert f"{module}.{attr}" in str(err.value)


def test_an_analysis_is_a_function_of_one_argument():
    reg = registry.Registry("analysis", base=registry.ANALYSES.base)
    reg.register("good", "pipeline.analyses.strips:run")
    reg.register("two", "pipeline.analyses.family_comparison:family_rows")  # (family, metrics, max_scale)
    assert reg.get("good").__module__ == "pipeline.analyses.strips"
    with pytest.raises(registry.PluginError, match=r"analysis 'two' \(pipeline.analyses.family_comparison:family_rows\) "
                                                   r"is not a function of one argument \(pipeline.aggregate.analysis.Analysis\)"):
        reg.get("two")


# --------------------------------------------------------------------------- drift
def described_lists(config_dir: Path = ROOT / "pipeline" / "config") -> list[tuple[str, set[str]]]:
    """Every ``a | b | c`` list of names in a config field's description: (where, names)."""
    found = []
    for path in sorted(config_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "description" and isinstance(node.value, ast.Constant):
                for run in re.finditer(r"\w+(?: \| \w+)+", str(node.value.value)):
                    found.append((f"{path.name}:{node.value.lineno}", set(run.group(0).split(" | "))))
    return found


def drift(registries: dict[str, registry.Registry], lists: list[tuple[str, set[str]]]) -> list[str]:
    """Lists that name a registry's keys but not all of them (or more): each must be one
    registry's keys exactly."""
    out = []
    for where, names in lists:
        near = {n: set(r.keys()) for n, r in registries.items() if names & set(r.keys())}
        if near and not any(names == keys for keys in near.values()):
            n, keys = max(near.items(), key=lambda item: len(names & item[1]))
            out.append(f"{where} lists {sorted(names)}; {n} holds {sorted(keys)}")
    return out


def backticked(text: str, pattern: str) -> set[str]:
    match = re.search(pattern, text)
    assert match, f"the list {pattern!r} is gone"
    return set(re.findall(r"`(\w+)`", match.group(1)))


def test_every_list_of_a_registry_says_what_it_holds():
    problems = drift(REGISTRIES, described_lists())
    report = set(registry.REPORT_ANALYSES)
    docs = {
        "docs/report.md (sentence)": backticked((ROOT / "docs/report.md").read_text(),
                                                r"((?:`\w+`(?:,\s+|\s+and\s+)?)+)\s+run\s+for\s+every\s+build"),
        "docs/architecture.md": backticked((ROOT / "docs/architecture.md").read_text(),
                                           r"`REPORT_ANALYSES`\s+\(([^)]*)\)"),
    }
    problems += [f"{where} lists {sorted(names)}; REPORT_ANALYSES holds {sorted(report)}"
                 for where, names in docs.items() if names != report]
    sections = set(re.findall(r"^\| [^|]+ \| `(\w+)` \|", (ROOT / "docs/report.md").read_text(), re.M))
    problems += [f"docs/report.md's table of sections lacks {n}" for n in sorted(report - sections)]
    # The architecture page's table and `cnsbench ls` show every registry.
    table = set(re.findall(r"^\| `([A-Z_]+)` \|", (ROOT / "docs/architecture.md").read_text(), re.M))
    problems += [f"docs/architecture.md's registry table: {sorted(table)}, registry.py: {sorted(REGISTRIES)}"] \
        if table != set(REGISTRIES) else []
    listed = [title.split(" (")[0] for title in registry.ALL]
    problems += [f"`cnsbench ls` (registry.ALL) lacks {n}" for n, r in REGISTRIES.items()
                 if r not in registry.ALL.values()]
    readme = (ROOT / "README.md").read_text()
    ls = re.search(r"cnsbench ls +# the registries: ([^\n]*\n(?: +# [^\n]*\n)*)", readme)
    assert ls, "README's cnsbench ls line is gone"
    shown = [p.strip() for p in re.sub(r"\s*#\s*", " ", ls.group(1)).split(",")]
    problems += [f"README's cnsbench ls lists {shown}; it prints {listed}"] if shown != listed else []
    assert not problems, "\n".join(problems)


def test_a_list_that_lacks_a_key_is_found():
    regs = {"CLASSIFIERS": registry.CLASSIFIERS, "FAMILIES": registry.FAMILIES, "SAMPLERS": registry.SAMPLERS}
    lists = [("a.py:1", {"timm", "open_clip_zeroshot", "torchscript", "torch_hub", "vlm"}),
             ("b.py:2", {"slider", "prompt"}),  # the samplers, all of them (the families hold more)
             ("c.py:3", {"float32", "bfloat16"})]  # no registry's
    assert drift(regs, lists) == [
        "a.py:1 lists ['open_clip_zeroshot', 'timm', 'torch_hub', 'torchscript', 'vlm']; CLASSIFIERS holds "
        "['exported', 'module', 'open_clip_zeroshot', 'timm', 'torch_hub', 'torchscript', 'vlm']"]
