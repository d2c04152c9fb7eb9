"""The headline metrics of each benchmark family, for one model, with bootstrap intervals.

A shift family names its card benchmark and the function here that computes its headline
(``Family.headline``, :func:`pipeline.card.suite.card_benchmarks`); :func:`headline` calls it.
Each family's numbers are those of its paper, computed by the functions its report uses,
on the output's committed tables restricted to the card's model (and, for corruptions,
the suite's baseline), so each equals the same number in the benchmark's own report:

=============  =====================================================================
family         headline (details)
=============  =====================================================================
cns            accuracy drop at the largest scale, mean over shifts (``summary.csv``);
               per-shift drops, the failure-point distribution over all shifts
               (``failure_points.csv``, shift ``all``), mean failure point, margin
cns of a       the same, on the output's primary family (the slider trajectories)
corruptions    mCE over the benchmark corruptions, normalised by the suite's baseline
               (a classifier, or AlexNet's published errors), ``corruption_error.csv``;
               CE per corruption, unnormalised and relative mCE
imagenet_d     accuracy per nuisance at the nuisance's scale (``accuracy.csv``), and
               their mean
ximagenet      the robustness score S (``robustness_score.csv``); C(i) per scenario
imagenet_e     mean accuracy drop at ImageNet-E's published levels
               (``attributes_summary.csv``; every edited level when none is present);
               the drop per attribute and level (``attributes.csv``)
=============  =====================================================================

Intervals are percentile bootstrap intervals (:mod:`pipeline.aggregate.bootstrap`, the
output's ``aggregate.bootstrap`` level and seed; 1000 resamples where it asks for none):
trajectories are resampled within (shift, class) and every statistic is recomputed on the
resample.  An adaptive build's CNS numbers (``sampling``, docs/adaptive.md) are its report's
stratified estimates with their normal intervals instead (:func:`interval_design`).  For the robustness score the units are (class, seed) within class; its inner
term, from linear probes trained per scenario, is held at its value.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd

from pipeline.aggregate import bootstrap
from pipeline.aggregate.analysis import AnalysisContext
from pipeline.card.schema import higher_is_better
from pipeline.card.suite import ALEXNET, headline_function
from pipeline.config import BuildConfig
from pipeline.config.output import BootstrapSpec
from pipeline.errors import CnsbenchError

CHUNK_CELLS = 4_000_000  # resamples x units per chunk of the corruption and score bootstraps


@dataclass
class Value:
    """One number of a card: its metric, what it is of (``key``), the value and its interval."""

    metric: str
    value: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    key: dict[str, Any] = field(default_factory=dict)


@dataclass
class Headline:
    metric: str
    value: float | None
    ci_low: float | None
    ci_high: float | None
    higher_is_better: bool
    description: str
    n_units: int
    details: list[Value]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Tables:
    """What a family's metrics read: the output's config and tables, the model, the baseline."""

    config: BuildConfig
    samples: pd.DataFrame
    predictions: pd.DataFrame  # of the model (and the baseline) only
    model: str
    baseline: str | None = None  # a classifier name or ALEXNET (corruptions)
    read_image: Callable[[str], bytes] | None = None

    @property
    def spec(self) -> BootstrapSpec:
        spec = self.config.aggregate.bootstrap
        return spec if spec.resamples else BootstrapSpec(level=spec.level, seed=spec.seed)

    def context(self, options: dict[str, Any] | None = None, classifiers: list[str] | None = None) -> AnalysisContext:
        keep = classifiers or [self.model]
        cfg = self.config.model_copy(update={"classifiers": [c for c in self.config.classifiers if c.name in keep]})
        return AnalysisContext(cfg, self.samples, self.predictions[self.predictions["classifier"].isin(keep)],
                               options=options or {}, read_image=self.read_image)

    def options(self, analysis: str) -> dict[str, Any]:
        return next((o for n, o in self.config.aggregate.analysis_entries() if n == analysis), {})


def num(v: Any) -> float | None:
    """A float for JSON: None for NaN, missing or infinite."""
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def interval(values: np.ndarray, level: float) -> tuple[float | None, float | None]:
    low, high = bootstrap.percentile_interval(np.asarray(values, dtype=float), level)
    return num(low), num(high)


def _group_tables(t: Tables, group) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    samples = t.samples[t.samples["shift"].isin(group.shifts)]
    preds = t.predictions[(t.predictions["classifier"] == t.model) & t.predictions["sample_id"].isin(samples["sample_id"])]
    margin = max(t.config.aggregate.margin_max_scale, max(group.scales))
    return samples, preds, margin


# --------------------------------------------------------------------------- CNS
def cns(t: Tables) -> Headline:
    from pipeline.aggregate.metrics import ALL_SHIFTS, compute_metrics
    from pipeline.plan import scale_tag

    group = t.config.family_groups()[0]
    samples, preds, margin = _group_tables(t, group)
    m = compute_metrics(samples, preds, list(group.scales), margin, fp_std_ddof=t.config.aggregate.fp_std_ddof)
    if t.config.sampling is not None:
        # An adaptive build: the report's stratified estimates and their intervals, as its
        # pooled numbers are not the uniform design's (docs/adaptive.md).
        from pipeline.aggregate.adaptive import weighted_group

        m, _ = weighted_group(t.config, samples, preds, m, group.kind)
        iv = None
    else:
        spec = t.spec
        iv = bootstrap.intervals(samples, preds, m, resamples=spec.resamples, level=spec.level, seed=spec.seed)
    top = max(group.scales)
    tag = f"acc_drop_{scale_tag(top)}"
    summ = m.summary.set_index("classifier")
    ci = summ if iv is None else iv.summary.set_index("classifier") if not iv.summary.empty else pd.DataFrame()

    def summary_value(col: str, metric: str, key: dict) -> Value:
        v = summ.at[t.model, col] if t.model in summ.index else None
        has = t.model in ci.index and col + bootstrap.CI_LOW in ci.columns
        low = ci.at[t.model, col + bootstrap.CI_LOW] if has else None
        high = ci.at[t.model, col + bootstrap.CI_HIGH] if has else None
        return Value(metric, num(v), num(low), num(high), key)

    head = summary_value(tag, "accuracy_drop", {"scale": top, "shift": "mean over shifts"})
    details = [summary_value("accuracy_scale0", "accuracy_clean", {"scale": 0.0})]
    acc = m.accuracy
    if iv is not None and not iv.accuracy.empty:
        acc = acc.merge(iv.accuracy, on=["classifier", "shift", "scale"], how="left")
    for r in acc[(acc["scale"] == top)].itertuples(index=False):
        details.append(Value("accuracy_drop", num(r.accuracy_drop), num(getattr(r, "accuracy_drop_ci_low", None)),
                             num(getattr(r, "accuracy_drop_ci_high", None)), {"shift": r.shift, "scale": float(r.scale)}))
    fpt = m.failure_point_table
    if iv is not None and not iv.failure_point_table.empty:
        fpt = fpt.merge(iv.failure_point_table, on=["classifier", "shift", "scale"], how="left")
    for r in fpt[fpt["shift"] == ALL_SHIFTS].itertuples(index=False):
        details.append(Value("fp_ratio", num(r.fp_ratio), num(getattr(r, "fp_ratio_ci_low", None)),
                             num(getattr(r, "fp_ratio_ci_high", None)), {"shift": ALL_SHIFTS, "scale": float(r.scale)}))
    details.append(summary_value("fp_avg", "fp_avg", {}))
    details.append(summary_value("margin_fp_avg", "margin_fp_avg", {"margin_max_scale": margin}))
    details += refined_values(t)
    n = int(summ.at[t.model, "n_trajectories"]) if t.model in summ.index else 0
    return Headline(head.metric, head.value, head.ci_low, head.ci_high, higher_is_better("cns", head.metric),
                    f"accuracy(0) - accuracy({top:g}), mean over the {len(m.shifts)} shifts of family {group.kind}",
                    n, details)


def interval_design(t: Tables) -> dict[str, Any]:
    """A card entry's ``ci``: how its intervals were made.  An adaptive CNS build's are the
    stratified normal intervals of its design at ``sampling.level``; others are bootstrap ones."""
    spec = t.spec
    if t.config.sampling is not None:
        from pipeline.aggregate.adaptive import ESTIMATOR

        return {"level": t.config.sampling.level, "resamples": 0, "seed": spec.seed, "method": "stratified",
                "estimator": ESTIMATOR}
    return {"level": spec.level, "resamples": spec.resamples, "seed": spec.seed}


def refined_values(t: Tables) -> list[Value]:
    """The mean refined failure point (``cnsbench refine``, docs/refine.md) with its bootstrap
    interval, when the output's model was refined on the build's trajectories as they are;
    nothing otherwise (never refined, or stale: the build changed since)."""
    from pipeline.aggregate.images import ImageReader
    from pipeline.analyses.refined import mean_refined_interval, read_refined, stale_classifiers

    table = read_refined(t.read_image.store) if isinstance(t.read_image, ImageReader) else None
    if table is None or t.model not in set(table["classifier"]):
        return []
    if t.model in stale_classifiers(table[table["classifier"] == t.model], t.samples, t.predictions, t.config):
        return []
    spec = t.spec
    value, low, high = mean_refined_interval(table, t.model, spec.resamples, spec.level, spec.seed)
    mine = table[table["classifier"] == t.model]
    bisected = mine[mine["status"] == "refined"]
    # How finely the refined points are known: the mean width of their bisection intervals.
    width = float((bisected["interval_high"] - bisected["interval_low"]).mean()) if len(bisected) else None
    return [Value("fp_avg_refined", num(value), num(low), num(high),
                  {"rounds": int(mine["rounds"].max()), "interval_width": num(width)})]


def failure_point_block(details: list[Value]) -> dict[str, Any] | None:
    """A card entry's ``failure_point``: the grid's mean failure point and, where the output's
    model was refined, the refined one beside it, each with its interval, and the refined
    points' mean bisection interval width; None for a family without failure points."""
    found = {d.metric: d for d in details if d.metric in ("fp_avg", "fp_avg_refined")}
    grid, refined = found.get("fp_avg"), found.get("fp_avg_refined")
    if grid is None:
        return None
    out = {"grid": grid.value, "grid_ci_low": grid.ci_low, "grid_ci_high": grid.ci_high,
           "refined": None, "refined_ci_low": None, "refined_ci_high": None, "refined_interval_width": None,
           "rounds": 0}
    if refined is not None:
        out.update(refined=refined.value, refined_ci_low=refined.ci_low, refined_ci_high=refined.ci_high,
                   refined_interval_width=refined.key.get("interval_width"), rounds=int(refined.key.get("rounds", 0)))
    return out


