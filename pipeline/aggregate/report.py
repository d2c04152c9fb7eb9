"""Write a :class:`~pipeline.aggregate.metrics.Metrics` bundle as a browsable report directory.

Role: the presentation half of aggregation; it computes nothing new.  Files written
into ``report_dir``:

* ``accuracy.csv``: :attr:`Metrics.accuracy` (``classifier, shift, scale, n, accuracy,
  accuracy_change, accuracy_drop``; ``accuracy_drop`` is positive for a drop);
* ``failure_points.csv``: the failure-point *distribution*,
  :attr:`Metrics.failure_point_table` (``classifier, shift, scale, fp_count, fp_ratio,
  fp_ratio_cumulative``, including the ``shift == "all"`` rows);
* ``summary.csv``: :attr:`Metrics.summary`, one row per classifier;
* ``trajectory_failure_points.csv`` (only with ``per_trajectory=True``): the
  per-(trajectory, classifier) failure points, large at full benchmark size;
* ``metrics.json``: :meth:`Metrics.to_json` plus ``title`` and ``config_hash``;
* ``accuracy_drop.png``, ``fp_cumulative.png``, ``fp_distribution.png`` (unless
  ``plots=False``), drawn with matplotlib's Agg canvas (no display, no pyplot state);
* ``shift_realisation.csv`` and ``shift_realisation.png`` (the PNG unless
  ``plots=False``): :attr:`Metrics.shift_realisation`, written only when some sample has
  a realisation measure (i.e. the OOC filter scored the images);
* ``index.html``: self-contained page (inline CSS, relative links only) with counts,
  the summary table, the shift-realisation table (when present) and the plots,
  assembled by :func:`pipeline.aggregate.page.page_html`.

Tables that carry bootstrap intervals (``<metric>_ci_low/_ci_high`` columns, see
:mod:`pipeline.aggregate.bootstrap`) show them as ``value [low, high]`` and as bands on
the accuracy-drop and cumulative failure-point plots.

Every file is written to a temporary name in ``report_dir`` and moved into place with
:func:`os.replace` (:func:`pipeline.io.files.write_atomic`), so a reader never sees a
half-written file; ``index.html`` is written last, so its presence means the report is complete.
"""

from __future__ import annotations

import html
import io
import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pipeline.aggregate.metrics import ALL_SHIFTS, Metrics
from pipeline.aggregate.page import ci_table
from pipeline.io.files import write_atomic
from pipeline.io.safejson import dumps as strict_dumps
from pipeline.plan import scale_tag

PLOT_FILES = ("accuracy_drop.png", "fp_cumulative.png", "fp_distribution.png")
REALISATION_CSV = "shift_realisation.csv"
REALISATION_PLOT = "shift_realisation.png"


# --------------------------------------------------------------------------- writing
def _csv_bytes(df: pd.DataFrame) -> bytes:
    # Default float repr round-trips exactly; NaN becomes an empty field.
    return df.to_csv(index=False, lineterminator="\n").encode("utf-8")


def png_bytes(fig: Figure) -> bytes:
    """A figure as PNG bytes (110 dpi)."""
    FigureCanvasAgg(fig)  # attach the Agg canvas explicitly: no dependency on the pyplot backend
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


# --------------------------------------------------------------------------- plots
def colours_of(classifiers: Sequence[str]) -> dict[str, Any]:
    """One colour per name, shared by every plot of a report so that the legends agree, and
    the same for the same name in every report: a name's colour is a slot of tab20 picked
    by a digest of the name (the next free slot, in the given order, when two names of one
    report pick the same), so adding a classifier does not recolour the others."""
    import hashlib

    from matplotlib import colormaps

    n = len(classifiers)
    if n > 20:
        # Beyond tab20 qualitative maps repeat colours; sample a continuous map instead.
        cmap = colormaps["turbo"]
        return {c: cmap(x) for c, x in zip(classifiers, np.linspace(0.05, 0.95, n))}
    cmap, taken, out = colormaps["tab20"], set(), {}
    for c in classifiers:
        slot = int.from_bytes(hashlib.sha256(c.encode("utf-8")).digest()[:4], "big") % 20
        while slot in taken:
            slot = (slot + 1) % 20
        taken.add(slot)
        out[c] = cmap(slot)
    return out


