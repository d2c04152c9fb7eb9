"""Every reference to a section of BENCHMARKS.md, README.md or docs/*.md names a heading that exists.

A reference names its file and its section, in one of two forms:

* prose: the file, a comma and the heading's text in double quotes, e.g.
  ``BENCHMARKS.md, "Test suite"``; the file may be in backticks or a Markdown link
  (``[`BENCHMARKS.md`](../BENCHMARKS.md), "Test suite"``);
* anchor: the file and the heading's GitHub anchor, e.g. ``docs/scale.md#resume-after-a-killed-driver``.

The quoted text is the heading's whole text after its ``#`` marks, or, for a heading of the
form "Title: subtitle", its title alone when no other heading of the file has that title
(``BENCHMARKS.md, "Classifier groups on a GPU"``).  Both sides are compared without backticks
and with each run of white space as one space, so a reference may wrap across lines, also
across a Python comment's lines or adjacent string literals.  A file named as
``docs/NAME.md`` is found from the repository's root, a bare ``NAME.md`` or ``../NAME.md``
also from the referring file's folder; references to other files are not checked.

Scanned: BENCHMARKS.md, README.md and docs/*.md; the comments and string literals of every
module under pipeline/ and bench/; every string of pipeline/data's JSON files; and what
``cnsbench estimate`` prints.  In the data files and the estimate's printout a figure's
citation must name its section: every mention there of BENCHMARKS.md or a docs/ page is a
section reference.

``python tests/test_references.py`` lists the dangling references.
"""

from __future__ import annotations

import ast
import io
import json
import re
import subprocess
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_FILE = r"(?P<file>(?:\.\./)?(?:docs/)?[A-Za-z0-9_][\w-]*\.md)"
PROSE = re.compile(_FILE + r'`?(?:\]\([^)\s]*\))?,\s+"(?P<heading>[^"]+)"')
ANCHOR = re.compile(_FILE + r"#(?P<anchor>[\w-]+)")
MENTION = re.compile(r"(?:\.\./)?(?:BENCHMARKS|docs/[\w-]+)\.md")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")

# Headings of BENCHMARKS.md renamed (not removed) since they were first written: old -> new.
RENAMED = {
    "Fault campaign: 30 randomised faulted builds, 0 outputs differing":
        "Fault campaigns: 30 randomised faulted builds each, 0 outputs differing",
    "Superseded: the first measurement (before the changes of the section above it)":
        "Superseded: the first measurement (before the changes above)",
}