# --------------------------------------------------------------------------- corruptions
def corruption_names(cfg: BuildConfig) -> list[str]:
    """The corruptions of an output, as the ``corruption_error`` analysis finds them."""
    from pipeline.families.corruption.params import ALL

    names = [s for g in cfg.family_groups() if g.kind == "corruption" for s in g.shifts]
    return names or [s for s in cfg.all_shifts() if s in ALL]  # an ImageNet-C evaluate output


def corruptions(t: Tables) -> Headline:
    from pipeline.analyses.corruption import MEAN_ROW, SEVERITIES, alexnet_errors, corruption_table, severity_errors
    from pipeline.families.corruption.params import BENCHMARK

    names = corruption_names(t.config)
    if not names:
        raise CnsbenchError("the output holds no corruption (no family corruption, no ImageNet-C corruption names)")
    base = t.baseline
    who = [t.model] + ([base] if base and base != ALEXNET and base != t.model else [])
    preds = t.predictions[t.predictions["classifier"].isin(who)]
    errors = severity_errors(t.samples, preds, names)
    alex = alexnet_errors() if base == ALEXNET else None
    table = corruption_table(errors, base if base not in (None, ALEXNET) else None, alex)
    col = {ALEXNET: "ce_alexnet", None: "ce_unnormalized"}.get(base, "ce_baseline")
    mine = table[table["classifier"] == t.model].set_index("corruption")
    in_mce = [c for c in mine.index if c != MEAN_ROW and bool(mine.at[c, "in_mce"])]
    averaged = in_mce or [c for c in mine.index if c != MEAN_ROW]
    draws = _corruption_bootstrap(t, names, who, base, alex, SEVERITIES)
    level = t.spec.level

    def val(metric: str, c: str, column: str, key: dict) -> Value:
        value = num(mine.at[c, column]) if c in mine.index else None
        got = draws.get(column, {})
        low, high = interval(got[c], level) if value is not None and c in got else (None, None)
        return Value(metric, value, low, high, key)

    means = {column: _quiet_nanmean(np.stack([draws[column][c] for c in averaged if c in draws[column]]), axis=0)
             for column in draws if any(c in draws[column] for c in averaged)}
    draws = {k: {**v, MEAN_ROW: means[k]} if k in means else v for k, v in draws.items()}
    head = val("mce", MEAN_ROW, col, {"normalised_by": base or "none", "corruptions": len(averaged)})
    details = [val("ce", c, col, {"corruption": c, "normalised_by": base or "none", "in_mce": c in BENCHMARK})
               for c in mine.index if c != MEAN_ROW]
    if col != "ce_unnormalized":
        details.append(val("mce_unnormalized", MEAN_ROW, "ce_unnormalized", {}))
    if base not in (None, ALEXNET):
        details.append(val("relative_mce", MEAN_ROW, "relative_ce_baseline", {"normalised_by": base}))
    details.append(Value("error_clean", num(mine.at[MEAN_ROW, "error_clean"]) if MEAN_ROW in mine.index else None))
    n = int(t.samples.loc[t.samples["shift"].isin(names), "trajectory_id"].nunique())
    what = {ALEXNET: "AlexNet's published errors", None: "nothing (unnormalised)"}.get(base, f"classifier {base}")
    return Headline("mce", head.value, head.ci_low, head.ci_high, higher_is_better("corruptions", "mce"),
                    f"mean corruption error over {len(averaged)} corruptions, normalised by {what}", n, details)


