"""``cnsbench leaderboard CARDS... --output DIR``: models x benchmarks from robustness cards.

Each card is read strictly (:mod:`pipeline.card.schema`): a regular file of bounded size,
finite numbers, each benchmark once, refused naming the file and the key otherwise.  The
cards must be made on the same suite, with the same protocols, on the same outputs:
the suite's hash and baseline, the set of benchmarks, and per benchmark its family,
metric, protocol, benchmark hash (the output's config without its classifiers) and the
digest of its images must agree.  Otherwise the cards are refused
(:class:`CardsNotComparable`, a :class:`pipeline.aggregate.compare.NotComparable`: exit
code 2) naming each differing key and its value on every card.  The outputs' config
hashes may differ: each card adds its model to the outputs, which changes their config.

Beside the headline, each row carries the model's clean accuracy (scale 0, the originals)
and its mean failure point, ranked on its own (``failure_point_rank``, higher is more
robust): the refined one (``cnsbench refine``, ``cnsbench card --refine R``) where every
card of the benchmark has one, the grid's otherwise; ``failure_point_basis`` says which.

Per benchmark the models are ranked by the headline metric in the direction of its
definition (:func:`pipeline.card.schema.metrics`, never the card's say; 1 = most robust;
ties share the smaller rank), and each gets a *tier*: 1 plus the number of models whose interval lies
entirely on the better side of its own, so models that the intervals cannot tell apart
share a tier.  Between every two benchmarks the ranks are compared by Spearman's rho and
Kendall's tau-b over the models that have both, with permutation p-values
(:func:`rank_association`; do CNS shifts rank models as corruptions do?).  Written into a
new or empty folder or an earlier leaderboard's (its marker :data:`LEADERBOARD_MARKER`,
written first): ``leaderboard.csv`` (one row per model and benchmark),
``correlations.csv`` and ``index.html``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from pipeline.aggregate.compare import NotComparable
from pipeline.card.schema import TMP, CardError, higher_is_better, read_card, read_json
from pipeline.errors import CnsbenchError
from pipeline.io.safejson import dumps as strict_dumps
from pipeline.io.store import OutputStore

COLUMNS = ["model", "benchmark", "family", "metric", "value", "ci_low", "ci_high", "higher_is_better", "rank", "tier",
           "protocol", "weights_sha256", "card", "clean_accuracy", "failure_point", "failure_point_ci_low",
           "failure_point_ci_high", "failure_point_basis", "failure_point_rank"]
# A benchmark's clean accuracy, as each family's card details state it (RobustBench's "clean" column).
CLEAN = {"accuracy_clean": False, "accuracy_original": False, "error_clean": True}  # metric -> is an error rate
CORRELATION_COLUMNS = ["benchmark_a", "benchmark_b", "n_models", "spearman_rho", "spearman_p", "kendall_tau", "kendall_p"]
TABLE = "leaderboard.csv"


class CardsNotComparable(NotComparable):
    """The cards were made on different suites, protocols or outputs."""


def card_file(location: str) -> tuple[OutputStore, str]:
    """(store, name) of a card's file: ``location`` itself when it is a file (or names a
    ``.json``), else its ``card.json``."""
    path = location.rstrip("/") or location
    is_file = path.endswith(".json") or ("://" not in path and os.path.lexists(path) and not os.path.isdir(path))
    if not is_file:
        path = path + "/card.json"
    root, _, name = path.rpartition("/")
    return OutputStore(root or "."), name


def load_card(location: str) -> dict[str, Any]:
    """A checked card (:mod:`pipeline.card.schema`) from its folder or its file: a regular
    file of bounded size; :class:`~pipeline.card.schema.CardError` naming the file and key."""
    store, name = card_file(location)
    if not store.exists(name) and not (store.local and os.path.lexists(store.path(name))):
        raise FileNotFoundError(f"{location}: no card here ({store.url(name)} not found); make one with `cnsbench card`")
    card = read_card(store, name)
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


def clean_accuracy(entry: dict[str, Any]) -> float:
    """The entry's accuracy on the unshifted images (scale 0, the originals), NaN where its
    family's details state none."""
    for d in entry.get("details") or []:
        if d.get("metric") in CLEAN and not {k for k in (d.get("key") or {}) if k != "scale"} and d.get("value") is not None:
            return 1.0 - float(d["value"]) if CLEAN[d["metric"]] else float(d["value"])
    return math.nan


