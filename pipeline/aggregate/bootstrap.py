"""Bootstrap confidence intervals of the CNS metrics, and a pairwise comparison of classifiers.

Role: uncertainty for the tables of :mod:`pipeline.aggregate.metrics`.  A benchmark has
few seeds per class (50 in CNS-Bench, 4 in the demo), so differences between classifiers
are often within noise; these intervals say how much.

Resampling unit and strata: a *trajectory* (shift, class, seed).  Each resample draws, in
every (shift, class) stratum, as many trajectories as the stratum has, uniformly with
replacement; the same draw serves every classifier, so comparisons are paired.  Every
statistic is recomputed on the resample exactly as :mod:`pipeline.aggregate.metrics`
defines it (per-shift accuracy and its drop from scale 0, the shift mean of the drops,
failure-point ratios per scale and cumulative, the mean failure point over failed
trajectories, the margin), and the interval is the percentile interval
``[q((1 - level) / 2), q((1 + level) / 2)]`` of the resampled values (NaN resamples, e.g.
no failed trajectory drawn, left out).  The point estimates stay those of the metrics.

Vectorised: a resample is a row of trajectory counts ``W`` (resamples x trajectories);
every statistic is a weighted sum, i.e. one matrix product per shift.  Resamples are
processed in chunks, so memory stays bounded at full benchmark size.  Deterministic for a
seed (:class:`pipeline.config.BootstrapSpec`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from pipeline.aggregate.metrics import ALL_SHIFTS, Metrics, evaluated_rows
from pipeline.errors import CnsbenchError
from pipeline.plan import scale_tag

CI_LOW, CI_HIGH = "_ci_low", "_ci_high"
PAIRWISE_COLUMNS = ["metric", "classifier_a", "classifier_b", "difference", "ci_low", "ci_high", "excludes_zero", "n_common"]
PAIRWISE_METRICS = ("fp_avg", "margin_fp_avg")
_CHUNK_CELLS = 4_000_000  # resamples x trajectories per chunk (32 MB of float64 weights)


@dataclass
class Design:
    """The evaluated trajectories as arrays (trajectories sorted by stratum).

    ``correct[t, c, s]``: classifier ``c`` right on trajectory ``t`` at scale ``s`` (0
    where not evaluated); ``evaluated[t, c]``; ``fp_index[t, c]``: index of the failure
    scale, -1 never failed or not evaluated; ``shift_of[t]`` indexes ``shifts``;
    ``stratum_of[t]`` the (shift, class) stratum.
    """

    trajectories: list[str]
    shifts: list[str]
    classifiers: list[str]
    scales: list[float]
    shift_of: np.ndarray
    stratum_of: np.ndarray
    correct: np.ndarray
    evaluated: np.ndarray
    fp_index: np.ndarray


def design(samples: pd.DataFrame, predictions: pd.DataFrame, metrics: Metrics) -> Design:
    """Arrays of the trajectories :func:`pipeline.aggregate.metrics.compute_metrics` evaluated."""
    rows = evaluated_rows(samples, predictions, metrics.scales)
    classes = samples.drop_duplicates("trajectory_id").set_index("trajectory_id")["class_id"]
    traj = rows[["trajectory_id", "shift"]].drop_duplicates("trajectory_id").copy()
    traj["class_id"] = traj["trajectory_id"].map(classes)
    traj = traj.sort_values(["shift", "class_id", "trajectory_id"], kind="stable").reset_index(drop=True)
    shifts, classifiers, scales = list(metrics.shifts), list(metrics.classifiers), list(metrics.scales)
    t_index = pd.Index(traj["trajectory_id"])
    n_t, n_c, n_s = len(traj), len(classifiers), len(scales)
    correct = np.zeros((n_t, n_c, n_s))
    evaluated = np.zeros((n_t, n_c), dtype=bool)
    if n_t:
        ti = t_index.get_indexer(rows["trajectory_id"])
        ci = pd.Index(classifiers).get_indexer(rows["classifier"])
        si = pd.Index([round(s * 1000) for s in scales]).get_indexer((rows["scale"] * 1000).round().astype("int64"))
        keep = ci >= 0
        correct[ti[keep], ci[keep], si[keep]] = rows["correct"].to_numpy(dtype=float)[keep]
        evaluated[ti[keep], ci[keep]] = True
    wrong = (correct == 0) & evaluated[:, :, None]
    fp_index = np.where(wrong.any(axis=2), wrong.argmax(axis=2), -1)
    strata = traj["shift"].astype(str) + "\0" + traj["class_id"].astype(str)
    return Design(
        trajectories=traj["trajectory_id"].tolist(),
        shifts=shifts,
        classifiers=classifiers,
        scales=scales,
        shift_of=pd.Index(shifts).get_indexer(traj["shift"]) if n_t else np.zeros(0, dtype=int),
        stratum_of=pd.factorize(strata)[0] if n_t else np.zeros(0, dtype=int),
        correct=correct,
        evaluated=evaluated,
        fp_index=fp_index,
    )


def resample_counts(stratum_of: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` stratified resamples as counts (n x trajectories): each stratum redrawn to its size.

    ``stratum_of`` must be grouped (equal values adjacent), as :func:`design` sorts it.
    """
    n_t = len(stratum_of)
    if n_t == 0:
        return np.zeros((n, 0))
    starts = np.flatnonzero(np.r_[True, stratum_of[1:] != stratum_of[:-1]])
    sizes = np.diff(np.r_[starts, n_t])
    group = np.repeat(np.arange(len(starts)), sizes)
    draw = starts[group] + np.floor(rng.random((n, n_t)) * sizes[group]).astype(np.int64)
    flat = draw + (np.arange(n) * n_t)[:, None]
    return np.bincount(flat.ravel(), minlength=n * n_t).reshape(n, n_t).astype(float)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def _statistics(d: Design, w: np.ndarray, margin_max_scale: float) -> dict[str, np.ndarray]:
    """Every statistic for resample weights ``w`` (resamples x trajectories)."""
    b, (n_t, n_c, n_s) = w.shape[0], d.correct.shape
    n_h = len(d.shifts)
    ev = d.evaluated.astype(float)
    onehot = (d.fp_index[:, :, None] == np.arange(n_s)).astype(float)  # [t, c, s] failed exactly at s
    acc = np.full((b, n_h, n_c, n_s), np.nan)
    fp_ratio = np.full((b, n_h + 1, n_c, n_s), np.nan)
    for h in range(n_h):
        idx = np.flatnonzero(d.shift_of == h)
        wh = w[:, idx]
        den = wh @ ev[idx]  # [b, c]
        acc[:, h] = _ratio((wh @ d.correct[idx].reshape(len(idx), -1)).reshape(b, n_c, n_s), den[:, :, None])
        fp_ratio[:, h] = _ratio((wh @ onehot[idx].reshape(len(idx), -1)).reshape(b, n_c, n_s), den[:, :, None])
    den_all = w @ ev
    fp_ratio[:, n_h] = _ratio((w @ onehot.reshape(n_t, -1)).reshape(b, n_c, n_s), den_all[:, :, None])
    failed = (d.fp_index >= 0).astype(float)
    fp_value = np.where(d.fp_index >= 0, np.asarray(d.scales)[np.maximum(d.fp_index, 0)], 0.0)
    fp_avg = _ratio(w @ (fp_value * failed), w @ failed)
    censored = np.where(d.fp_index >= 0, fp_value, margin_max_scale)
    margin = _ratio(w @ ((margin_max_scale - censored) * ev), den_all)
    drop = acc[..., :1] - acc  # the papers' sign: positive when accuracy falls (metrics.accuracy_table)
    with np.errstate(invalid="ignore"), _quiet():
        summary_drop = np.nanmean(drop, axis=1)  # unweighted mean over shifts, as the summary
    return {
        "accuracy": acc,
        "accuracy_drop": drop,
        "fp_ratio": fp_ratio,
        "fp_ratio_cumulative": np.cumsum(fp_ratio, axis=-1),
        "summary_drop": summary_drop,
        "fp_avg": fp_avg,
        "margin_fp_avg": margin,
    }


