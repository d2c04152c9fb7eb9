"""The pages of a card (``card.html``) and of a leaderboard (``index.html``).

Self-contained HTML made with the report's page assembly (:mod:`pipeline.aggregate.page`):
the numbers are those of ``card.json`` / ``leaderboard.csv``, each value shown with its
bootstrap interval ``[low, high]``.
"""

from __future__ import annotations

import html
import json
from typing import Any

import pandas as pd

from pipeline.aggregate.page import ZERO_WIDTH, ci_table, fmt, page_html, zero_width
from pipeline.card.exports import robustbench_source

e = html.escape


def _key(key: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in key.items())


def _preprocess(p: Any) -> str:
    return p if isinstance(p, str) else json.dumps(p, sort_keys=True)


def _interval_kind(ci: dict) -> str:
    """How an entry's intervals were made: an adaptive build's stratified ones, or bootstrap resamples."""
    return "stratified estimates" if ci.get("method") == "stratified" else f"{ci.get('resamples')} resamples"


def card_html(card: dict[str, Any]) -> str:
    """``card.html`` of a card (the content of ``card.json``)."""
    model, suite = card["model"], card["suite"]
    title = f"Robustness card: {model['name']} on suite {suite['name']}"
    rows = pd.DataFrame(
        [
            {
                "benchmark": b["benchmark"], "family": b["family"], "metric": b["metric"],
                "value": b["value"], "value_ci_low": b["ci_low"], "value_ci_high": b["ci_high"],
                "better": "higher" if b["higher_is_better"] else "lower", "protocol": b["protocol"],
                "config hash": (b["config_hash"] or "")[:12], "units": b["n_units"],
            }
            for b in card["benchmarks"]
        ]
    )
    weights = "".join(
        f"<li><code>{e(w['key'])}</code>: {e(w.get('path') or w.get('ref') or '')} "
        f"(SHA-256 <code>{e(w['sha256'] or 'not available here')}</code>)</li>"
        for w in model["weights"]
    )
    ident = (
        f"<p>Model <b>{e(model['name'])}</b>: kind <code>{e(model['kind'])}</code>, model <code>{e(model['model'])}</code>; "
        f"weights SHA-256 <code>{e(model['weights_sha256'] or 'n/a')}</code>; own input transform "
        f"<code>{e(_preprocess(model['preprocess']))}</code>.</p><ul>{weights}</ul>"
        f"<p>Suite <b>{e(suite['name'])}</b> ({e(suite['file'])}), hash <code>{e(suite['hash'])}</code>"
        + (f", corruption baseline <code>{e(str(suite['baseline']))}</code>" if suite.get("baseline") else "")
        + ".</p>"
    )
    sections = [("Model and suite", ident), ("Headline metrics", ci_table(rows, sortable=True)
                + "<p>Each value with its bootstrap interval; the metric of each family is its paper's "
                f"(docs/card.md).</p><p>{e(robustbench_source(card)[1])}</p>")]
    for b in card["benchmarks"]:
        details = pd.DataFrame(
            [
                {"metric": d["metric"], "of": _key(d["key"]), "value": d["value"],
                 "value_ci_low": d["ci_low"], "value_ci_high": d["ci_high"]}
                for d in b["details"]
            ],
            columns=["metric", "of", "value", "value_ci_low", "value_ci_high"],
        )
        proto = b["protocol_detail"]
        body = (
            f"<p>{e(b['description'])}: <b>{e(fmt(b['value']))}</b> [{e(fmt(b['ci_low']))}, {e(fmt(b['ci_high']))}]"
            + (f" ({e(ZERO_WIDTH)})" if zero_width(b["ci_low"], b["ci_high"]) else "") + " "
            f"({e(str(b['ci']['level']))} interval, {e(_interval_kind(b['ci']))}, {b['n_units']} units).</p>"
            f"<p>Protocol <b>{e(proto['name'])}</b> ({e(proto['original'])}){': ' + e(proto['metric']) if proto.get('metric') else ''}; "
            f"the model's input here: <code>{e(_preprocess(b['preprocess']))}</code>.</p>"
            f"<p>Output <code>{e(b['output'])}</code>, config hash <code>{e(b['config_hash'])}</code>, benchmark hash "
            f"<code>{e(b.get('benchmark_hash', ''))}</code>, images <code>{e(b.get('images_digest', ''))}</code>; "
            f"its report: <code>{e(b['output'])}/report/index.html</code>.</p>"
            + ci_table(details)
        )
        sections.append((f"{b['benchmark']} ({b['family']})", body))
    return page_html(title, None, sections, ["card.json"])


def leaderboard_html(table: pd.DataFrame, correlations: pd.DataFrame, info: dict[str, Any]) -> str:
    """``index.html`` of a leaderboard: the ranked table per benchmark and the rank correlations."""
    title = f"Leaderboard: suite {info['suite']} ({len(info['models'])} models)"
    sections = [(
        "Cards",
        "<p>Suite hash <code>" + e(info["suite_hash"]) + "</code>; cards: "
        + ", ".join(f"<code>{e(c)}</code>" for c in info["cards"])
        + ". Ranks: 1 is the most robust by each benchmark's headline metric; models whose intervals overlap "
        "the best one's share its tier (<code>tier 1</code>).</p>",
    )]
    for bench, part in table.groupby("benchmark", sort=False):
        show = part.sort_values("rank")[["rank", "tier", "model", "metric", "value", "value_ci_low", "value_ci_high",
                                         "better", "clean_accuracy", "failure_point", "failure_point_rank", "protocol"]]
        basis = part["failure_point_basis"].iloc[0]
        said = {"refined": "failure points: refined (every card of this benchmark has one), ranked higher first",
                "grid": "failure points: the grid's (not every card of this benchmark has a refined one), ranked "
                        "higher first"}.get(basis, "no failure points on these cards")
        sections.append((f"{bench}", ci_table(show.reset_index(drop=True), sortable=True)
                         + f"<p>Clean accuracy: at scale 0 (the originals). {e(said)}.</p>"))
    wide = table.pivot_table(index="model", columns="benchmark", values="rank", sort=False)
    sections.append(("Ranks per benchmark", wide.to_html(float_format=lambda v: f"{v:g}")))
    if correlations.empty:
        corr = "<p>Rank correlations need at least two benchmarks and three models.</p>"
    else:
        corr = ci_table(correlations, sortable=True) + (
            "<p>Spearman's rho and Kendall's tau-b between the models' ranks on two benchmarks (n models); "
            "p: the two-sided permutation test of no association, exact over every pairing of up to 9 models (a "
            "seeded Monte Carlo estimate over 99,999 random pairings beyond). With few models even a perfect agreement is weak evidence (3 models: p = 1/3).</p>"
        )
    sections.append(("Rank correlation between benchmarks", corr))
    return page_html(title, None, sections, ["leaderboard.csv", "correlations.csv"])
