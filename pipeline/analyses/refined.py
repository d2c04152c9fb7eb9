"""Analysis ``refined_failure_points``: failure points refined below the grid beside the grid's.

``cnsbench refine`` (docs/refine.md) writes ``refine/failure_points_refined.csv``: per
(trajectory, classifier) the grid failure point, the refined one, the interval it lies in
and the rounds.  This analysis, run by every report (``REPORT_ANALYSES``), adds nothing
when an output has not been refined.  Otherwise, per shift and classifier:

* ``fp_refined_distribution.csv``: the share of the evaluated trajectories whose failure
  point lies in each bin of width ``bin`` (the finest refined step, at least 1/16 of the
  grid step), and the cumulative share, refined and grid side by side (shift ``all``: every
  shift pooled); the grid's counts are those of ``failure_points.csv``;
* ``fp_refined.png``: the two cumulative curves (grid: a step curve on the grid's scales,
  refined: on the fine bins), one panel per shift, one colour per classifier;
* its JSON: per classifier the mean grid and refined failure point over the failed
  trajectories (as the grid's ``fp_avg``: every trajectory with a failure point, 0
  included), how many were refined, and the rounds.

When the build's trajectories change after a refinement (a partial build completed, a
damaged shard regenerated), a classifier whose refined rows cover other trajectories than
the build's is marked stale (``stale`` in its JSON, a line on the page) until it is refined
again.

Refinement never changes a grid metric: the grid numbers here are read from the same
table, never written back.
"""

from __future__ import annotations

import html
import io
import math
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from pipeline.aggregate.analysis import AnalysisContext, AnalysisResult
from pipeline.aggregate.images import ImageReader
from pipeline.aggregate.metrics import ALL_SHIFTS
from pipeline.errors import CnsbenchError

REFINED_CSV = "refine/failure_points_refined.csv"
"""Where ``cnsbench refine`` keeps its table, relative to the output."""

REFINED_COLUMNS = [
    "trajectory_id", "shift", "class_id", "seed", "classifier", "grid_fp", "refined_fp",
    "interval_low", "interval_high", "rounds", "rejected", "status",
]
"""``status``: ``refined`` (bisected), ``never_failed``, ``failed_at_0`` (left as they are)."""

DISTRIBUTION_COLUMNS = ["classifier", "shift", "kind", "scale", "fp_count", "fp_ratio", "fp_ratio_cumulative"]


def read_refined(store: Any, rel: str = REFINED_CSV) -> pd.DataFrame | None:
    """The refined failure points of an output (``store``: its :class:`pipeline.io.store.OutputStore`;
    ``rel``: the table's path in it); None when it was never refined."""
    if not store.exists(rel):
        return None
    table = pd.read_csv(io.BytesIO(store.read_bytes(rel)))
    missing = [c for c in REFINED_COLUMNS if c not in table.columns]
    if missing:
        raise CnsbenchError(f"{store.url(rel)}: columns {missing} missing (expected {REFINED_COLUMNS})")
    return table


def mean_refined(table: pd.DataFrame, classifier: str) -> tuple[float | None, np.ndarray]:
    """The mean refined failure point of ``classifier`` over its failed trajectories (those with
    a failure point, 0 included: the grid's ``fp_avg`` over the same trajectories, each
    refined one at its refined point), and those values (for a bootstrap)."""
    rows = table[(table["classifier"] == classifier) & table["refined_fp"].notna()]
    values = rows["refined_fp"].to_numpy(dtype=float)
    return (float(values.mean()) if len(values) else None), values