class _quiet:
    """Silence numpy's 'mean of empty slice' for all-NaN slices (they stay NaN)."""

    def __enter__(self) -> None:
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", category=RuntimeWarning)

    def __exit__(self, *exc: object) -> None:
        self._w.__exit__(*exc)


def bootstrap_statistics(d: Design, resamples: int, seed: int, margin_max_scale: float) -> dict[str, np.ndarray]:
    """Each statistic of :func:`_statistics` for ``resamples`` resamples (first axis)."""
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_CELLS // max(1, len(d.trajectories)))
    parts: list[dict[str, np.ndarray]] = []
    done = 0
    while done < resamples:
        n = min(chunk, resamples - done)
        parts.append(_statistics(d, resample_counts(d.stratum_of, n, rng), margin_max_scale))
        done += n
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def percentile_interval(values: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval over axis 0, NaN resamples left out (all NaN -> NaN)."""
    alpha = (1.0 - level) / 2.0
    with _quiet():
        low, high = np.nanquantile(values, [alpha, 1.0 - alpha], axis=0)
    return low, high


@dataclass
class Intervals:
    """CI columns to join onto the metric tables, and the pairwise comparison."""

    level: float
    resamples: int
    accuracy: pd.DataFrame  # classifier, shift, scale, accuracy_ci_*, accuracy_drop_ci_*
    failure_point_table: pd.DataFrame  # classifier, shift, scale, fp_ratio_ci_*, fp_ratio_cumulative_ci_*
    summary: pd.DataFrame  # classifier, acc_drop_<tag>_ci_*, fp_avg_ci_*, margin_fp_avg_ci_*
    pairwise: pd.DataFrame  # PAIRWISE_COLUMNS


def intervals(
    samples: pd.DataFrame, predictions: pd.DataFrame, metrics: Metrics, *, resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> Intervals:
    """Bootstrap intervals of ``metrics`` (computed by ``compute_metrics`` from the same tables)."""
    if not 0.0 < level < 1.0:
        raise CnsbenchError(f"bootstrap level must lie in (0, 1), got {level}")
    if resamples < 1:
        raise CnsbenchError(f"bootstrap resamples must be >= 1, got {resamples}")
    d = design(samples, predictions, metrics)
    if not d.trajectories or not d.classifiers:
        empty = pd.DataFrame()
        return Intervals(level, resamples, empty, empty, empty, pd.DataFrame(columns=PAIRWISE_COLUMNS))
    stats = bootstrap_statistics(d, resamples, seed, metrics.margin_max_scale)
    cs, ss = d.classifiers, d.scales

    def per_shift(names: Sequence[str], shifts: Sequence[str]) -> pd.DataFrame:
        idx = pd.MultiIndex.from_product([range(len(shifts)), range(len(cs)), range(len(ss))], names=["h", "c", "s"])
        out = pd.DataFrame(
            {
                "classifier": [cs[c] for c in idx.get_level_values("c")],
                "shift": [shifts[h] for h in idx.get_level_values("h")],
                "scale": [ss[s] for s in idx.get_level_values("s")],
            }
        )
        for name in names:
            low, high = percentile_interval(stats[name], level)
            out[name + CI_LOW], out[name + CI_HIGH] = low.ravel(), high.ravel()
        return out

    acc = per_shift(["accuracy", "accuracy_drop"], d.shifts)
    fpt = per_shift(["fp_ratio", "fp_ratio_cumulative"], d.shifts + [ALL_SHIFTS])
    summ = pd.DataFrame({"classifier": cs})
    low, high = percentile_interval(stats["summary_drop"], level)
    for j, s in enumerate(ss):
        summ[f"acc_drop_{scale_tag(s)}{CI_LOW}"], summ[f"acc_drop_{scale_tag(s)}{CI_HIGH}"] = low[:, j], high[:, j]
    for name in PAIRWISE_METRICS:
        low, high = percentile_interval(stats[name], level)
        summ[name + CI_LOW], summ[name + CI_HIGH] = low, high
    return Intervals(level, resamples, acc, fpt, summ, _pairwise(d, stats, metrics, level))


def _pairwise(d: Design, stats: dict[str, np.ndarray], metrics: Metrics, level: float) -> pd.DataFrame:
    """Difference a - b of each summary metric for every pair of classifiers, with its interval."""
    point = metrics.summary.set_index("classifier")
    both = d.evaluated.T.astype(int) @ d.evaluated.astype(int)  # trajectories evaluated for both
    rows = []
    for metric in PAIRWISE_METRICS:
        for i, a in enumerate(d.classifiers):
            for j in range(i + 1, len(d.classifiers)):
                b = d.classifiers[j]
                low, high = percentile_interval(stats[metric][:, i] - stats[metric][:, j], level)
                diff = float(point.at[a, metric] - point.at[b, metric])
                excludes = bool(np.isfinite(low) and np.isfinite(high) and (low > 0 or high < 0))
                rows.append([metric, a, b, diff, float(low), float(high), excludes, int(both[i, j])])
    return pd.DataFrame(rows, columns=PAIRWISE_COLUMNS)


def _join(table: pd.DataFrame, ci: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``table`` with the CI columns of ``ci``, each pair placed right after its metric column."""
    if ci.empty or table.empty:
        return table
    merged = table.merge(ci, on=keys, how="left")
    order: list[str] = []
    for col in table.columns:
        order.append(col)
        for suffix in (CI_LOW, CI_HIGH):
            if col + suffix in ci.columns:
                order.append(col + suffix)
    return merged[order + [c for c in merged.columns if c not in order]]


def with_intervals(metrics: Metrics, iv: Intervals) -> Metrics:
    """A copy of ``metrics`` whose accuracy, failure-point and summary tables carry the CI columns."""
    return dataclasses.replace(
        metrics,
        accuracy=_join(metrics.accuracy, iv.accuracy, ["classifier", "shift", "scale"]),
        failure_point_table=_join(metrics.failure_point_table, iv.failure_point_table, ["classifier", "shift", "scale"]),
        summary=_join(metrics.summary, iv.summary, ["classifier"]),
    )