def _no_data_figure(title: str, message: str) -> Figure:
    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=13, transform=ax.transAxes)
    return fig


def _empty_message(metrics: Metrics) -> str | None:
    if metrics.n_trajectories_complete == 0:
        return "no complete trajectories"
    if not metrics.classifiers:
        return "no evaluated trajectories (no predictions for the complete trajectories)"
    return None


def _outside_legend(fig: Figure, ax: Any, n: int) -> None:
    # Outside the axes: with 20+ classifiers a legend inside would cover the curves.
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small", ncols=math.ceil(n / 16))


def _band(ax: Any, x: Sequence[float], row: Any, names: list[str], colour: Any, factor: float = 1.0) -> None:
    """The bootstrap interval of ``names`` (columns ``<name>_ci_low/_ci_high`` of ``row``) as a band."""
    if f"{names[0]}_ci_low" not in row.index:
        return
    low = [factor * row[f"{n}_ci_low"] for n in names]
    high = [factor * row[f"{n}_ci_high"] for n in names]
    ax.fill_between(x, low, high, color=colour, alpha=0.15, linewidth=0)


def _per_classifier_plot(metrics: Metrics, title: str, ylabel: str, draw, ylim: tuple[float, float] | None = None) -> Figure:
    """One panel over the scales, ``draw(ax, colours)`` a line per classifier, the legend outside
    (or a figure saying why there is no data): the skeleton of the summary plots."""
    message = _empty_message(metrics)
    if message:
        return _no_data_figure(title, message)
    colours = colours_of(metrics.classifiers)
    fig = Figure(figsize=(7.5 + 1.6 * math.ceil(len(metrics.classifiers) / 16), 4.5), layout="constrained")
    ax = fig.add_subplot()
    draw(ax, colours)
    ax.set_xlabel("shift scale")
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_xticks(metrics.scales)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _outside_legend(fig, ax, len(metrics.classifiers))
    return fig


def _plot_accuracy_drop(metrics: Metrics) -> Figure:
    def draw(ax, colours) -> None:
        for _, row in metrics.summary.iterrows():
            columns = [f"acc_drop_{scale_tag(s)}" for s in metrics.scales]
            colour = colours[row["classifier"]]
            ax.plot(metrics.scales, [100.0 * row[c] for c in columns], marker="o", label=str(row["classifier"]), color=colour)
            _band(ax, metrics.scales, row, columns, colour, 100.0)
        ax.axhline(0.0, color="grey", linewidth=0.8)

    return _per_classifier_plot(
        metrics, "Accuracy drop vs shift scale (mean over shifts)",
        "accuracy drop (percentage points, positive = drop)", draw,
    )


def _plot_fp_cumulative(metrics: Metrics) -> Figure:
    table = metrics.failure_point_table

    def draw(ax, colours) -> None:
        for clf in metrics.classifiers:
            rows = table[(table["classifier"] == clf) & (table["shift"] == ALL_SHIFTS)]
            ax.plot(rows["scale"], rows["fp_ratio_cumulative"], marker="o", label=clf, color=colours[clf])
            if "fp_ratio_cumulative_ci_low" in rows.columns:
                ax.fill_between(
                    rows["scale"], rows["fp_ratio_cumulative_ci_low"], rows["fp_ratio_cumulative_ci_high"],
                    color=colours[clf], alpha=0.15, linewidth=0,
                )

    return _per_classifier_plot(
        metrics, "Cumulative failure-point ratio (all shifts)", "share of trajectories failed at or before scale",
        draw, ylim=(0.0, 1.0),
    )