def _corruption_bootstrap(t: Tables, names, who, base, alex, severities) -> dict[str, dict[str, np.ndarray]]:
    """Resampled CE per corruption (columns ``ce_unnormalized`` and the normalised ones):
    trajectories resampled within (corruption, class), the model and baseline paired."""
    s = t.samples[t.samples["shift"].isin(names)]
    s = s[s["kept"].astype("boolean").fillna(False).astype(bool)]
    p = t.predictions[t.predictions["classifier"].isin(who) & t.predictions["correct"].notna()]
    rows = s[["sample_id", "trajectory_id", "shift", "class_id", "scale"]].merge(p[["sample_id", "classifier", "correct"]], on="sample_id")
    rows["sev"] = (rows["scale"].astype(float) * 1000).round().astype("int64")
    sev_milli = [round(x * 1000) for x in (0.0, *severities)]
    rows = rows[rows["sev"].isin(sev_milli)]
    traj = rows[["trajectory_id", "shift", "class_id"]].drop_duplicates("trajectory_id").sort_values(
        ["shift", "class_id", "trajectory_id"], kind="stable").reset_index(drop=True)
    if traj.empty:
        return {"ce_unnormalized": {}}
    ti = pd.Index(traj["trajectory_id"]).get_indexer(rows["trajectory_id"])
    si = pd.Index(sev_milli).get_indexer(rows["sev"])
    n_t, n_s = len(traj), len(sev_milli)
    wrong = {f: np.zeros((n_t, n_s)) for f in who}
    have = {f: np.zeros((n_t, n_s)) for f in who}
    for f in who:
        m = (rows["classifier"] == f).to_numpy()
        np.add.at(wrong[f], (ti[m], si[m]), 1.0 - rows["correct"].to_numpy(dtype=float)[m])
        np.add.at(have[f], (ti[m], si[m]), 1.0)
    strata = pd.factorize(traj["shift"].astype(str) + "\0" + traj["class_id"].astype(str))[0]
    spec = t.spec
    rng = np.random.default_rng(spec.seed)
    chunk = max(1, CHUNK_CELLS // n_t)
    by_shift = {c: np.flatnonzero(traj["shift"].to_numpy() == c) for c in names}
    out: dict[str, dict[str, list]] = {"ce_unnormalized": {}, "ce_baseline": {}, "relative_ce_baseline": {}, "ce_alexnet": {}}
    done = 0
    while done < spec.resamples:
        n = min(chunk, spec.resamples - done)
        w = bootstrap.resample_counts(strata, n, rng)
        for c, idx in by_shift.items():
            if not len(idx):
                continue
            wc = w[:, idx]
            err = {}
            for f in who:
                with np.errstate(invalid="ignore", divide="ignore"):
                    err[f] = (wc @ wrong[f][idx]) / (wc @ have[f][idx])  # [n, severities], NaN where none
            _ce_columns(out, c, err, t.model, base, alex, c in (alex or ({}, 0))[0])
        done += n
    return {k: {c: np.concatenate(v) for c, v in per.items()} for k, per in out.items() if per}


def _ce_columns(out, c, err, model, base, alex, published) -> None:
    e = err[model]
    sev = e[:, 1:]  # severities 1..5
    present = ~np.isnan(sev)
    with np.errstate(invalid="ignore", divide="ignore"):
        total = np.where(present.any(axis=1), np.nansum(sev, axis=1), np.nan)
        n_sev = present.sum(axis=1)
        ce = total / np.where(n_sev > 0, n_sev, np.nan)
        out["ce_unnormalized"].setdefault(c, []).append(ce)
        if base not in (None, ALEXNET):
            b = err[base][:, 1:]
            b_total = np.where((~np.isnan(b)).any(axis=1), np.nansum(b, axis=1), np.nan)
            # As corruption_table: sums over the severities present, NaN without a clean error.
            rel = np.where(present.any(axis=1), np.nansum(sev - e[:, :1], axis=1), np.nan) + 0.0 * e[:, 0]
            b_present = (~np.isnan(b)).any(axis=1)
            b_rel = np.where(b_present, np.nansum(b - err[base][:, :1], axis=1), np.nan) + 0.0 * err[base][:, 0]
            out["ce_baseline"].setdefault(c, []).append(np.where(b_total > 0, total / b_total, np.nan))
            out["relative_ce_baseline"].setdefault(c, []).append(np.where(b_rel != 0, rel / b_rel, np.nan))
        if alex is not None and published:
            ref = alex[0][c]
            full = n_sev == sev.shape[1]
            out["ce_alexnet"].setdefault(c, []).append(np.where(full, ce / ref, np.nan))


def _quiet_nanmean(stack: np.ndarray, axis: int) -> np.ndarray:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=RuntimeWarning)  # all-NaN slices stay NaN
        return np.nanmean(stack, axis=axis)


