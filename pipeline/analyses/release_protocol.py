"""Analysis ``release_protocol``: the report names the protocol a released benchmark was evaluated with.

Its ``aggregate.analyses`` entry is written by :func:`pipeline.sources.release_protocol.apply_to`
(options ``protocol``, ``original``, ``accuracy``, ``metric``, ``classifiers``: each one's
resolved input transform and templates, ``overridden``: the entries that set their own).
Output: ``release_protocol.csv`` (one row per classifier, ``comparable`` false for an
override), the options in ``metrics.json`` and a section of ``index.html``.
"""

from __future__ import annotations

import html
import json

import pandas as pd

from pipeline.aggregate.analysis import AnalysisContext, AnalysisResult


def run(ctx: AnalysisContext) -> AnalysisResult:
    opts = ctx.options
    name = opts.get("protocol", "?")
    result = AnalysisResult(title=f"Protocol: {name}")
    inputs = opts.get("classifiers", {})
    overridden = opts.get("overridden", {})
    rows = [
        {
            "classifier": clf,
            "preprocess": json.dumps(entry.get("preprocess")),
            "templates": json.dumps(entry.get("templates")) if "templates" in entry else "",
            "comparable": clf not in overridden,
            "override": "; ".join(overridden.get(clf, [])),
        }
        for clf, entry in inputs.items()
    ]
    table = pd.DataFrame(rows, columns=["classifier", "preprocess", "templates", "comparable", "override"])
    result.tables["release_protocol"] = table
    result.json = {k: v for k, v in opts.items()}
    warn = (
        "<p><b>Not comparable with the published numbers:</b> "
        + ", ".join(html.escape(c) for c in overridden)
        + " set their own inputs.</p>"
        if overridden
        else ""
    )
    result.html = (
        f"<p>Evaluated as the original does: <b>{html.escape(name)}</b> "
        f"(<code>{html.escape(str(opts.get('original', '')))}</code>, see docs/protocol.md). "
        f"Accuracy: {html.escape(str(opts.get('accuracy', '')))}. Metric: {html.escape(str(opts.get('metric', '')))}.</p>"
        + warn
        + table.to_html(index=False, escape=True)
    )
    return result
