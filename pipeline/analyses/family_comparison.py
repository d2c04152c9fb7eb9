"""Analysis ``family_comparison``: do the classifiers that break early under one family break early under another?

For a build with several families on the same (class, seed) base images (e.g. concept
sliders and corruptions), per classifier and family (metrics of
:mod:`pipeline.aggregate.metrics` on that family's complete trajectories, averaged over
its shifts):

* ``accuracy_scale0``: accuracy on the unshifted images;
* ``mean_accuracy_drop``: mean over the family's scales > 0 of ``acc(s) - acc(0)``;
* ``accuracy_drop_max``: the drop at the family's largest scale;
* ``fp_mean``: mean failure point over failed trajectories, ``fp_relative`` the same
  divided by the family's largest scale (scales of different families have different
  units), ``failed_share``: share of trajectories that fail at all.

and, per pair of families and measure, the Spearman rank correlation of the classifiers
(``scipy.stats.spearmanr``, as the leaderboard's; NaN with fewer than 3 classifiers with
values on both sides or a constant side).  Tables ``family_comparison.csv`` and
``family_comparison_spearman.csv``, plot ``family_comparison.png``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from pipeline.aggregate.analysis import AnalysisContext, AnalysisResult
from pipeline.aggregate.page import NA, float_format

MEASURES = ("mean_accuracy_drop", "accuracy_drop_max", "fp_relative", "failed_share")
COLUMNS = [
    "classifier", "family", "n_trajectories", "accuracy_scale0", "mean_accuracy_drop", "accuracy_drop_max",
    "fp_mean", "fp_relative", "failed_share",
]  # fmt: skip


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho (``scipy.stats.spearmanr``: ties take average ranks), over pairs where
    both values exist.  NaN with fewer than 3 such pairs or when one side is constant."""
    from scipy import stats

    x, y = np.asarray(list(a), dtype=float), np.asarray(list(b), dtype=float)
    ok = ~(np.isnan(x) | np.isnan(y))
    x, y = x[ok], y[ok]
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(stats.spearmanr(x, y).statistic)


def family_rows(family: str, metrics: Any, max_scale: float) -> list[dict[str, Any]]:
    """One row per classifier from a :class:`pipeline.aggregate.metrics.Metrics`."""
    rows = []
    summary = metrics.summary
    drop_cols = [c for c in summary.columns if c.startswith("acc_drop_") and c != "acc_drop_0000"]
    for r in summary.itertuples(index=False):
        d = r._asdict()
        drops = [d[c] for c in drop_cols]
        n = int(d["n_trajectories"])
        fp = d["fp_avg"]
        rows.append(
            {
                "classifier": d["classifier"],
                "family": family,
                "n_trajectories": n,
                "accuracy_scale0": d["accuracy_scale0"],
                "mean_accuracy_drop": float(np.nanmean(drops)) if drops and not all(pd.isna(drops)) else math.nan,
                "accuracy_drop_max": d[drop_cols[-1]] if drop_cols else math.nan,
                "fp_mean": fp,
                "fp_relative": fp / max_scale if max_scale > 0 else math.nan,
                "failed_share": d["n_failed"] / n if n else math.nan,
            }
        )
    return rows


def correlations(table: pd.DataFrame) -> pd.DataFrame:
    """Spearman rho per (family pair, measure) over the classifiers of :data:`COLUMNS`-shaped ``table``."""
    families = list(dict.fromkeys(table["family"]))
    out = []
    for fa, fb in itertools.combinations(families, 2):
        a = table[table["family"] == fa].set_index("classifier")
        b = table[table["family"] == fb].set_index("classifier")
        common = [c for c in a.index if c in b.index]
        for m in MEASURES:
            xa, xb = a.loc[common, m].to_numpy(dtype=float), b.loc[common, m].to_numpy(dtype=float)
            n = int((~np.isnan(xa) & ~np.isnan(xb)).sum())
            out.append({"family_a": fa, "family_b": fb, "measure": m, "n_classifiers": n, "spearman": spearman(xa, xb)})
    return pd.DataFrame(out, columns=["family_a", "family_b", "measure", "n_classifiers", "spearman"])


def _figure(table: pd.DataFrame):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = list(dict.fromkeys(table["family"]))
    pairs = list(itertools.combinations(families, 2))
    fig, axes = plt.subplots(len(pairs), 2, figsize=(9, 3.8 * len(pairs)), squeeze=False)
    for row, (fa, fb) in enumerate(pairs):
        a = table[table["family"] == fa].set_index("classifier")
        b = table[table["family"] == fb].set_index("classifier")
        common = [c for c in a.index if c in b.index]
        for col, (m, label) in enumerate((("mean_accuracy_drop", "mean accuracy drop"), ("fp_relative", "mean failure point / max scale"))):
            ax = axes[row, col]
            xs, ys = a.loc[common, m].to_numpy(float), b.loc[common, m].to_numpy(float)
            ax.scatter(xs, ys)
            for c, x, y in zip(common, xs, ys):
                if not (math.isnan(x) or math.isnan(y)):
                    ax.annotate(c, (x, y), fontsize=8, xytext=(3, 3), textcoords="offset points")
            rho = spearman(xs, ys)
            ax.set_xlabel(f"{label}: {fa}")
            ax.set_ylabel(f"{label}: {fb}")
            ax.set_title(f"Spearman rho = {rho:.2f}" if not math.isnan(rho) else "Spearman rho: n/a", fontsize=9)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def run(ctx: AnalysisContext) -> AnalysisResult:
    from pipeline.analyses.cns import group_metrics

    result = AnalysisResult(title="Families side by side")
    if len(ctx.groups) < 2:
        return result
    rows = []
    for group, metrics in group_metrics(ctx):
        rows += family_rows(group.kind, metrics, max(group.scales))
    table = pd.DataFrame(rows, columns=COLUMNS)
    corr = correlations(table)
    result.tables["family_comparison"] = table
    result.tables["family_comparison_spearman"] = corr
    if ctx.config.aggregate.plots and not table.empty:
        result.figures["family_comparison"] = _figure(table)

    def num(v: Any) -> float | None:
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)

    result.json = {
        "families": list(dict.fromkeys(table["family"])),
        "spearman": [{**r, "spearman": num(r["spearman"])} for r in corr.to_dict("records")],
    }
    wide = table.pivot(index="classifier", columns="family", values=["mean_accuracy_drop", "fp_relative"])
    result.html = (
        "<p>Per classifier and family: mean accuracy drop over the family's scales and mean failure point "
        "relative to its largest scale (<code>family_comparison.csv</code>); Spearman rank correlation of the "
        "classifiers between families (<code>family_comparison_spearman.csv</code>).</p>"
        + wide.to_html(float_format=float_format(3), na_rep=NA)
        + corr.to_html(index=False, float_format=float_format(3), na_rep=NA)
        + ('<p><img src="family_comparison.png" alt="classifiers under each family"></p>' if result.figures else "")
    )
    return result