# --------------------------------------------------------------------------- ImageNet-D
def imagenet_d(t: Tables) -> Headline:
    from pipeline.aggregate.metrics import compute_metrics

    group = t.config.family_groups()[0]
    samples, preds, margin = _group_tables(t, group)
    scales = list(group.scales)
    m = compute_metrics(samples, preds, scales, margin, fp_std_ddof=t.config.aggregate.fp_std_ddof)
    top = max(scales)
    acc = m.accuracy[(m.accuracy["classifier"] == t.model) & (m.accuracy["scale"] == top)].set_index("shift")
    spec = t.spec
    d = bootstrap.design(samples, preds, m)
    details, per_shift = [], []
    if d.trajectories:
        stats = bootstrap.bootstrap_statistics(d, spec.resamples, spec.seed, m.margin_max_scale)
        at_top = stats["accuracy"][:, :, d.classifiers.index(t.model), d.scales.index(top)]  # [b, shifts]
        for h, shift in enumerate(d.shifts):
            if shift in acc.index:
                low, high = interval(at_top[:, h], spec.level)
                details.append(Value("accuracy", num(acc.at[shift, "accuracy"]), low, high, {"nuisance": shift, "scale": top}))
                per_shift.append(h)
    values = [v.value for v in details if v.value is not None]
    value = float(np.mean(values)) if values else None
    low = high = None
    if per_shift:
        low, high = interval(_quiet_nanmean(at_top[:, per_shift], axis=1), spec.level)
    return Headline("accuracy", value, low, high, higher_is_better("imagenet_d", "accuracy"),
                    f"top-1 accuracy at scale {top:g}, mean over the {len(details)} nuisances", len(d.trajectories), details)


