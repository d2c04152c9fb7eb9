"""Analysis ``shift_views``: the benchmark per shift.

* ``accuracy_by_shift.png``: small multiples, one panel per shift, accuracy vs scale per
  classifier with its bootstrap band (``aggregate.bootstrap``), next to the
  shift-realisation plot of the ``cns`` analysis (how strongly each shift is realised).
* ``fp_heatmap.png``: the failure-point distribution per shift and classifier as a heat
  map (CNS-Bench Fig. 7c): one panel per classifier, rows the shifts (and all shifts
  pooled), columns the scales plus "never"; a cell is the share of the shift's evaluated
  trajectories whose failure point is that scale (``fp_ratio`` of ``failure_points.csv``).
* ``ranking.csv`` and a sortable table: classifiers ranked by the margin
  (``margin_fp_avg`` = mean of ``margin max scale - FP``, never-failed trajectories at
  the margin's maximum scale, i.e. contributing 0: the smaller, the later a classifier
  fails, the more robust it is), with the other summary metrics and their intervals.

Further families of a build get their own panels with the family kind as suffix.
"""

from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from pipeline.aggregate.metrics import ALL_SHIFTS, Metrics
from pipeline.aggregate.analysis import AnalysisContext, AnalysisResult
from pipeline.plan import scale_tag


def accuracy_small_multiples(metrics: Metrics) -> Figure:
    from pipeline.aggregate.report import colours_of

    acc = metrics.accuracy
    shifts = [s for s in metrics.shifts if (acc["shift"] == s).any()] or ["(no data)"]
    colours = colours_of(metrics.classifiers)
    ncols = min(4, len(shifts))
    nrows = math.ceil(len(shifts) / ncols)
    fig = Figure(figsize=(3.4 * ncols + 0.4, 2.9 * nrows + 0.9), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False, sharey=True)).ravel()
    band = "accuracy_ci_low" in acc.columns
    for ax, shift in zip(axes, shifts):
        for clf in metrics.classifiers:
            rows = acc[(acc["classifier"] == clf) & (acc["shift"] == shift)].sort_values("scale")
            if rows.empty:
                continue
            ax.plot(rows["scale"], rows["accuracy"], marker="o", markersize=3, label=clf, color=colours[clf])
            if band:
                ax.fill_between(rows["scale"], rows["accuracy_ci_low"], rows["accuracy_ci_high"],
                                color=colours[clf], alpha=0.15, linewidth=0)
        ax.set_title(shift, fontsize="medium")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xticks(metrics.scales, [f"{s:g}" for s in metrics.scales], fontsize="small")
        ax.grid(alpha=0.3)
    for ax in axes[len(shifts):]:
        ax.set_axis_off()
    axes[0].set_ylabel("accuracy")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(5, len(labels)), fontsize="small")
    fig.suptitle("Accuracy vs scale per shift" + (" (bands: bootstrap interval)" if band else ""))
    return fig


