"""The report's ``index.html``: sections of every analysis under one table of contents.

Role: page assembly only.  Each analysis returns an HTML section
(:class:`pipeline.aggregate.analysis.AnalysisResult`); this module puts them on one page,
gives every ``<h2>``/``<h3>`` an anchor and lists them in a table of contents, and adds
the page's CSS and a few lines of inline JavaScript (sortable tables).  The page is
self-contained: no CDN, no external font, relative links only, so it works offline and
from object storage.

Layout rules that keep it readable on a laptop: the body has a maximum width, images
scale down to it, and tables scroll inside themselves (``display: block``) rather than
widening the page.  A ``<table class="sortable">`` sorts by a column when its header is
clicked (numbers numerically; ``data-sort`` on a cell overrides its text).
"""

from __future__ import annotations

import html
import math
import re
from typing import Any, Iterable

import numpy as np
import pandas as pd

CSS = """
*, *::before, *::after { box-sizing: border-box; }
html { scroll-behavior: smooth; }
body { font-family: system-ui, sans-serif; margin: 0 auto; padding: 1em 1.5em 3em; color: #222;
       max-width: 78rem; line-height: 1.45; overflow-wrap: anywhere; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; } h3 { margin-top: 1.5em; }
nav.toc { background: #f7f7f7; border: 1px solid #e2e2e2; padding: 0.5em 1em; margin: 1em 0; }
nav.toc ol { margin: 0.2em 0; padding-left: 1.4em; } nav.toc li { margin: 0.1em 0; }
table { display: block; max-width: 100%; overflow-x: auto; border-collapse: collapse; margin: 0.5em 0 1.5em;
        font-size: 0.88em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.55em; text-align: right; white-space: nowrap; }
th { background: #f2f2f2; }
td:first-child, th:first-child { text-align: left; }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th[aria-sort=ascending]::after { content: " \\25B2"; }
table.sortable th[aria-sort=descending]::after { content: " \\25BC"; }
img { max-width: 100%; height: auto; border: 1px solid #eee; margin: 0.5em 0 1.5em; }
figure { margin: 0.5em 0 1.5em; } figcaption { font-size: 0.9em; color: #555; }
code { background: #f5f5f5; padding: 0 0.2em; }
.ci { color: #666; font-size: 0.85em; }
.yes { color: #0a6d2c; font-weight: 600; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(22rem, 1fr)); gap: 1em; }
.grid img { margin: 0; }
"""

# Sort a table by the clicked column; numbers numerically, text alphabetically, NaN last.
SORT_JS = """
document.querySelectorAll('table.sortable').forEach(function (table) {
  var heads = table.querySelectorAll('thead th');
  heads.forEach(function (th, col) {
    th.addEventListener('click', function () {
      var asc = th.getAttribute('aria-sort') !== 'ascending';
      heads.forEach(function (h) { h.removeAttribute('aria-sort'); });
      th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
      var body = table.tBodies[0];
      var key = function (row) {
        var cell = row.cells[col]; var v = cell.dataset.sort !== undefined ? cell.dataset.sort : cell.textContent;
        var n = parseFloat(v); return isNaN(n) ? v : n;
      };
      Array.from(body.rows).sort(function (a, b) {
        var x = key(a), y = key(b);
        var nx = typeof x === 'number', ny = typeof y === 'number';
        var r = nx && ny ? x - y : nx ? -1 : ny ? 1 : String(x).localeCompare(String(y));
        return asc ? r : -r;
      }).forEach(function (row) { body.appendChild(row); });
    });
  });
});
"""

_HEADING = re.compile(r"<(h[23])(\s[^>]*)?>(.*?)</\1>", re.S)


def slug(text: str, used: set[str]) -> str:
    """A unique anchor id from a heading's text."""
    base = re.sub(r"[^a-z0-9]+", "-", re.sub(r"<[^>]+>", "", html.unescape(text)).lower()).strip("-") or "section"
    name, i = base, 2
    while name in used:
        name, i = f"{base}-{i}", i + 1
    used.add(name)
    return name


def _anchor(body: str, used: set[str], toc: list[tuple[int, str, str]]) -> str:
    """``body`` with an id on every h2/h3 that has none; appends (level, id, text) to ``toc``."""

    def repl(m: re.Match) -> str:
        tag, attrs, inner = m.group(1), m.group(2) or "", m.group(3)
        found = re.search(r'\bid="([^"]+)"', attrs)
        if found:
            ident = found.group(1)
            used.add(ident)
        else:
            ident = slug(inner, used)
            attrs = f'{attrs} id="{ident}"'
        toc.append((int(tag[1]), ident, re.sub(r"<[^>]+>", "", inner)))
        return f"<{tag}{attrs}>{inner}</{tag}>"

    return _HEADING.sub(repl, body)


def _toc_html(entries: list[tuple[int, str, str]]) -> str:
    parts, depth = ['<nav class="toc" aria-label="Contents"><strong>Contents</strong>'], 0
    base = min((lvl for lvl, _, _ in entries), default=2)
    for level, ident, text in entries:
        want = level - base + 1
        while depth < want:
            parts.append("<ol>")
            depth += 1
        while depth > want:
            parts.append("</ol>")
            depth -= 1
        parts.append(f'<li><a href="#{html.escape(ident, quote=True)}">{text}</a></li>')
    parts.append("</ol>" * depth + "</nav>")
    return "".join(parts)