# --------------------------------------------------------------------------- XIMAGENET-12
def ximagenet(t: Tables) -> Headline:
    from pipeline.analyses import robustness_score as rs

    opts = rs.RobustnessOptions.model_validate(t.options("robustness_score"))
    ctx = t.context(t.options("robustness_score"))
    result = rs.run(ctx)  # the probes for C'(i) load the model: cards keep their results
    table = result.tables.get("robustness_score")
    if table is None or table.empty or t.model not in set(table["classifier"]):
        return Headline("robustness_score", None, None, None, higher_is_better("ximagenet", "robustness_score"),
                        "no kept images: no robustness score", 0, [])
    row = table.set_index("classifier").loc[t.model]
    acc = result.tables["scenario_accuracy"]
    acc = acc[acc["classifier"] == t.model].set_index("scenario")
    df, scenarios, strengths = rs.scenario_frames(ctx, opts)
    draws, n_units = _score_bootstrap(t, df, scenarios, strengths, acc, opts.variance, row)
    level = t.spec.level
    low, high = interval(draws["score"], level) if draws else (None, None)
    details = [Value("accuracy_original", num(row["mu"]), *(interval(draws["mu"], level) if draws else (None, None)))]
    for i, sc in enumerate(scenarios):
        c_low, c_high = interval(draws["C"][:, i], level) if draws else (None, None)
        details.append(Value("accuracy", num(acc.at[sc, "C"]) if sc in acc.index else None, c_low, c_high,
                             {"scenario": sc, "strength": strengths[sc]}))
    for sc in scenarios:
        if sc in acc.index:
            details.append(Value("accuracy_probe", num(acc.at[sc, "C_prime"]), key={"scenario": sc}))
    return Headline("robustness_score", num(row["score"]), low, high,
                    higher_is_better("ximagenet", "robustness_score"),
                    f"S = 1 - (var_cross + var_inner) over {len(scenarios)} scenarios ({opts.variance} variant)",
                    n_units, details)