def _plot_fp_distribution(metrics: Metrics) -> Figure:
    title = "Failure points per scale"
    message = _empty_message(metrics)
    if message:
        return _no_data_figure(title, message)
    colours = colours_of(metrics.classifiers)
    table = metrics.failure_point_table
    shifts = [s for s in metrics.shifts if (table["shift"] == s).any()]
    ncols = min(3, len(shifts))
    nrows = math.ceil(len(shifts) / ncols)
    fig = Figure(figsize=(4.8 * ncols, 3.4 * nrows + 0.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    x = np.arange(len(metrics.scales))
    width = 0.8 / max(1, len(metrics.classifiers))
    for ax, shift in zip(axes, shifts):
        for i, clf in enumerate(metrics.classifiers):
            rows = table[(table["classifier"] == clf) & (table["shift"] == shift)]
            if rows.empty:
                continue
            ax.bar(x - 0.4 + (i + 0.5) * width, rows["fp_count"], width, label=clf, color=colours[clf])
        ax.set_title(shift)
        ax.set_xticks(x, [f"{s:g}" for s in metrics.scales])
        ax.set_xlabel("failure point (scale)")
        ax.set_ylabel("trajectories")
        ax.yaxis.get_major_locator().set_params(integer=True)
    for ax in axes[len(shifts) :]:
        ax.set_axis_off()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)), fontsize="small")
    fig.suptitle(title)
    return fig


def has_realisation(metrics: Metrics) -> bool:
    """Whether any (shift, scale) has a finite realisation measure (the filter ran)."""
    table = metrics.shift_realisation
    values = table[["clip_shift_alignment_delta", "dino_similarity"]].to_numpy(dtype=float)
    return bool(np.isfinite(values).any())


def _plot_shift_realisation(metrics: Metrics) -> Figure:
    """Fig. 3 of CNS-Bench per shift: DINOv2 similarity to scale 0 and CLIP shift gain vs scale."""
    table = metrics.shift_realisation
    shifts = sorted(str(s) for s in pd.unique(table["shift"]))
    colours = colours_of(shifts)
    fig = Figure(figsize=(11.0 + 1.6 * math.ceil(len(shifts) / 16), 4.2), layout="constrained")
    ax_dino, ax_clip = fig.subplots(1, 2)
    for shift in shifts:
        rows = table[table["shift"] == shift]
        ax_dino.plot(rows["scale"], rows["dino_similarity"], marker="o", label=shift, color=colours[shift])
        ax_clip.plot(rows["scale"], rows["clip_shift_alignment_delta"], marker="o", label=shift, color=colours[shift])
    ax_dino.set_ylabel("DINOv2 cosine similarity to scale 0")
    ax_dino.set_title("Image variation")
    ax_clip.set_ylabel('CLIPScore gain to "a picture in {shift}"')
    ax_clip.set_title("Shift realisation")
    ax_clip.axhline(0.0, color="grey", linewidth=0.8)
    for ax in (ax_dino, ax_clip):
        ax.set_xlabel("shift scale")
        ax.set_xticks(metrics.scales)
        ax.grid(alpha=0.3)
    _outside_legend(fig, ax_clip, len(shifts))
    return fig


# --------------------------------------------------------------------------- html
def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return "n/a" if math.isnan(value) else f"{float(value):.4f}"
    return str(value)


def _html_table(df: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>"
        for row in df.itertuples(index=False, name=None)
    )
    if not body:
        body = f'<tr><td colspan="{len(df.columns)}">no rows</td></tr>'
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def breaks_table(metrics: Metrics) -> pd.DataFrame:
    """Where each classifier breaks, one row per classifier (the config's order): its accuracy
    drop at the largest scale (mean over shifts), then per shift the median failure point of
    the trajectories it fails, how many of the evaluated ones those are, and the drop there."""
    top = max(metrics.scales)
    acc, fps = metrics.accuracy, metrics.failure_points
    at_top = acc[np.isclose(acc["scale"], top)]
    rows = []
    for c in metrics.classifiers:
        mine = at_top[at_top["classifier"] == c].set_index("shift")["accuracy_drop"]
        row: dict[str, Any] = {"classifier": c, f"accuracy drop at {top:g}": _fmt(mine.mean()) if len(mine) else "n/a"}
        for shift in metrics.shifts:
            points = fps[(fps["classifier"] == c) & (fps["shift"] == shift)]["failure_point"]
            failed = points.dropna()
            where = f"breaks at {failed.median():g}" if len(failed) else "never breaks"
            drop = f", drop {_fmt(mine[shift])}" if shift in mine.index else ""
            row[shift] = f"{where} ({len(failed)}/{len(points)}){drop}"
        rows.append(row)
    return pd.DataFrame(rows)