def mean_refined_interval(table: pd.DataFrame, classifier: str, resamples: int, level: float,
                          seed: int) -> tuple[float | None, float | None, float | None]:
    """:func:`mean_refined` with a percentile bootstrap interval at ``level``: the failed
    trajectories resampled within (shift, class), as the grid metrics' intervals are."""
    rows = table[(table["classifier"] == classifier) & table["refined_fp"].notna()]
    if rows.empty:
        return None, None, None
    values = rows["refined_fp"].to_numpy(dtype=float)
    rng = np.random.default_rng(seed)
    means = np.zeros(resamples)
    for _, idx in rows.reset_index(drop=True).groupby(["shift", "class_id"]).indices.items():
        draws = rng.integers(0, len(idx), size=(resamples, len(idx)))
        means += values[idx][draws].sum(axis=1)
    means /= len(values)
    alpha = (1 - level) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return float(values.mean()), float(low), float(high)


def distribution(table: pd.DataFrame, bin_width: float, top: float, grid: list[float]) -> pd.DataFrame:
    """Failure-point counts per bin ``(b - bin_width, b]`` (``kind`` refined) and per scale of the
    ``grid`` (``kind`` grid), per classifier and shift and for all shifts pooled."""
    bins = np.round(np.arange(0.0, top + bin_width / 2, bin_width), 6)
    rows = []
    for (clf, shift), g in _with_all(table).groupby(["classifier", "shift"], sort=False):
        n = len(g)
        for kind, column, edges in (("grid", "grid_fp", np.array(sorted(grid))), ("refined", "refined_fp", bins)):
            values = g[column].dropna().to_numpy(dtype=float)
            # A value v lies in the bin of the smallest edge >= v (scale 0 is its own bin).
            idx = np.searchsorted(edges, values - 1e-9) if len(edges) else np.array([], dtype=int)
            counts = np.bincount(idx, minlength=len(edges))[: len(edges)] if len(edges) else []
            cum = 0
            for edge, count in zip(edges, counts):
                cum += int(count)
                rows.append({"classifier": clf, "shift": shift, "kind": kind, "scale": float(edge), "fp_count": int(count),
                             "fp_ratio": count / n if n else math.nan, "fp_ratio_cumulative": cum / n if n else math.nan})
    return pd.DataFrame(rows, columns=DISTRIBUTION_COLUMNS)


def _with_all(table: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([table, table.assign(shift=ALL_SHIFTS)], ignore_index=True)


def _figure(dist: pd.DataFrame, classifiers: list[str], shifts: list[str]) -> Figure:
    from pipeline.aggregate.report import colours_of

    colours = colours_of(classifiers)
    panels = shifts + [ALL_SHIFTS]
    fig = Figure(figsize=(3.4 * len(panels) + 0.4, 3.2), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(panels), sharey=True))
    for ax, shift in zip(axes, panels):
        for clf in classifiers:
            # Steps: the cumulative share at x counts the failure points <= x.
            for kind, style in (("grid", dict(linestyle="--", alpha=0.6)), ("refined", {})):
                d = dist[(dist["classifier"] == clf) & (dist["shift"] == shift) & (dist["kind"] == kind)]
                if not d.empty:
                    ax.plot(d["scale"], d["fp_ratio_cumulative"], color=colours[clf], drawstyle="steps-post",
                            label=f"{clf} ({kind})", **style)
        ax.set_title(shift, fontsize="medium")
        ax.set_xlabel("scale")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("cumulative failure-point ratio")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    return fig


