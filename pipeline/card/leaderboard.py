"""``cnsbench leaderboard CARDS... --output DIR``: models x benchmarks from robustness cards.

The cards must be made on the same suite, with the same protocols, on the same outputs:
the suite's hash and baseline, the set of benchmarks, and per benchmark its family,
metric, protocol, benchmark hash (the output's config without its classifiers) and the
digest of its images must agree.  Otherwise the cards are refused
(:class:`CardsNotComparable`, a :class:`pipeline.aggregate.compare.NotComparable`: exit
code 2) naming each differing key and its value on every card.  The outputs' config
hashes may differ: each card adds its model to the outputs, which changes their config.

Per benchmark the models are ranked by the headline metric (1 = most robust; ties share
the smaller rank), and each gets a *tier*: 1 plus the number of models whose interval lies
entirely on the better side of its own, so models that the intervals cannot tell apart
share a tier.  Between every two benchmarks the ranks are compared by Spearman's rho and
Kendall's tau-b over the models that have both (do CNS shifts rank models as corruptions
do?).  Written: ``leaderboard.csv`` (one row per model and benchmark),
``correlations.csv`` and ``index.html``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from pipeline.aggregate.compare import NotComparable
from pipeline.io.safejson import loads as safe_loads
from pipeline.io.store import OutputStore

COLUMNS = ["model", "benchmark", "family", "metric", "value", "ci_low", "ci_high", "higher_is_better", "rank", "tier",
           "protocol", "weights_sha256", "card"]
CORRELATION_COLUMNS = ["benchmark_a", "benchmark_b", "n_models", "spearman_rho", "spearman_p", "kendall_tau", "kendall_p"]
MARKER = "leaderboard.csv"


class CardsNotComparable(NotComparable):
    """The cards were made on different suites, protocols or outputs."""


def load_card(location: str) -> dict[str, Any]:
    """A card from its folder (or its ``card.json``); ValueError naming what is wrong."""
    path = location if location.endswith(".json") else location.rstrip("/") + "/card.json"
    store_root, _, name = path.rpartition("/")
    store = OutputStore(store_root or ".")
    if not store.exists(name):
        raise FileNotFoundError(f"{location}: no card here ({path} not found); make one with `cnsbench card`")
    try:
        card = safe_loads(store.read_bytes(name), path)
    except ValueError as err:
        raise ValueError(f"{path}: not a card ({err})") from None
    if not isinstance(card, dict) or not {"model", "suite", "benchmarks"} <= set(card):
        raise ValueError(f"{path}: not a card (needs model, suite and benchmarks)")
    card["_location"] = location
    return card


def comparison_keys(card: dict[str, Any]) -> dict[str, Any]:
    """The keys that must agree between cards of one leaderboard."""
    keys = {
        "suite.name": card["suite"].get("name"),
        "suite.hash": card["suite"].get("hash"),
        "suite.baseline": card["suite"].get("baseline"),
        "benchmarks": [b["benchmark"] for b in card["benchmarks"]],
    }
    for b in card["benchmarks"]:
        for k in ("family", "metric", "protocol", "benchmark_hash", "images_digest"):
            keys[f"benchmarks.{b['benchmark']}.{k}"] = b.get(k)
    return keys


def check_comparable(cards: list[dict[str, Any]]) -> None:
    """Raise :class:`CardsNotComparable` naming every key on which the cards differ."""
    keys = [comparison_keys(c) for c in cards]
    # A benchmark some card lacks is named once (in ``benchmarks``), not by each of its keys.
    common = set.intersection(*(set(x["benchmarks"]) for x in keys))
    names = sorted(
        (k for k in set().union(*keys) if not k.startswith("benchmarks.") or k.split(".")[1] in common),
        key=lambda k: (not k.startswith("suite."), k.count("."), k),
    )
    differ = [k for k in names if any(x.get(k) != keys[0].get(k) for x in keys[1:])]
    if differ:
        lines = []
        for k in differ[:20]:
            values = "; ".join(f"{c['_location']}: {_short(x.get(k, '(absent)'))}" for c, x in zip(cards, keys))
            lines.append(f"  {k}: {values}")
        more = f"\n  ... and {len(differ) - 20} more" if len(differ) > 20 else ""
        raise CardsNotComparable(
            "the cards were not made on the same suite, protocols and outputs; these keys differ:\n"
            + "\n".join(lines) + more
        )
    seen: dict[str, str] = {}
    for c in cards:
        name = c["model"]["name"]
        if name in seen:
            raise CardsNotComparable(f"two cards of a model named {name!r}: {seen[name]} and {c['_location']}")
        seen[name] = c["_location"]


def _short(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v)
    return text[:16] + "…" if isinstance(v, str) and len(v) == 64 else text[:200]


def rank_table(cards: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (model, benchmark) with its rank and tier (see the module doc)."""
    rows = []
    for c in cards:
        for b in c["benchmarks"]:
            rows.append({
                "model": c["model"]["name"], "benchmark": b["benchmark"], "family": b["family"], "metric": b["metric"],
                "value": _f(b["value"]), "ci_low": _f(b["ci_low"]), "ci_high": _f(b["ci_high"]),
                "higher_is_better": bool(b["higher_is_better"]), "protocol": b["protocol"],
                "weights_sha256": c["model"].get("weights_sha256"), "card": c["_location"],
            })
    table = pd.DataFrame(rows)
    out = []
    for bench in dict.fromkeys(table["benchmark"]):
        part = table[table["benchmark"] == bench].copy()
        up = bool(part["higher_is_better"].iloc[0])
        score = part["value"] if up else -part["value"]
        part["rank"] = score.rank(ascending=False, method="min").astype("Int64")  # whole numbers; <NA> without a value
        lo, hi = (part["ci_low"], part["ci_high"]) if up else (-part["ci_high"], -part["ci_low"])
        # Oriented so that larger is better: a model is beaten when another's low end exceeds its high end.
        part["tier"] = pd.array([1 + int(((lo > h) & lo.notna()).sum()) if not math.isnan(h) else None for h in hi],
                                dtype="Int64")
        out.append(part.sort_values(["rank", "model"], na_position="last"))
    return pd.concat(out, ignore_index=True)[COLUMNS]