def cns_section(metrics: Metrics, plot_files: list[str]) -> str:
    """The HTML body of the CNS metrics: where each classifier breaks first, then the
    settings, dataset counts, summary, realisation and plots."""
    e = html.escape
    counts = pd.DataFrame(
        [
            ("samples", metrics.n_samples),
            ("samples kept by the filter", metrics.n_kept),
            ("trajectories", metrics.n_trajectories_total),
            ("complete trajectories (evaluated)", metrics.n_trajectories_complete),
            ("classifiers", len(metrics.classifiers)),
            ("shifts", len(metrics.shifts)),
        ],
        columns=["count", "value"],
    )
    parts = []
    if metrics.classifiers and metrics.n_trajectories_complete:
        parts += [
            "<h2>Where each classifier breaks</h2>",
            f"<p>Per shift: the median failure point (the first scale a classifier gets wrong) of the trajectories "
            f"it fails (failed / evaluated), and its accuracy drop at the largest scale, "
            f"{e(f'{max(metrics.scales):g}')}. Only complete trajectories count (every scale present and kept by "
            f"the filter): {metrics.n_trajectories_complete} of {metrics.n_trajectories_total}.</p>",
            _html_table(breaks_table(metrics)),
        ]
    parts += [
        f"<p>scales: {e(', '.join(f'{s:g}' for s in metrics.scales))}; "
        f"margin max scale: {e(f'{metrics.margin_max_scale:g}')}; "
        f"fp_std ddof: {e(str(metrics.fp_std_ddof))}</p>"
    ]
    kept = metrics.kept_by_scale.assign(scale=[f"{s:g}" for s in metrics.kept_by_scale["scale"]])
    parts += ["<h2>Dataset</h2>", _html_table(counts), _html_table(kept)]
    parts += [
        "<h2>Summary</h2>",
        "<p>acc_drop_*: accuracy(0) - accuracy(scale), positive = drop, mean of the per-shift drops (fractions); "
        "acc_drop_pooled_*: the same with accuracies pooled over the images of all shifts; "
        "fp_avg / fp_std: failure point over failed trajectories; "
        "margin_fp_avg: mean of (margin max scale - failure point), never-failed trajectories at the margin max scale."
        + (" In brackets: bootstrap confidence interval (trajectories resampled within classes)." if _has_ci(metrics.summary) else "")
        + " Click a column to sort.</p>",
        ci_table(metrics.summary, sortable=True),
    ]
    if has_realisation(metrics):
        table = metrics.shift_realisation.assign(scale=[f"{s:g}" for s in metrics.shift_realisation["scale"]])
        parts += [
            "<h2>Shift realisation</h2>",
            "<p>Per shift and scale over all generated samples: clip_shift_alignment_delta = mean CLIPScore gain "
            "of an image to &quot;a picture in {shift}&quot; over its trajectory&#x27;s scale-0 image; "
            "dino_similarity = mean DINOv2 class-token cosine similarity to the scale-0 image.</p>",
            _html_table(table),
        ]
    if plot_files:
        parts.append("<h2>Plots</h2>")
        for name in plot_files:
            parts.append(f'<div><img src="{e(name, quote=True)}" alt="{e(name, quote=True)}"></div>')
    return "\n".join(parts)


def _has_ci(df: pd.DataFrame) -> bool:
    return any(str(c).endswith("_ci_low") for c in df.columns)


def pairwise_section(table: pd.DataFrame, spec: Any) -> str:
    """HTML of the pairwise comparison of classifiers (:func:`pipeline.aggregate.bootstrap.intervals`)."""
    level = f"{100 * spec.level:g}%"
    shown = table.rename(columns={"ci_low": "difference_ci_low", "ci_high": "difference_ci_high"})
    return "\n".join(
        [
            "<h2>Pairwise comparison</h2>",
            f"<p>Difference a - b of the mean failure point over failed trajectories (fp_avg) and of the margin "
            f"(margin_fp_avg), with its {level} bootstrap interval ({spec.resamples} resamples of the trajectories "
            "within (shift, class), the same draw for both classifiers). <em>excludes_zero</em>: the interval lies "
            "entirely above or below 0, i.e. the difference is beyond resampling noise at that level.</p>",
            ci_table(shown, sortable=True),
        ]
    )


