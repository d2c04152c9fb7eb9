"""Analysis ``corruption_error``: ImageNet-C corruption error (CE), mCE and relative mCE.

Definitions (Hendrycks & Dietterich 2019), per classifier ``f`` and corruption ``c``,
with ``E(f, c, s)`` the top-1 error on the images of corruption ``c`` at severity ``s``
and ``E_clean(f)`` the error on the uncorrupted images (severity 0):

* unnormalised CE: ``mean_s E(f, c, s)`` over the integer severities 1..5 of the grid;
* CE normalised by a baseline classifier ``b`` of the build (option ``baseline``):
  ``sum_s E(f, c, s) / sum_s E(b, c, s)``; relative CE:
  ``sum_s (E(f, c, s) - E_clean(f)) / sum_s (E(b, c, s) - E_clean(b))``;
* CE normalised by AlexNet's published errors (``pipeline/data/imagenet_c_alexnet.json``,
  the 15 benchmark corruptions only): ``mean_s E / E_AlexNet(c)``; relative:
  ``(mean_s E - E_clean) / (E_AlexNet(c) - E_clean,AlexNet)``.  Meaningful for ImageNet
  classifiers on ImageNet-like images only.  AlexNet's errors are averages over all five
  severities, so a corruption whose grid lacks one of the severities 1..5 gets none (a
  partial grid is refused, not normalised by a grid it does not have);
* mCE / relative mCE: the mean over the benchmark corruptions of the build (the 4
  extra corruptions are reported but, as in the paper, not averaged; a build with only
  extra corruptions averages those).  The AlexNet-normalised mCE exists only over all 15
  benchmark corruptions at all five severities, as published; otherwise it is NaN and
  the report says what is missing (:func:`alexnet_mce_gaps`).

Errors are over every kept image at a severity (ImageNet-C's per-severity error); a
severity-0 image belongs to every corruption.  Failure points over the continuous grid
(the first severity at which a classifier is wrong) come from
:mod:`pipeline.aggregate.metrics` on complete trajectories.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.aggregate.analysis import AnalysisContext, AnalysisResult
from pipeline.aggregate.page import NA, float_format
from pipeline.errors import CnsbenchError

ALEXNET_FILE = Path(__file__).resolve().parents[1] / "data" / "imagenet_c_alexnet.json"
SEVERITIES = (1.0, 2.0, 3.0, 4.0, 5.0)
MEAN_ROW = "mean"  # value of the corruption column for the mCE rows
COLUMNS = [
    "classifier", "corruption", "category", "in_mce", "n_images", "error_clean",
    "error_s1", "error_s2", "error_s3", "error_s4", "error_s5",
    "ce_unnormalized", "ce_baseline", "relative_ce_baseline", "ce_alexnet", "relative_ce_alexnet",
    "fp_mean", "failed_share",
]  # fmt: skip


def alexnet_errors() -> tuple[dict[str, float], float]:
    """AlexNet's published per-corruption errors and its clean error (fractions)."""
    data = json.loads(ALEXNET_FILE.read_text())
    return {k: float(v) for k, v in data["errors"].items()}, float(data["clean_error"])


def severity_errors(samples: pd.DataFrame, predictions: pd.DataFrame, corruptions: list[str]) -> pd.DataFrame:
    """Top-1 error per (classifier, corruption, severity) over kept images: columns
    ``classifier, corruption, severity, n, error``."""
    s = samples[samples["shift"].isin(corruptions)]
    if "kept" in s.columns:
        s = s[s["kept"].astype("boolean").fillna(False).astype(bool)]
    rows = s[["sample_id", "shift", "scale"]].merge(
        predictions.loc[predictions["correct"].notna(), ["sample_id", "classifier", "correct"]], on="sample_id"
    )
    if rows.empty:
        return pd.DataFrame(columns=["classifier", "corruption", "severity", "n", "error"])
    rows["severity"] = (rows["scale"].astype(float) * 1000).round() / 1000
    g = rows.groupby(["classifier", "shift", "severity"], sort=False)["correct"].agg(n="size", acc="mean").reset_index()
    g["error"] = 1.0 - g["acc"].astype(float)
    order = {c: i for i, c in enumerate(pd.unique(predictions["classifier"]))}
    g = g.rename(columns={"shift": "corruption"})[["classifier", "corruption", "severity", "n", "error"]]
    return g.sort_values(["classifier", "corruption", "severity"], key=lambda c: c.map(order) if c.name == "classifier" else c)


def _ratio(num: float, den: float) -> float:
    return num / den if den and not math.isnan(den) and not math.isnan(num) else math.nan