def failure_points(entry: dict[str, Any]) -> dict[str, tuple[float, float, float]]:
    """``grid`` and ``refined`` mean failure points of an entry (value, ci_low, ci_high), as
    its details state them (``fp_avg``, ``fp_avg_refined``); absent ones are left out."""
    out = {}
    for d in entry.get("details") or []:
        kind = {"fp_avg": "grid", "fp_avg_refined": "refined"}.get(d.get("metric"))
        if kind and d.get("value") is not None:
            out[kind] = (_f(d["value"]), _f(d.get("ci_low")), _f(d.get("ci_high")))
    return out


def rank_table(cards: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (model, benchmark) with its rank and tier (see the module doc), its clean
    accuracy, and its mean failure point ranked (higher: fails later): the refined one where
    every card of the benchmark has one, else the grid's (``failure_point_basis`` says which)."""
    rows = []
    for c in cards:
        for b in c["benchmarks"]:
            rows.append({
                "model": c["model"]["name"], "benchmark": b["benchmark"], "family": b["family"], "metric": b["metric"],
                "value": _f(b["value"]), "ci_low": _f(b["ci_low"]), "ci_high": _f(b["ci_high"]),
                "higher_is_better": higher_is_better(b["family"], b["metric"]), "protocol": b["protocol"],
                "weights_sha256": c["model"].get("weights_sha256"), "card": c["_location"],
                "clean_accuracy": clean_accuracy(b), "_fp": failure_points(b),
            })
    table = pd.DataFrame(rows)
    out = []
    for bench in dict.fromkeys(table["benchmark"]):
        part = table[table["benchmark"] == bench].copy()
        fps = list(part["_fp"])
        basis = "refined" if all("refined" in f for f in fps) else "grid" if any("grid" in f for f in fps) else None
        picked = [f.get(basis, (math.nan,) * 3) if basis else (math.nan,) * 3 for f in fps]
        part["failure_point"], part["failure_point_ci_low"], part["failure_point_ci_high"] = (
            [p[i] for p in picked] for i in range(3))
        part["failure_point_basis"] = basis
        part["failure_point_rank"] = part["failure_point"].rank(ascending=False, method="min").astype("Int64")
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
    wide = table.pivot_table(index="model", columns="benchmark", values="rank", sort=False)
    rows = []
    for a, b in itertools.combinations(list(wide.columns), 2):
        both = wide[[a, b]].dropna()
        if len(both) < 3:
            continue
        rows.append([a, b, len(both), *map(_nan, rank_association(both[a].to_numpy(float), both[b].to_numpy(float)))])
    return pd.DataFrame(rows, columns=CORRELATION_COLUMNS)


EXACT_UP_TO = 9  # models: every pairing enumerated (9! = 362,880 per two benchmarks)
RESAMPLES = 99_999  # random pairings beyond that
SEED = 0


def rank_association(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """Spearman's rho and Kendall's tau-b of ``x`` and ``y`` with two-sided p-values of no
    association: the share of the pairings of ``y`` with ``x`` whose statistic is at least
    as far from 0 as the observed one (``scipy.stats.permutation_test`` over pairings, on
    the absolute statistic; ties stay ties in every pairing).  Exact up to
    :data:`EXACT_UP_TO` models, where every pairing is enumerated: with three models a
    perfect agreement has p = 1/3, where Spearman's t approximation says 0.  Beyond, a
    Monte Carlo estimate over :data:`RESAMPLES` random pairings (seeded, so repeatable)."""
    from scipy import stats

    n = len(x)
    with warnings.catch_warnings():  # a benchmark on which every model ties: said by the NaN below
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        rho, tau = stats.spearmanr(x, y).statistic, stats.kendalltau(x, y).statistic
    if not (np.isfinite(rho) and np.isfinite(tau)):  # a benchmark on which every model ties
        return rho, math.nan, tau, math.nan
    # Both statistics of one pairing at once: row 0 of the permuted data gives rho, row 1 tau.
    # Ranks are a permutation's invariant up to order, so their centring and the ties (the
    # denominators) are constants: each statistic is one product per pairing.
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    cx, cy = rx - rx.mean(), ry - ry.mean()
    norm = np.sqrt((cx @ cx) * (cy @ cy))
    i, j = np.triu_indices(n, 1)
    sx = np.sign(x[i] - x[j])
    ties_x, ties_y = int((sx == 0).sum()), int((np.sign(y[i] - y[j]) == 0).sum())
    denom = np.sqrt((len(i) - ties_x) * (len(i) - ties_y))

    def both(data: np.ndarray, axis: int = -1) -> np.ndarray:
        data = np.moveaxis(data, axis, -1)
        r = (data[..., 0, :] @ cx) / norm
        t = (np.sign(data[..., 1, i] - data[..., 1, j]) @ sx) / denom
        return np.abs(np.stack([r, t], axis=-1))

    exact = n <= EXACT_UP_TO
    res = stats.permutation_test(
        (np.stack([cy, y]),), both, permutation_type="pairings", vectorized=True, alternative="greater", axis=-1,
        n_resamples=np.inf if exact else RESAMPLES, batch=40_320, rng=np.random.default_rng(SEED),
    )
    p_rho, p_tau = (float(v) for v in res.pvalue)
    return rho, p_rho, tau, p_tau


def _nan(v: Any) -> float:
    return float(v) if v is not None and np.isfinite(v) else math.nan


LEADERBOARD_MARKER = "cnsbench-leaderboard.json"


def claim_folder(store: OutputStore) -> None:
    """A leaderboard goes into a new or empty folder, or one holding an earlier leaderboard's
    marker (:data:`LEADERBOARD_MARKER`, its content checked); anything else is refused
    naming what is there, and nothing is written."""
    if store.local and os.path.lexists(store.root) and not os.path.isdir(store.root):
        raise CnsbenchError(f"--output {store.uri} is not a folder")
    if not store.exists(""):
        return
    if store.exists(LEADERBOARD_MARKER) or (store.local and os.path.lexists(store.path(LEADERBOARD_MARKER))):
        where = store.url(LEADERBOARD_MARKER)
        try:
            doc = read_json(store, LEADERBOARD_MARKER, "leaderboard marker")
        except CardError as err:
            raise CnsbenchError(f"{err}; refusing to write into {store.uri}") from None
        if not isinstance(doc, dict) or doc.get("cnsbench") != "leaderboard":
            raise CnsbenchError(f"{where} is not a cnsbench leaderboard marker; refusing to write into {store.uri}")
        return
    names = [n for n in store.top_level() if not TMP.fullmatch(n)]
    if names:
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} entries)" if len(names) > 8 else "")
        raise CnsbenchError(f"--output {store.uri} is not empty and holds no leaderboard (no {LEADERBOARD_MARKER}); "
                         f"found: {shown}. Give a new or empty folder, or an earlier leaderboard's; nothing was changed.")