def page_html(title: str, config_hash: str | None, sections: list[tuple[str, str]], data_files: list[str]) -> str:
    """The report's ``index.html`` (see :func:`pipeline.aggregate.page.page_html`)."""
    from pipeline.aggregate.page import page_html as assemble

    return assemble(title, config_hash, sections, data_files)


def _index_html(metrics: Metrics, title: str, config_hash: str | None, plot_files: list[str], data_files: list[str]) -> str:
    return page_html(title, config_hash, [("", cns_section(metrics, plot_files))], data_files)


def cns_files(
    metrics: Metrics, *, plots: bool = True, per_trajectory: bool = False, suffix: str = ""
) -> tuple[dict[str, bytes], list[str]]:
    """The CNS report files as ``{name: bytes}`` (no index.html), and the plot names among them.

    ``suffix`` is appended to each file stem (``accuracy_drop_corruption.png``), for the
    plots of a family other than the build's primary one.
    """
    files: dict[str, bytes] = {}

    def name(base: str) -> str:
        stem, dot, ext = base.rpartition(".")
        return f"{stem}{suffix}{dot}{ext}"

    if not suffix:
        files["accuracy.csv"] = _csv_bytes(metrics.accuracy)
        files["failure_points.csv"] = _csv_bytes(metrics.failure_point_table)
        files["summary.csv"] = _csv_bytes(metrics.summary)
        if per_trajectory:
            files["trajectory_failure_points.csv"] = _csv_bytes(metrics.failure_points)
    plot_files: list[str] = []
    if plots:
        for base, draw in zip(PLOT_FILES, (_plot_accuracy_drop, _plot_fp_cumulative, _plot_fp_distribution)):
            files[name(base)] = png_bytes(draw(metrics))
            plot_files.append(name(base))
    if has_realisation(metrics):
        if not suffix:
            files[REALISATION_CSV] = _csv_bytes(metrics.shift_realisation)
        if plots:
            files[name(REALISATION_PLOT)] = png_bytes(_plot_shift_realisation(metrics))
            plot_files.append(name(REALISATION_PLOT))
    return files, plot_files


# --------------------------------------------------------------------------- public API
def write_report(
    metrics: Metrics,
    report_dir: str | os.PathLike[str],
    title: str,
    config_hash: str | None = None,
    *,
    plots: bool = True,
    per_trajectory: bool = False,
) -> dict[str, str]:
    """Write the report files (see the module docstring) into ``report_dir``.

    Creates ``report_dir`` if needed and overwrites earlier files of the same names, each
    atomically.  ``plots=False`` skips the PNGs (``AggregateSpec.plots``);
    ``per_trajectory=True`` also writes ``trajectory_failure_points.csv``.  Metrics
    without complete trajectories give header-only CSVs and plots that say so.

    Returns ``{file name: absolute path}`` of every file written, e.g.
    ``{"accuracy.csv": "/.../accuracy.csv", ..., "index.html": "/.../index.html"}``.
    """
    out_dir = Path(report_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}

    def put(name: str, data: bytes) -> None:
        path = out_dir / name
        write_atomic(str(path), data)
        written[name] = str(path)

    files, plot_files = cns_files(metrics, plots=plots, per_trajectory=per_trajectory)
    doc = {"title": title, "config_hash": config_hash, **metrics.to_json()}
    # Strict JSON: a non-finite number (undefined on degenerate data) is written as null.
    files["metrics.json"] = (strict_dumps(doc, indent=2) + "\n").encode("utf-8")
    for name in ("accuracy.csv", "failure_points.csv", "summary.csv", "trajectory_failure_points.csv", "metrics.json"):
        if name in files:
            put(name, files.pop(name))
    for name, data in files.items():
        put(name, data)
    data_files = [n for n in written if not n.endswith(".png")]
    put("index.html", _index_html(metrics, title, config_hash, plot_files, data_files).encode("utf-8"))
    return written