def corruption_table(
    errors: pd.DataFrame,
    baseline: str | None = None,
    alexnet: tuple[dict[str, float], float] | None = None,
    failure: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """CE per (classifier, corruption) and one ``mean`` row per classifier (mCE); columns :data:`COLUMNS`.

    ``errors``: :func:`severity_errors`.  ``failure``: optional columns ``classifier,
    corruption, fp_mean, failed_share``.
    """
    from pipeline.families.corruption.params import BENCHMARK, CATEGORY

    if baseline is not None and baseline not in set(errors["classifier"]):
        raise CnsbenchError(f"corruption_error: baseline classifier {baseline!r} has no predictions in this output")
    table: dict[tuple[str, str], dict[int | float, float]] = {}
    counts: dict[tuple[str, str], int] = {}
    for r in errors.itertuples(index=False):
        table.setdefault((r.classifier, r.corruption), {})[float(r.severity)] = float(r.error)
        counts[(r.classifier, r.corruption)] = counts.get((r.classifier, r.corruption), 0) + int(r.n)
    classifiers = list(dict.fromkeys(errors["classifier"]))
    corruptions = sorted(set(errors["corruption"]), key=lambda c: (c not in BENCHMARK, list(CATEGORY).index(c) if c in CATEGORY else 99, c))
    an, an_clean = alexnet if alexnet else ({}, math.nan)
    fail = {} if failure is None else {(r.classifier, r.corruption): r for r in failure.itertuples(index=False)}

    def sev_sum(clf: str, cor: str, minus: float = 0.0) -> tuple[float, int]:
        e = table.get((clf, cor), {})
        vals = [e[s] - minus for s in SEVERITIES if s in e]
        return (float(sum(vals)) if vals else math.nan), len(vals)

    rows = []
    for clf in classifiers:
        for cor in corruptions:
            e = table.get((clf, cor), {})
            clean = e.get(0.0, math.nan)
            total, n_sev = sev_sum(clf, cor)
            ce = total / n_sev if n_sev else math.nan
            row: dict[str, Any] = {
                "classifier": clf, "corruption": cor, "category": CATEGORY.get(cor, ""),
                "in_mce": cor in BENCHMARK, "n_images": counts.get((clf, cor), 0), "error_clean": clean,
                **{f"error_s{int(s)}": e.get(s, math.nan) for s in SEVERITIES},
                "ce_unnormalized": ce,
            }  # fmt: skip
            if baseline is not None:
                b_total, _ = sev_sum(baseline, cor)
                b_clean = table.get((baseline, cor), {}).get(0.0, math.nan)
                rel, _ = sev_sum(clf, cor, clean)
                b_rel, _ = sev_sum(baseline, cor, b_clean)
                row["ce_baseline"] = _ratio(total, b_total)
                row["relative_ce_baseline"] = _ratio(rel, b_rel)
            else:
                row["ce_baseline"] = row["relative_ce_baseline"] = math.nan
            ref = an.get(cor, math.nan) if n_sev == len(SEVERITIES) else math.nan  # a partial grid is refused
            row["ce_alexnet"] = _ratio(ce, ref)
            row["relative_ce_alexnet"] = _ratio(ce - clean, ref - an_clean)
            f = fail.get((clf, cor))
            row["fp_mean"] = float(f.fp_mean) if f is not None else math.nan
            row["failed_share"] = float(f.failed_share) if f is not None else math.nan
            rows.append(row)
    out = pd.DataFrame(rows, columns=COLUMNS)
    means = []
    for clf in classifiers:
        mine = out[out["classifier"] == clf]
        use = mine[mine["in_mce"]] if mine["in_mce"].any() else mine
        row = {c: math.nan for c in COLUMNS}
        row.update(classifier=clf, corruption=MEAN_ROW, category="", in_mce=bool(mine["in_mce"].any()))
        row["n_images"] = int(use["n_images"].sum())
        for col in COLUMNS[5:]:
            row[col] = float(use[col].mean()) if use[col].notna().any() else math.nan
        if alexnet is None or alexnet_mce_gaps(mine):  # the published mCE: all 15 corruptions, all severities
            row["ce_alexnet"] = row["relative_ce_alexnet"] = math.nan
        means.append(row)
    return pd.concat([out, pd.DataFrame(means, columns=COLUMNS)], ignore_index=True)


def alexnet_mce_gaps(rows: pd.DataFrame) -> list[str]:
    """Why one classifier's per-corruption rows (:data:`COLUMNS`) give no AlexNet-normalised
    mCE: benchmark corruptions missing, or lacking some of the severities 1..5 (empty: none)."""
    from pipeline.families.corruption.params import BENCHMARK

    have = {r.corruption: r for r in rows.itertuples(index=False)}
    missing = [c for c in BENCHMARK if c not in have]
    partial = [
        c for c in BENCHMARK
        if c in have and any(math.isnan(getattr(have[c], f"error_s{int(s)}")) for s in SEVERITIES)
    ]  # fmt: skip
    gaps = []
    if missing:
        gaps.append(f"{len(missing)} of the 15 benchmark corruptions missing ({', '.join(missing)})")
    if partial:
        gaps.append(f"severities 1..5 incomplete for {', '.join(partial)}")
    return gaps


def _failure(ctx: AnalysisContext, groups) -> pd.DataFrame:
    from pipeline.aggregate.metrics import failure_points

    frames = []
    for g in groups:
        samples = ctx.samples_of(g)
        preds = ctx.predictions[ctx.predictions["sample_id"].isin(samples["sample_id"])]
        fps = failure_points(samples, preds, list(g.scales))
        if fps.empty:
            continue
        agg = fps.groupby(["classifier", "shift"], sort=False)["failure_point"].agg(
            fp_mean="mean", failed_share=lambda v: float(v.notna().mean())
        )
        frames.append(agg.reset_index().rename(columns={"shift": "corruption"}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["classifier", "corruption", "fp_mean", "failed_share"])


def _figure(errors: pd.DataFrame):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cors = list(dict.fromkeys(errors["corruption"]))
    n = len(cors)
    cols = min(5, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 2.4 * rows), squeeze=False, sharey=True)
    for ax, cor in zip(axes.flat, cors):
        sub = errors[errors["corruption"] == cor]
        for clf, part in sub.groupby("classifier", sort=False):
            ax.plot(part["severity"], 1.0 - part["error"], marker=".", label=clf)
        ax.set_title(cor, fontsize=9)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].set_ylabel("accuracy")
    axes.flat[0].legend(fontsize=7)
    fig.supxlabel("severity")
    fig.tight_layout()
    return fig