def fp_heatmap(metrics: Metrics) -> Figure:
    table = metrics.failure_point_table
    shifts = [s for s in metrics.shifts if (table["shift"] == s).any()] + [ALL_SHIFTS]
    columns = [f"{s:g}" for s in metrics.scales] + ["never"]
    classifiers = list(metrics.classifiers) or ["(no data)"]
    ncols = min(3, math.ceil(math.sqrt(len(classifiers))))
    nrows = math.ceil(len(classifiers) / ncols)
    fig = Figure(figsize=(max(4.6, 0.55 * len(columns) + 1.8) * ncols, (0.42 * len(shifts) + 1.3) * nrows + 0.6),
                 layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    image = None
    for ax, clf in zip(axes, classifiers):
        grid = np.full((len(shifts), len(columns)), np.nan)
        for i, shift in enumerate(shifts):
            rows = table[(table["classifier"] == clf) & (table["shift"] == shift)].sort_values("scale")
            if len(rows) == len(metrics.scales):
                grid[i, :-1] = rows["fp_ratio"].to_numpy(dtype=float)
                grid[i, -1] = 1.0 - float(rows["fp_ratio_cumulative"].iloc[-1])
        image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="magma_r", aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            if np.isfinite(v):
                # Inside its cell: left out of the layout's measuring (thousands of labels on a big grid).
                ax.text(j, i, f"{v:.2f}".lstrip("0") if v < 1 else "1", ha="center", va="center", fontsize=7,
                        color="white" if v > 0.55 else "black", in_layout=False)
        ax.set_xticks(range(len(columns)), columns, fontsize="small")
        ax.set_yticks(range(len(shifts)), shifts, fontsize="small")
        ax.set_xlabel("failure point (scale)")
        ax.set_title(clf, fontsize="medium")
    for ax in axes[len(classifiers):]:
        ax.set_axis_off()
    if image is not None:
        fig.colorbar(image, ax=list(axes[: len(classifiers)]), shrink=0.8, label="share of trajectories")
    fig.suptitle("Failure-point distribution per shift and classifier")
    return fig


RANK_METRICS = ["margin_fp_avg", "fp_avg", "accuracy_scale0"]


def ranking(metrics: Metrics) -> pd.DataFrame:
    """Classifiers ranked by ``margin_fp_avg`` (ascending: most robust first), with the accuracy drop at the largest scale."""
    summ = metrics.summary
    if summ.empty:
        return pd.DataFrame(columns=["rank", "classifier"])
    last = f"acc_drop_{scale_tag(metrics.scales[-1])}"
    cols = ["classifier"] + [c for m in RANK_METRICS + [last] for c in (m, f"{m}_ci_low", f"{m}_ci_high") if c in summ]
    out = summ[cols + ["n_failed", "n_trajectories"]].sort_values("margin_fp_avg", ascending=True, kind="stable")
    out.insert(0, "rank", np.arange(1, len(out) + 1))
    return out.reset_index(drop=True)


def run(ctx: AnalysisContext) -> AnalysisResult:
    from pipeline.aggregate.page import ci_table, image_grid
    from pipeline.aggregate.report import REALISATION_PLOT, has_realisation
    from pipeline.analyses.cns import group_metrics, with_intervals

    result = AnalysisResult(title="Per-shift views")
    per_group, _ = with_intervals(ctx, group_metrics(ctx))
    plots = ctx.config.aggregate.plots
    parts = []
    for k, (group, metrics) in enumerate(per_group):
        suffix = "" if k == 0 else f"_{group.kind}"
        if k:
            parts.append(f"<h3>Family {html.escape(group.kind)}</h3>")
        if plots:
            result.figures[f"accuracy_by_shift{suffix}"] = accuracy_small_multiples(metrics)
            result.figures[f"fp_heatmap{suffix}"] = fp_heatmap(metrics)
            names = [f"accuracy_by_shift{suffix}.png"]
            captions = {names[0]: "Accuracy vs scale per shift"}
            if has_realisation(metrics):
                stem, _, ext = REALISATION_PLOT.rpartition(".")
                names.append(f"{stem}{suffix}.{ext}")
                captions[names[1]] = "Shift realisation (DINOv2 similarity and CLIP shift gain vs scale)"
            parts += ["<h3>Accuracy per shift</h3>", image_grid(names, captions)]
            parts += [
                "<h3>Failure-point heat map</h3>",
                "<p>Share of a shift's evaluated trajectories whose failure point is each scale (never: correct at every "
                "scale); one panel per classifier, rows are shifts and all shifts pooled.</p>",
                image_grid([f"fp_heatmap{suffix}.png"]),
            ]
        rank = ranking(metrics)
        result.tables[f"ranking{suffix}"] = rank
        parts += [
            "<h3>Classifier ranking</h3>",
            "<p>Ranked by margin_fp_avg, most robust first (mean of margin max scale - failure point, never-failed "
            "trajectories at the margin max scale, i.e. 0: smaller means later failures). In brackets: bootstrap "
            "interval. Click a column header to sort by it.</p>",
            ci_table(rank, sortable=True, table_id=f"ranking{suffix}"),
        ]
    result.html = "\n".join(parts)
    return result