def _f(v: Any) -> float:
    return float(v) if v is not None else math.nan


def rank_correlations(table: pd.DataFrame) -> pd.DataFrame:
    """Spearman and Kendall correlation of the models' ranks between every two benchmarks."""
    from scipy import stats

    wide = table.pivot_table(index="model", columns="benchmark", values="rank", sort=False)
    rows = []
    for a, b in itertools.combinations(list(wide.columns), 2):
        both = wide[[a, b]].dropna()
        if len(both) < 3:
            continue
        rows.append([a, b, len(both), *map(_nan, rank_association(both[a].to_numpy(float), both[b].to_numpy(float)))])
    return pd.DataFrame(rows, columns=CORRELATION_COLUMNS)


EXACT_UP_TO = 8  # models: every ordering enumerated (8! = 40,320)


def rank_association(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """Spearman's rho and Kendall's tau-b of ``x`` and ``y`` with two-sided p-values of no
    association.  Up to :data:`EXACT_UP_TO` models the p-values are exact: the share of all
    orderings of ``y`` against ``x`` whose statistic is at least as far from 0 (with three
    models a perfect agreement has p = 1/3; scipy's approximations would say 0 and 0.12).
    Beyond that, scipy's."""
    from scipy import stats

    rho, tau = stats.spearmanr(x, y).statistic, stats.kendalltau(x, y).statistic
    n = len(x)
    if n > EXACT_UP_TO:
        return rho, stats.spearmanr(x, y).pvalue, tau, stats.kendalltau(x, y).pvalue
    orders = np.array(list(itertools.permutations(range(n))))
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    cx, cy = rx - rx.mean(), ry - ry.mean()
    norm = np.sqrt((cx @ cx) * (cy @ cy))
    rhos = (cy[orders] @ cx) / norm if norm > 0 else np.full(len(orders), np.nan)
    i, j = np.triu_indices(n, 1)
    sx = np.sign(x[i] - x[j])
    pairs, ties_x, ties_y = len(i), int((sx == 0).sum()), int((np.sign(y[i] - y[j]) == 0).sum())
    denom = np.sqrt((pairs - ties_x) * (pairs - ties_y))
    yo = y[orders]
    taus = (np.sign(yo[:, i] - yo[:, j]) @ sx) / denom if denom > 0 else np.full(len(orders), np.nan)
    return rho, _share_as_far(rhos, rho), tau, _share_as_far(taus, tau)


def _share_as_far(values: np.ndarray, observed: float) -> float:
    if not np.isfinite(observed):
        return math.nan
    return float(np.mean(np.abs(values) >= abs(observed) - 1e-12))


def _nan(v: Any) -> float:
    return float(v) if v is not None and np.isfinite(v) else math.nan


def claim_folder(store: OutputStore) -> None:
    if not store.exists(""):
        return
    names = [n for n in store.top_level() if not n.startswith(".")]
    if names and MARKER not in names:
        raise ValueError(f"{store.uri} is not empty and holds no leaderboard ({', '.join(names[:5])}); "
                         "give a new or empty folder, or an earlier leaderboard's")


def make_leaderboard(locations: Sequence[str], dest: str, *, echo: Callable[[str], None] = print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Check the cards, rank them and write ``leaderboard.csv``, ``correlations.csv`` and ``index.html``."""
    from pipeline.card.page import leaderboard_html

    if not locations:
        raise ValueError("leaderboard needs at least one card")
    cards = [load_card(os.fspath(loc)) for loc in locations]
    check_comparable(cards)
    store = OutputStore(dest)
    claim_folder(store)
    table = rank_table(cards)
    corr = rank_correlations(table)
    info = {"suite": cards[0]["suite"]["name"], "suite_hash": cards[0]["suite"]["hash"],
            "cards": [c["_location"] for c in cards], "models": [c["model"]["name"] for c in cards]}
    store.write_text("correlations.csv", corr.to_csv(index=False))
    shown = table.rename(columns={"ci_low": "value_ci_low", "ci_high": "value_ci_high"})
    shown["better"] = np.where(shown["higher_is_better"], "higher", "lower")
    store.write_text("index.html", leaderboard_html(shown, corr.rename(columns={}), info))
    store.write_text(MARKER, table.to_csv(index=False))
    echo(f"[cnsbench] leaderboard of {len(cards)} models x {table['benchmark'].nunique()} benchmarks: {store.url('index.html')}")
    return table, corr