def run(ctx: AnalysisContext) -> AnalysisResult:
    """Options: ``baseline`` (a classifier name of the build), ``alexnet`` (default true)."""
    groups = [g for g in ctx.groups if g.kind == "corruption"]
    corruptions = [s for g in groups for s in g.shifts]
    if not corruptions:  # e.g. an ImageNet-C evaluate output: its shifts are corruption names
        from pipeline.families.corruption.params import ALL

        corruptions = [s for s in ctx.config.all_shifts() if s in ALL]
        groups = [g for g in ctx.groups if set(g.shifts) & set(corruptions)]
    result = AnalysisResult(title="Corruption error (ImageNet-C)")
    if not corruptions:
        return result
    baseline = ctx.options.get("baseline")
    names = [c.name for c in ctx.config.classifiers]
    if baseline is not None and baseline not in names:
        raise CnsbenchError(f"aggregate.analyses[corruption_error].baseline: {baseline!r} is not a classifier of this build ({', '.join(names)})")
    use_alexnet = bool(ctx.options.get("alexnet", True))
    errors = severity_errors(ctx.samples, ctx.predictions, corruptions)
    table = corruption_table(errors, baseline, alexnet_errors() if use_alexnet else None, _failure(ctx, groups))
    result.tables["corruption_error"] = table
    result.tables["corruption_severity_error"] = errors
    if ctx.config.aggregate.plots and not errors.empty:
        result.figures["corruption_accuracy"] = _figure(errors)
    means = table[table["corruption"] == MEAN_ROW].set_index("classifier")

    def num(v: Any) -> float | None:
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)

    gaps = {
        clf: alexnet_mce_gaps(table[(table["classifier"] == clf) & (table["corruption"] != MEAN_ROW)])
        for clf in means.index
    }
    refused = next((g for g in gaps.values() if g), []) if use_alexnet else []
    result.json = {
        "baseline": baseline,
        "mce_alexnet_refused": "; ".join(refused) or None,
        "mce_corruptions": sorted(set(table.loc[table["in_mce"] & (table["corruption"] != MEAN_ROW), "corruption"])),
        "classifiers": {
            clf: {
                "mce_unnormalized": num(r["ce_unnormalized"]),
                "mce_baseline": num(r["ce_baseline"]),
                "relative_mce_baseline": num(r["relative_ce_baseline"]),
                "mce_alexnet": num(r["ce_alexnet"]),
                "relative_mce_alexnet": num(r["relative_ce_alexnet"]),
                "error_clean": num(r["error_clean"]),
                "fp_mean": num(r["fp_mean"]),
            }
            for clf, r in means.iterrows()
        },
    }
    show = means[["ce_unnormalized", "ce_baseline", "relative_ce_baseline", "ce_alexnet", "relative_ce_alexnet", "error_clean", "fp_mean"]]
    show = show.rename(columns={c: c.replace("ce_", "mce_", 1) if c.startswith("ce_") else c for c in show.columns})
    result.html = (
        "<p>Corruption error per corruption in <code>corruption_error.csv</code> (rows <code>mean</code>: mCE over "
        "the benchmark corruptions); normalised by "
        + (f"baseline classifier <b>{baseline}</b> and " if baseline else "")
        + "AlexNet's published errors (ImageNet classifiers only).</p>"
        + (
            "<p>No AlexNet-normalised mCE: it is defined over the 15 benchmark corruptions at severities 1..5 "
            f"and this grid is partial ({html.escape('; '.join(refused))}).</p>"
            if refused
            else ""
        )
        + show.to_html(float_format=float_format(3), na_rep=NA)
        + ('<p><img src="corruption_accuracy.png" alt="accuracy per corruption and severity"></p>' if "corruption_accuracy" in result.figures else "")
    )
    return result