def run(ctx: AnalysisContext) -> AnalysisResult:
    # The table lives beside the shards; only a report of an output (an image reader on its
    # store) can have one.
    table = read_refined(ctx.read_image.store) if isinstance(ctx.read_image, ImageReader) else None
    if table is None or table.empty:
        return AnalysisResult()
    classifiers = [str(c) for c in pd.unique(table["classifier"])]
    shifts = sorted(str(s) for s in pd.unique(table["shift"]))
    refined = table[table["status"] == "refined"]
    widths = (refined["interval_high"] - refined["interval_low"]).to_numpy(dtype=float)
    finest = float(widths.min()) if len(widths) else 0.0
    top = float(np.nanmax(table[["grid_fp", "refined_fp", "interval_low"]].to_numpy(dtype=float)))
    bin_width = finest if finest > 0 else max(top, 1.0) / 16
    dist = distribution(table, bin_width, top, sorted({s for g in ctx.groups for s in g.scales}))
    plots = ctx.config.aggregate.plots

    stale = stale_classifiers(table, ctx.samples, ctx.predictions, ctx.config)
    summary: dict[str, Any] = {}
    for clf in classifiers:
        mine = table[table["classifier"] == clf]
        refined_mean, values = mean_refined(table, clf)
        grid = mine["grid_fp"].dropna()
        summary[clf] = {
            "fp_avg_grid": float(grid.mean()) if len(grid) else None,
            "fp_avg_refined": refined_mean,
            "n_failed": int(len(values)),
            "n_refined": int((mine["status"] == "refined").sum()),
            "rounds": int(mine["rounds"].max()) if len(mine) else 0,
            **({"stale": stale[clf]} if clf in stale else {}),
        }
    rows = "".join(
        f"<tr><td>{html.escape(c)}</td><td>{_num(s['fp_avg_grid'])}</td><td>{_num(s['fp_avg_refined'])}</td>"
        f"<td>{s['n_refined']}</td><td>{s['rounds']}</td></tr>"
        for c, s in summary.items()
    )
    warning = "".join(
        f"<p class='warn'><b>Stale for {html.escape(c)}</b>: {html.escape(why)}; run <code>cnsbench refine OUTPUT "
        f"--classifier {html.escape(c)}</code> again.</p>" for c, why in stale.items())
    body = warning + (
        "<p>Each failing trajectory's first failing grid interval bisected with images made at its midpoints "
        "(<code>cnsbench refine</code>, docs/refine.md); dashed: the grid's cumulative failure-point ratio, solid: "
        f"the refined one in bins of {bin_width:g}. The grid metrics above are unchanged.</p>"
        + ("<img src='fp_refined.png' alt='cumulative failure points, grid and refined'>" if plots else "")
        + "<table><tr><th>classifier</th><th>mean FP (grid)</th><th>mean FP (refined)</th><th>trajectories refined</th>"
        f"<th>rounds</th></tr>{rows}</table>"
    )
    return AnalysisResult(
        tables={"failure_points_refined": table, "fp_refined_distribution": dist},
        figures={"fp_refined": _figure(dist, classifiers, shifts)} if plots else {},
        json={"bin": bin_width, "classifiers": summary, "stale": sorted(stale)},
        html=body,
        title="Refined failure points",
    )


def continuous_groups(cfg: Any) -> list:
    """The build's family groups whose family declares a continuous scale (the family
    contract's ``continuous_scale``): those ``cnsbench refine`` bisects."""
    from pipeline.registry import FAMILIES

    return [g for g in cfg.family_groups() if FAMILIES.get(g.kind).continuous_scale]


def stale_classifiers(table: pd.DataFrame, samples: pd.DataFrame, predictions: pd.DataFrame,
                      config: Any = None) -> dict[str, str]:
    """Classifier -> why its refined rows are stale: refined on other trajectories than the
    build now holds (a partial build completed or shards regenerated since; a build's
    trajectories that changed), counting the trajectories of ``config``'s continuous
    families only (the others are never refined).  The table is then left as it was and
    its section says so."""
    out = {}
    if config is not None:
        shifts = {s for g in continuous_groups(config) for s in g.shifts}
        samples = samples[samples["shift"].isin(shifts)]
    traj = samples.set_index("sample_id")["trajectory_id"]
    for clf in pd.unique(table["classifier"]):
        ids = predictions.loc[predictions["classifier"] == clf, "sample_id"]
        now = set(traj.reindex(ids).dropna())
        then = set(table.loc[table["classifier"] == clf, "trajectory_id"])
        if now != then:
            out[str(clf)] = (f"refined on {len(then)} trajectories; the build now has {len(now)} "
                             f"({len(now - then)} not refined, {len(then - now)} gone)")
    return out


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"