def make_leaderboard(locations: Sequence[str], dest: str, *, echo: Callable[[str], None] = print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Check the cards, rank them and write ``leaderboard.csv``, ``correlations.csv`` and ``index.html``."""
    from pipeline.card.page import leaderboard_html

    if not locations:
        raise CnsbenchError("leaderboard needs at least one card")
    cards = [load_card(os.fspath(loc)) for loc in locations]
    check_comparable(cards)
    store = OutputStore(dest)
    claim_folder(store)
    table = rank_table(cards)
    corr = rank_correlations(table)
    info = {"suite": cards[0]["suite"]["name"], "suite_hash": cards[0]["suite"]["hash"],
            "cards": [c["_location"] for c in cards], "models": [c["model"]["name"] for c in cards]}
    store.write_text(LEADERBOARD_MARKER, strict_dumps({"cnsbench": "leaderboard", **info}, indent=1) + "\n")
    store.write_text("correlations.csv", corr.to_csv(index=False))
    shown = table.rename(columns={"ci_low": "value_ci_low", "ci_high": "value_ci_high"})
    shown["better"] = np.where(shown["higher_is_better"], "higher", "lower")
    store.write_text("index.html", leaderboard_html(shown, corr.rename(columns={}), info))
    store.write_text(TABLE, table.to_csv(index=False))
    echo(f"[cnsbench] leaderboard of {len(cards)} models x {table['benchmark'].nunique()} benchmarks: {store.url('index.html')}")
    return table, corr