def normalise(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def headings(markdown: str) -> list[str]:
    """The headings of a Markdown text (``#`` lines outside fenced code blocks), normalised."""
    out, fence = [], None
    for line in markdown.splitlines():
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            mark = stripped[:3]
            fence = None if fence == mark else (fence or mark)
            continue
        m = HEADING.match(line) if fence is None else None
        if m:
            out.append(normalise(m.group(2)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading (before its -1, -2 suffixes for repeats)."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(names: list[str]) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in names:
        s = slug(h)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def is_target(path: Path) -> bool:
    """A file whose sections this test checks: BENCHMARKS.md, README.md, docs/*.md."""
    try:
        rel = path.resolve().relative_to(ROOT)
    except ValueError:
        return False
    return str(rel) in ("BENCHMARKS.md", "README.md") or (rel.parent == Path("docs") and rel.suffix == ".md")


def resolve(name: str, referrer: Path | None) -> Path | None:
    """The file a reference names, or None when it names none this test checks."""
    here = referrer.parent if referrer is not None else ROOT
    if name.startswith("../"):
        candidates = [here / name]
    else:
        candidates = [ROOT / name, here / name]
    for c in candidates:
        if c.is_file() and is_target(c):
            return c.resolve()
    if name.startswith("docs/") or Path(name).name in ("BENCHMARKS.md", "README.md"):
        return ROOT / name  # a checked file that does not exist: every reference to it dangles
    return None


@dataclass
class Reference:
    where: str
    file: str
    section: str
    ok: bool

    def __str__(self) -> str:
        return f"{self.where}: {self.file}, {self.section!r}"


def references(text: str, where: str, referrer: Path | None = None) -> list[Reference]:
    """Every section reference in ``text`` (``where`` names its place for the messages)."""
    out = []
    for regex, kind in ((PROSE, "heading"), (ANCHOR, "anchor")):
        for m in regex.finditer(text):
            target = resolve(m.group("file"), referrer)
            if target is None:
                continue
            line = text.count("\n", 0, m.start()) + 1
            names = headings(target.read_text(encoding="utf-8")) if target.is_file() else []
            if kind == "heading":
                section = normalise(m.group("heading"))
                ok = section in names or [h.split(": ", 1)[0] for h in names].count(section) == 1
            else:
                section = "#" + m.group("anchor")
                ok = m.group("anchor") in anchors(names)
            out.append(Reference(f"{where}:{line}", m.group("file"), section, ok))
    return out


def unreferenced_mentions(text: str, where: str) -> list[str]:
    """Mentions of BENCHMARKS.md or a docs/ page in ``text`` that name no section."""
    covered = set()
    for regex in (PROSE, ANCHOR):
        for m in regex.finditer(text):
            covered.update(range(m.start(), m.end()))
    return [f"{where}: {text[m.start():m.end() + 40]!r}" for m in MENTION.finditer(text)
            if not any(i in covered for i in range(m.start(), m.end()))]


def python_texts(source: str) -> list[tuple[int, str]]:
    """A module's comments and string literals as (line, text): consecutive comment lines
    and adjacent string literals (implicit concatenation) each make one text."""
    out: list[tuple[int, str]] = []
    prev = None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING:
            try:
                value = ast.literal_eval(tok.string)
                value = value if isinstance(value, str) else ""
            except (ValueError, SyntaxError):  # an f-string: its literal text, fields as written
                body = tok.string.lstrip("rRbBfFuU")
                q = 3 if body[:3] in ('"""', "'''") else 1
                value = body[q:-q].replace('\\"', '"').replace("\\'", "'")
            if prev == tokenize.STRING:
                out[-1] = (out[-1][0], out[-1][1] + value)
            else:
                out.append((tok.start[0], value))
            prev = tokenize.STRING
        elif tok.type == tokenize.COMMENT:
            value = tok.string.lstrip("#").strip()
            if prev == tokenize.COMMENT:
                out[-1] = (out[-1][0], out[-1][1] + " " + value)
            else:
                out.append((tok.start[0], value))
            prev = tokenize.COMMENT
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            prev = tok.type
    return out


def json_strings(value, path: str = "") -> list[tuple[str, str]]:
    if isinstance(value, str):
        return [(path, value)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in json_strings(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, list):
        return [s for i, v in enumerate(value) for s in json_strings(v, f"{path}[{i}]")]
    return []


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def markdown_files() -> list[Path]:
    return [ROOT / "BENCHMARKS.md", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def code_files() -> list[Path]:
    return sorted(p for d in ("pipeline", "bench") for p in (ROOT / d).rglob("*.py"))


def data_texts() -> list[tuple[str, str]]:
    out = []
    for p in sorted((ROOT / "pipeline" / "data").rglob("*.json")):
        out += [(f"{rel(p)}:{key}", s) for key, s in json_strings(json.loads(p.read_text(encoding="utf-8")))]
    return out


def estimate_printout() -> str:
    import contextlib

    from pipeline.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        main(["estimate", str(ROOT / "configs" / "cns_bench.yaml"), "--gpu", "h100", "--gpus", "8"])
    return out.getvalue() + err.getvalue()


def all_references() -> list[Reference]:
    refs = []
    for p in markdown_files():
        refs += references(p.read_text(encoding="utf-8"), rel(p), p)
    for p in code_files():
        for line, text in python_texts(p.read_text(encoding="utf-8")):
            refs += [
                Reference(f"{rel(p)}:{line + int(r.where.rsplit(':', 1)[1]) - 1}", r.file, r.section, r.ok)
                for r in references(text, rel(p), p)
            ]
    for where, text in data_texts():
        refs += references(text, where)
    return refs


# --- the checker itself ----------------------------------------------------------------------


def test_headings_skip_code_blocks_and_keep_their_whole_text():
    md = "# Top\n\n## A `code` section: one, two\n\n```bash\n# not a heading\n```\n### Last ###\n"
    assert headings(md) == ["Top", "A code section: one, two", "Last"]
    assert slug("Model latencies on an H100: the latency model's calibration") == (
        "model-latencies-on-an-h100-the-latency-models-calibration"
    )
    assert anchors(["Same", "Same"]) == {"same", "same-1"}


def test_the_checker_flags_a_dangling_reference():
    """A synthetic text: valid references pass, a dangling one in each form is flagged, and a
    heading of another file does not count for the file the reference names."""
    text = (
        'See BENCHMARKS.md, "Test suite", and [`BENCHMARKS.md`](../BENCHMARKS.md), "Test\n'
        'suite"; docs/scale.md#resume-after-a-killed-driver. Dangling: `BENCHMARKS.md`, "No such\n'
        'section", docs/scale.md#no-such-anchor, docs/nosuch.md, "Anything", and\n'
        'BENCHMARKS.md, "Resume after a killed driver" (a heading of docs/scale.md only);\n'
        'by title: BENCHMARKS.md, "Model latencies on an H100", not BENCHMARKS.md, "Model".'
    )
    refs = references(text, "synthetic", ROOT / "docs" / "x.md")
    assert [(r.file, r.section) for r in refs if r.ok] == [
        ("BENCHMARKS.md", "Test suite"),
        ("BENCHMARKS.md", "Test suite"),
        ("BENCHMARKS.md", "Model latencies on an H100"),
        ("docs/scale.md", "#resume-after-a-killed-driver"),
    ]
    dangling = sorted(str(r) for r in refs if not r.ok)
    assert dangling == sorted([
        "synthetic:2: BENCHMARKS.md, 'No such section'",
        "synthetic:3: docs/scale.md, '#no-such-anchor'",
        "synthetic:3: docs/nosuch.md, 'Anything'",
        "synthetic:4: BENCHMARKS.md, 'Resume after a killed driver'",
        "synthetic:5: BENCHMARKS.md, 'Model'",
    ])
    # files this test does not check are left alone
    assert references('REFERENCE.md, "Metrics" and notes.md#x', "synthetic") == []


def test_python_references_join_comment_lines_and_adjacent_literals():
    src = (
        "# measured there (BENCHMARKS.md, \"Classifier groups on a GPU:\n"
        "# projected vs measured memory\")\n"
        "X = (\"from bench/latency.py (BENCHMARKS.md, \\\"Model latencies on an H100: \"\n"
        "     \"the latency model's calibration\\\")\")\n"
        "Y = f\"{1} (BENCHMARKS.md, \\\"No such section\\\")\"\n"
    )
    texts = python_texts(src)
    refs = [r for line, t in texts for r in references(t, f"m.py:{line}")]
    assert [(r.section, r.ok) for r in refs] == [
        ("Classifier groups on a GPU: projected vs measured memory", True),
        ("Model latencies on an H100: the latency model's calibration", True),
        ("No such section", False),
    ]


def test_a_mention_without_a_section_is_found():
    text = 'cited in BENCHMARKS.md; also docs/scale.md, "Projection"; and docs/scale.md#resume'
    assert [m.split(":")[0] for m in unreferenced_mentions(text, "s")] == ["s"]
    assert "BENCHMARKS.md;" in unreferenced_mentions(text, "s")[0]


# --- the project -----------------------------------------------------------------------------


def test_every_section_reference_names_a_heading_that_exists():
    refs = all_references()
    assert len(refs) >= 10, "the scan found almost no references: is the pattern still the one in use?"
    dangling = [str(r) for r in refs if not r.ok]
    assert not dangling, "references to sections that do not exist:\n  " + "\n  ".join(dangling)


def test_the_data_files_cite_their_figures_by_section():
    loose = [m for where, text in data_texts() for m in unreferenced_mentions(text, where)]
    assert not loose, "a data file cites BENCHMARKS.md or docs/ without naming the section:\n  " + "\n  ".join(loose)


def test_the_estimates_printout_names_sections_that_exist():
    text = estimate_printout()
    assert "GPU" in text, text
    refs = references(text, "cnsbench estimate")
    dangling = [str(r) for r in refs if not r.ok]
    loose = unreferenced_mentions(text, "cnsbench estimate")
    assert not dangling and not loose, (
        "the estimate's printout cites sections that do not exist or no section:\n  " + "\n  ".join(dangling + loose)
    )


def test_no_section_of_benchmarks_md_was_removed():
    """A recorded figure is history: every heading BENCHMARKS.md ever had is still there
    (a renamed one is listed in RENAMED)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    log = subprocess.run(
        ["git", "log", "-p", "--format=", "--", "BENCHMARKS.md"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if log.returncode != 0:
        pytest.skip(f"git log failed: {log.stderr.strip()}")
    ever = {normalise(m.group(2)) for line in log.stdout.splitlines()
            if line.startswith("+") and (m := HEADING.match(line[1:])) and len(m.group(1)) >= 2}
    now = set(headings((ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")))
    gone = sorted(h for h in ever if h not in now and RENAMED.get(h) not in now)
    assert not gone, (
        "sections of BENCHMARKS.md removed (keep them and say what superseded them, or list a "
        "rename in RENAMED):\n  " + "\n  ".join(gone)
    )


if __name__ == "__main__":
    for r in all_references():
        if not r.ok:
            print("dangling:", r)
    for where, text in data_texts():
        for m in unreferenced_mentions(text, where):
            print("no section:", m)