def page_html(title: str, config_hash: str | None, sections: list[tuple[str, str]], data_files: list[str]) -> str:
    """``index.html``: title, contents, one block per (heading, HTML body), the data files."""
    e = html.escape
    used: set[str] = set()
    toc: list[tuple[int, str, str]] = []
    blocks = []
    for heading, body in sections:
        if heading:
            ident = slug(heading, used)
            toc.append((2, ident, e(heading)))
            blocks.append(f'<section><h2 id="{ident}">{e(heading)}</h2>')
            # Subsections of a titled section sit one level below it in the contents.
            body = re.sub(r"<(/?)h2\b", r"<\1h3", body)
        else:
            blocks.append("<section>")
        blocks.append(_anchor(body, used, toc) + "</section>")
    files_id = slug("Files", used)
    toc.append((2, files_id, "Files"))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
    ]
    parts.append(_toc_html(toc))
    parts += blocks
    parts.append(f'<h2 id="{files_id}">Files</h2>')
    if config_hash:  # a detail of the config: after the results
        parts.append(f"<p>config hash: <code>{e(config_hash)}</code></p>")
    parts.append("<ul>")
    for name in data_files:
        parts.append(f'<li><a href="{e(name, quote=True)}">{e(name)}</a></li>')
    parts += ["</ul>", f"<script>{SORT_JS}</script>", "</body></html>", ""]
    return "\n".join(parts)


# --------------------------------------------------------------------------- tables
NA = "n/a"  # how the page shows a number that is undefined (NaN, infinite) or missing


def float_format(digits: int = 3, spec: str = "f"):
    """A ``DataFrame.to_html(float_format=...)`` callable: ``digits`` places, :data:`NA` for
    NaN and infinities (pass ``na_rep=NA`` too, for missing values of other types)."""

    def show(value: float) -> str:
        return f"{value:.{digits}{spec}}" if math.isfinite(value) else NA

    return show


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return "n/a" if not math.isfinite(value) else f"{float(value):.{digits}f}"
    return str(value)


# What a bootstrap interval of zero width means, said wherever one is shown: every resample
# gave the same value, so the interval shows no spread; that is not certainty.
ZERO_WIDTH = ("zero width: every bootstrap resample gave the same value (few units, or units that all agree), "
              "so the resampling shows no spread; this is not certainty, and more units would widen it")


def zero_width(low: Any, high: Any) -> bool:
    """Whether ``[low, high]`` is a bootstrap interval of zero width (both finite and equal, float
    rounding aside: a statistic recomputed per resample may differ in its last bits)."""
    nums = [v for v in (low, high) if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)]
    return (len(nums) == 2 and all(math.isfinite(float(v)) for v in nums)
            and math.isclose(float(low), float(high), rel_tol=1e-12, abs_tol=1e-15))


def ci_table(df: pd.DataFrame, *, sortable: bool = False, digits: int = 4, table_id: str | None = None) -> str:
    """An HTML table of ``df`` where each ``x`` with ``x_ci_low``/``x_ci_high`` becomes one
    cell "value [low, high]" (the CI columns themselves are not shown); sortable by value.
    An interval of zero width is marked "zero width*" and explained under the table
    (:data:`ZERO_WIDTH`)."""
    e = html.escape
    cols = [c for c in df.columns if not (str(c).endswith("_ci_low") or str(c).endswith("_ci_high"))]
    head = "".join(f"<th>{e(str(c))}</th>" for c in cols)
    rows = []
    any_zero = False
    for _, row in df.iterrows():
        cells = []
        for c in cols:
            v = row[c]
            text = e(fmt(v, digits))
            lo, hi = f"{c}_ci_low", f"{c}_ci_high"
            if lo in df.columns and hi in df.columns:
                text += f' <span class="ci">[{e(fmt(row[lo], digits))}, {e(fmt(row[hi], digits))}]</span>'
                if zero_width(row[lo], row[hi]):
                    any_zero = True
                    text += f' <span class="ci" title="{e(ZERO_WIDTH, quote=True)}">zero width*</span>'
            sort = ""
            if isinstance(v, (float, np.floating)) and not math.isfinite(v):
                sort = ' data-sort=""'
            cells.append(f"<td{sort}>{text}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    body = "".join(rows) or f'<tr><td colspan="{len(cols)}">no rows</td></tr>'
    cls = ' class="sortable"' if sortable else ""
    ident = f' id="{e(table_id, quote=True)}"' if table_id else ""
    note = f"<p>* {e(ZERO_WIDTH)}.</p>" if any_zero else ""
    return f"<table{cls}{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}"


def image_grid(names: Iterable[str], captions: dict[str, str] | None = None) -> str:
    """Images side by side (as many columns as fit), each with an optional caption."""
    e = html.escape
    items = []
    for name in names:
        cap = (captions or {}).get(name)
        caption = f"<figcaption>{e(cap)}</figcaption>" if cap else ""
        items.append(f'<figure><img src="{e(name, quote=True)}" alt="{e(cap or name, quote=True)}">{caption}</figure>')
    return '<div class="grid">' + "".join(items) + "</div>"