def _score_bootstrap(t: Tables, df: pd.DataFrame, scenarios: list[str], strengths: dict, acc: pd.DataFrame,
                     variance: str, row: pd.Series) -> tuple[dict[str, np.ndarray], int]:
    """Resampled mu, C(i) and S: (class, seed) units within class, the inner term fixed."""
    mine = df[df["classifier"] == t.model]
    orig = mine[mine["scale"] == 0].drop_duplicates(["class_id", "seed"])  # as the analysis' originals
    at = pd.concat([mine[(mine["shift"] == sc) & np.isclose(mine["scale"], strengths[sc])] for sc in scenarios])
    units = pd.concat([orig, at])[["class_id", "seed"]].drop_duplicates().sort_values(["class_id", "seed"])
    units = units.reset_index(drop=True)
    if units.empty:
        return {}, 0
    index = pd.MultiIndex.from_frame(units)
    n_u, n_i = len(units), len(scenarios)
    o_ok, o_have = np.zeros(n_u), np.zeros(n_u)
    oi = index.get_indexer(pd.MultiIndex.from_frame(orig[["class_id", "seed"]]))
    o_ok[oi], o_have[oi] = orig["correct"].to_numpy(dtype=float), 1.0
    c_ok, c_have = np.zeros((n_u, n_i)), np.zeros((n_u, n_i))
    for i, sc in enumerate(scenarios):
        part = mine[(mine["shift"] == sc) & np.isclose(mine["scale"], strengths[sc])]
        ui = index.get_indexer(pd.MultiIndex.from_frame(part[["class_id", "seed"]]))
        keep = ui >= 0
        np.add.at(c_ok[:, i], ui[keep], part["correct"].to_numpy(dtype=float)[keep])
        np.add.at(c_have[:, i], ui[keep], 1.0)
    ddof = {"table": 1, "equation": 0}[variance]
    inner = float(row[f"var_inner_{variance}"]) if num(row.get(f"var_inner_{variance}")) is not None else math.nan
    strata = pd.factorize(units["class_id"])[0]
    spec = t.spec
    rng = np.random.default_rng(spec.seed)
    parts: dict[str, list[np.ndarray]] = {"mu": [], "C": [], "score": []}
    done, chunk = 0, max(1, CHUNK_CELLS // n_u)
    while done < spec.resamples:
        n = min(chunk, spec.resamples - done)
        w = bootstrap.resample_counts(strata, n, rng)
        with np.errstate(invalid="ignore", divide="ignore"):
            mu = (w @ o_ok) / (w @ o_have)
            c = (w @ c_ok) / (w @ c_have)
            cross = ((c - mu[:, None]) ** 2).sum(axis=1) / (n_i - ddof) if n_i > ddof else np.full(n, np.nan)
        parts["mu"].append(mu)
        parts["C"].append(c)
        parts["score"].append(1.0 - (cross + inner))
        done += n
    return {k: np.concatenate(v) for k, v in parts.items()}, n_u


# --------------------------------------------------------------------------- ImageNet-E
def imagenet_e(t: Tables) -> Headline:
    from pipeline.analyses.attributes import attribute_tables, split_release_sets, summary

    ctx = t.context()
    table, _ = attribute_tables(ctx)
    if table.empty:
        return Headline("mean_drop", None, None, None, higher_is_better("imagenet_e", "mean_drop"),
                        "no attribute with level 0 and edited levels", 0, [])
    curves, release_sets = split_release_sets(table)
    summ = summary(curves, release_sets).set_index("classifier")
    draws = _attribute_draws(t, ctx)
    level = t.spec.level
    details = []
    for r in table[table["level"] != 0].itertuples(index=False):
        got = draws.get((r.attribute, round(float(r.level), 3)))
        low, high = interval(got, level) if got is not None else (None, None)
        details.append(Value("accuracy_drop", num(r.accuracy_drop), low, high,
                             {"attribute": r.attribute, "level": float(r.level), "published": bool(r.published)}))
    published = [(r.attribute, round(float(r.level), 3)) for r in curves.itertuples(index=False) if r.published]
    edited = [(r.attribute, round(float(r.level), 3)) for r in curves.itertuples(index=False) if r.level != 0]
    use, column, what = (published, "mean_drop_published", "ImageNet-E's published levels") if published else (
        edited, "mean_drop_all_levels", "every edited level (no published level in this output)")
    value = num(summ.at[t.model, column]) if t.model in summ.index else None
    stack = [draws[k] for k in use if k in draws]
    low, high = interval(_quiet_nanmean(np.stack(stack), axis=0), level) if stack and value is not None else (None, None)
    details.insert(0, Value("accuracy_original", num(summ.at[t.model, "accuracy_original"]) if t.model in summ.index else None))
    n = int(t.samples["trajectory_id"].nunique())
    return Headline(column, value, low, high, higher_is_better("imagenet_e", column),
                    f"accuracy(0) - accuracy(level), mean over {len(use)} cells: {what}",
                    n, details)


def _attribute_draws(t: Tables, ctx: AnalysisContext) -> dict[tuple[str, float], np.ndarray]:
    """Resampled accuracy drop per (attribute, level): each attribute on its own levels, as
    :func:`pipeline.analyses.attributes.attribute_tables` measures it, with its own stream."""
    from pipeline.aggregate.metrics import compute_metrics

    spec = t.spec
    out = {}
    for i, shift in enumerate(sorted(str(s) for s in pd.unique(t.samples["shift"]))):
        sub = t.samples[t.samples["shift"] == shift]
        scales = sorted({round(float(s), 3) for s in sub["scale"]})
        if 0.0 not in scales or len(scales) < 2:
            continue
        preds = ctx.predictions[ctx.predictions["sample_id"].isin(sub["sample_id"])]
        margin = max(t.config.aggregate.margin_max_scale, max(scales))
        m = compute_metrics(sub, preds, scales, margin)
        d = bootstrap.design(sub, preds, m)
        if not d.trajectories or t.model not in d.classifiers:
            continue
        stats = bootstrap.bootstrap_statistics(d, spec.resamples, spec.seed + 7919 * (i + 1), m.margin_max_scale)
        drop = stats["accuracy_drop"][:, 0, d.classifiers.index(t.model), :]
        for j, s in enumerate(d.scales):
            out[(shift, round(float(s), 3))] = drop[:, j]
    return out


def headline(family: str, t: Tables) -> Headline:
    """The card entry's numbers of a benchmark of ``family`` (see the module doc): the function
    that the shift family declaring that card benchmark names (``Family.headline``)."""
    return headline_function(family)(t)
