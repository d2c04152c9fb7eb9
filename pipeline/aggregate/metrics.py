"""CNS-Bench metrics from the ``samples`` and ``predictions`` output tables (pandas only).

Role: the last, pure step of a build.  Given the per-image ``samples`` table
(:data:`pipeline.plan.schema.SAMPLES`), the per-(image, classifier) ``predictions`` table
(:data:`pipeline.plan.schema.PREDICTIONS`) and the benchmark's scales, compute

* which trajectories are evaluated (:func:`complete_trajectories`),
* accuracy and accuracy drop per (classifier, shift, scale) (:func:`accuracy_table`),
* the failure point of every (trajectory, classifier) (:func:`failure_points`, defined
  by :func:`first_failure`),
* the failure-point distribution per scale (:func:`failure_point_table`),
* one summary row per classifier (:func:`summary_table`),
* how strongly each shift is realised per scale (:func:`shift_realisation`, Fig. 3 of
  the paper; :mod:`pipeline.aggregate.realisation`),

and bundle them with dataset counts in :class:`Metrics` (:func:`compute_metrics`).
Definitions follow CNS-Bench (REFERENCE.md section 1 "Metrics"); each function's
docstring states its definition exactly.

Conventions shared by every function:

* A *trajectory* is one (shift, class, seed), identified by ``trajectory_id``; its
  shift is the ``shift`` column of its samples.
* Only *complete* trajectories are evaluated: a sample at every benchmark scale and
  every one of them kept by the OOC filter.  Samples at scales outside ``scales`` are
  ignored.  Scales are matched at 1/1000 resolution (the resolution of
  :func:`pipeline.plan.scale_tag`), so float noise in stored scales cannot drop a
  trajectory; reported scales are always the canonical values of ``scales``.
* A complete trajectory is evaluated for a classifier only when that classifier has a
  non-null prediction for every one of its images.  In a healthy build that is every
  complete trajectory; a trajectory whose classification failed is thereby left out for
  that classifier rather than biasing its accuracy at some scales only.
* Accuracies and ratios are fractions in [0, 1]; failure points are scale values.
* Classifiers are ordered by first appearance in ``predictions`` (the config's order in
  the pipeline's output); shifts are sorted by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from pipeline.aggregate.frames import (
    check_scales,
    empty_frame,
    jsonable,
    kept_flags,
    milli_keys,
    records,
    require_columns,
)
from pipeline.aggregate.realisation import empty_realisation, shift_realisation
from pipeline.errors import CnsbenchError
from pipeline.plan import scale_tag

ALL_SHIFTS = "all"
"""Value of the ``shift`` column for rows aggregated over every shift."""

DEFAULT_MARGIN_MAX_SCALE = 3.0

ACCURACY_COLUMNS = ["classifier", "shift", "scale", "n", "accuracy", "accuracy_change", "accuracy_drop"]
FAILURE_POINT_COLUMNS = ["trajectory_id", "shift", "classifier", "failure_point"]
FP_TABLE_COLUMNS = ["classifier", "shift", "scale", "fp_count", "fp_ratio", "fp_ratio_cumulative"]
KEPT_COLUMNS = ["scale", "n_samples", "n_kept", "kept_share"]
SUMMARY_TAIL_COLUMNS = ["accuracy_scale0", "fp_avg", "fp_std", "margin_fp_avg", "n_failed", "n_trajectories"]

_SAMPLE_COLUMNS = ["sample_id", "trajectory_id", "shift", "scale", "kept"]
_PREDICTION_COLUMNS = ["sample_id", "classifier", "correct"]


def summary_columns(scales: Sequence[float]) -> list[str]:
    """Column names of :func:`summary_table` for these scales, in order."""
    tags = [scale_tag(s) for s in check_scales(scales)]
    return (
        ["classifier"]
        + [f"acc_drop_{t}" for t in tags]
        + [f"acc_drop_pooled_{t}" for t in tags]
        + SUMMARY_TAIL_COLUMNS
    )


# --------------------------------------------------------------------------- evaluated rows
@dataclass
class _Evaluated:
    """Rows (trajectory_id, shift, classifier, scale, correct) of evaluated trajectories."""

    rows: pd.DataFrame
    scales: list[float]
    classifiers: list[str]
    shifts: list[str]


def _evaluate(samples: pd.DataFrame, predictions: pd.DataFrame, scales: Sequence[float]) -> _Evaluated:
    scale_list = check_scales(scales)
    samples = require_columns(samples, _SAMPLE_COLUMNS, "samples")
    predictions = require_columns(predictions, _PREDICTION_COLUMNS, "predictions")
    complete = complete_trajectories(samples, scale_list)

    canonical = {round(s * 1000): s for s in scale_list}
    s = samples.loc[samples["trajectory_id"].isin(complete), ["sample_id", "trajectory_id", "shift", "scale"]].copy()
    s["milli"] = milli_keys(s["scale"]) if len(s) else pd.Series(dtype="int64")
    s = s[s["milli"].isin(list(canonical))]
    if s["sample_id"].duplicated().any():
        dup = s.loc[s["sample_id"].duplicated(), "sample_id"].iloc[0]
        raise CnsbenchError(f"samples table has duplicated sample_id values, e.g. {dup!r}")
    if s.duplicated(["trajectory_id", "milli"]).any():
        row = s.loc[s.duplicated(["trajectory_id", "milli"])].iloc[0]
        raise CnsbenchError(f"trajectory {row['trajectory_id']!r} has several samples at scale {row['scale']}")
    s["scale"] = s["milli"].map(canonical).astype(float)
    shifts = sorted(str(x) for x in pd.unique(s["shift"]))
    if ALL_SHIFTS in shifts:
        raise CnsbenchError(f"a shift may not be named {ALL_SHIFTS!r}: that name is reserved for the all-shift rows")

    p = predictions.loc[predictions["correct"].notna(), _PREDICTION_COLUMNS]
    rows = s.drop(columns="milli").merge(p, on="sample_id", how="inner")
    if rows.duplicated(["sample_id", "classifier"]).any():
        row = rows.loc[rows.duplicated(["sample_id", "classifier"])].iloc[0]
        raise CnsbenchError(f"predictions table has several rows for ({row['sample_id']!r}, {row['classifier']!r})")
    # Keep a (trajectory, classifier) only when every scale has a prediction, so every
    # scale of a (classifier, shift) is measured on the same trajectories.
    n_pred = rows.groupby(["trajectory_id", "classifier"])["sample_id"].transform("size")
    rows = rows.loc[n_pred == len(scale_list), ["trajectory_id", "shift", "classifier", "scale", "correct"]].copy()
    rows["correct"] = rows["correct"].astype(bool)
    rows["shift"] = rows["shift"].astype(str)
    rows["classifier"] = rows["classifier"].astype(str)

    present = set(rows["classifier"])
    classifiers = [str(c) for c in pd.unique(predictions["classifier"]) if str(c) in present]
    return _Evaluated(rows=rows, scales=scale_list, classifiers=classifiers, shifts=shifts)


def _sort(df: pd.DataFrame, classifiers: list[str], by: list[str]) -> pd.DataFrame:
    """Sort by classifier in the given order, then by ``by`` (shift 'all' last)."""
    if df.empty:
        return df.reset_index(drop=True)
    key = df.assign(
        _c=df["classifier"].map({c: i for i, c in enumerate(classifiers)}),
        _all=(df["shift"] == ALL_SHIFTS) if "shift" in df.columns else False,
    )
    order = ["_c"] + (["_all"] if "shift" in df.columns else []) + by
    return key.sort_values(order, kind="stable").drop(columns=["_c", "_all"]).reset_index(drop=True)


# --------------------------------------------------------------------------- public API
def complete_trajectories(samples: pd.DataFrame, scales: Sequence[float]) -> set[str]:
    """Ids of the trajectories that are evaluated.

    A trajectory is complete when it has a sample at every scale of ``scales`` and every
    one of those samples has ``kept`` true (null ``kept`` counts as not kept).  This is
    the reference's rule "only complete trajectories (all scales kept) are evaluated".
    Samples at scales outside ``scales`` are ignored.
    """
    scale_list = check_scales(scales)
    samples = require_columns(samples, ["trajectory_id", "scale", "kept"], "samples")
    if samples.empty:
        return set()
    df = pd.DataFrame(
        {"trajectory_id": samples["trajectory_id"], "milli": milli_keys(samples["scale"]), "kept": kept_flags(samples["kept"])}
    )
    df = df[df["milli"].isin([round(s * 1000) for s in scale_list])]
    g = df.groupby("trajectory_id").agg(n_scales=("milli", "nunique"), all_kept=("kept", "all"))
    return {str(t) for t in g.index[(g["n_scales"] == len(scale_list)) & g["all_kept"]]}


def _accuracy(ev: _Evaluated) -> pd.DataFrame:
    if ev.rows.empty:
        return empty_frame(
            ACCURACY_COLUMNS,
            {"scale": float, "n": "int64", "accuracy": float, "accuracy_change": float, "accuracy_drop": float},
        )
    g = ev.rows.groupby(["classifier", "shift", "scale"], sort=False)["correct"].agg(n="size", n_correct="sum")
    g = g.reset_index()
    g["n"] = g["n"].astype("int64")
    g["accuracy"] = g["n_correct"].astype(float) / g["n"].astype(float)
    acc0 = g.loc[g["scale"] == 0.0, ["classifier", "shift", "accuracy"]].rename(columns={"accuracy": "_acc0"})
    g = g.merge(acc0, on=["classifier", "shift"], how="left")
    g["accuracy_change"] = g["accuracy"] - g["_acc0"]
    # The paper's sign: a positive number is a drop (the original notebook plots -(acc(s) - acc(0))).
    g["accuracy_drop"] = g["_acc0"] - g["accuracy"]
    return _sort(g[ACCURACY_COLUMNS], ev.classifiers, ["shift", "scale"])


def accuracy_table(samples: pd.DataFrame, predictions: pd.DataFrame, scales: Sequence[float]) -> pd.DataFrame:
    """Accuracy per (classifier, shift, scale) over the evaluated trajectories.

    Columns ``classifier, shift, scale, n, accuracy, accuracy_change, accuracy_drop``:

    * ``n``: number of evaluated trajectories of that (classifier, shift); the same at
      every scale, since a trajectory is evaluated at all scales or not at all.
    * ``accuracy``: fraction of those images (one per trajectory at this scale) whose
      prediction is correct, in [0, 1].
    * ``accuracy_change``: ``accuracy(scale) - accuracy(0)`` for the same classifier and
      shift: 0 at scale 0 and negative when accuracy falls with the shift.
    * ``accuracy_drop``: ``accuracy(0) - accuracy(scale)``, the paper's sign: positive
      when accuracy falls with the shift (``-accuracy_change``).

    Rows are ordered by classifier (first appearance), shift (name), scale (ascending).
    """
    return _accuracy(_evaluate(samples, predictions, scales))


def first_failure(scales: Sequence[float], correct: Any) -> np.ndarray:
    """The failure point: the smallest scale at which the prediction is wrong.

    ``correct[..., i]`` says whether the prediction at ``scales[i]`` is right (scales in
    any order); leading axes are independent (trajectory, classifier) pairs.  Returns
    floats of shape ``correct.shape[:-1]`` (a 0-d array for one trajectory), NaN where
    every prediction is right ("never failed").  A wrong prediction at scale 0 counts
    (failure point 0.0).  The one definition used by the metrics and the Serve preview.
    """
    scale_arr = np.asarray(scales, dtype=float)
    ok = np.asarray(correct, dtype=bool)
    if scale_arr.ndim != 1 or ok.shape[-1:] != scale_arr.shape:
        raise ValueError(f"first_failure: correct has shape {ok.shape}, expected (..., {len(scale_arr)}) for the scales")
    wrong_at = np.where(ok, np.inf, scale_arr).min(axis=-1, initial=np.inf)
    return np.where(np.isinf(wrong_at), np.nan, wrong_at)


def _failure_points(ev: _Evaluated) -> pd.DataFrame:
    if ev.rows.empty:
        return empty_frame(FAILURE_POINT_COLUMNS, {"failure_point": float})
    traj = ev.rows[["trajectory_id", "shift", "classifier"]].drop_duplicates()
    # Every evaluated (trajectory, classifier) has exactly one row per scale (_evaluate),
    # so the rows form a (pair x scale) matrix of correctness.
    wide = ev.rows.pivot(index=["trajectory_id", "classifier"], columns="scale", values="correct")
    fp = pd.Series(
        first_failure(wide.columns.to_numpy(dtype=float), wide.to_numpy(dtype=bool)), index=wide.index, name="failure_point"
    )
    out = traj.merge(fp.reset_index(), on=["trajectory_id", "classifier"], how="left")
    out["failure_point"] = out["failure_point"].astype(float)
    return _sort(out[FAILURE_POINT_COLUMNS], ev.classifiers, ["shift", "trajectory_id"])


def evaluated_rows(samples: pd.DataFrame, predictions: pd.DataFrame, scales: Sequence[float]) -> pd.DataFrame:
    """The rows every metric is computed from: ``trajectory_id, shift, classifier, scale, correct``.

    One row per evaluated (trajectory, classifier) and benchmark scale (canonical scale
    values), under the conventions of this module (complete trajectories, every scale
    predicted).  Used by resampling code (:mod:`pipeline.aggregate.bootstrap`).
    """
    return _evaluate(samples, predictions, scales).rows.reset_index(drop=True)


def failure_points(samples: pd.DataFrame, predictions: pd.DataFrame, scales: Sequence[float]) -> pd.DataFrame:
    """Failure point of every evaluated (trajectory, classifier).

    Columns ``trajectory_id, shift, classifier, failure_point``.  The failure point is
    the smallest scale at which the classifier's prediction is wrong; a wrong
    prediction at scale 0 counts (failure point 0.0).  NaN when the classifier is
    correct at every scale of the trajectory ("never failed").
    """
    return _failure_points(_evaluate(samples, predictions, scales))


def _fp_table(ev: _Evaluated, fps: pd.DataFrame) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    milli_scales = [round(s * 1000) for s in ev.scales]
    for clf in ev.classifiers:
        of_clf = fps[fps["classifier"] == clf]
        for shift in ev.shifts + [ALL_SHIFTS]:
            sub = of_clf if shift == ALL_SHIFTS else of_clf[of_clf["shift"] == shift]
            n = len(sub)
            if n == 0:
                continue  # no evaluated trajectory: a ratio would be 0/0
            failed = sub["failure_point"].dropna()
            counts = (failed * 1000).round().astype("int64").value_counts()
            running = 0
            for scale, m in zip(ev.scales, milli_scales):
                count = int(counts.get(m, 0))
                running += count
                # Cumulative ratio from the running count, not by adding rounded ratios,
                # so it is exact and reaches exactly n_failed / n at the last scale.
                rows.append(
                    {
                        "classifier": clf,
                        "shift": shift,
                        "scale": scale,
                        "fp_count": count,
                        "fp_ratio": count / n,
                        "fp_ratio_cumulative": running / n,
                    }
                )
    if not rows:
        return empty_frame(FP_TABLE_COLUMNS, {"scale": float, "fp_count": "int64", "fp_ratio": float, "fp_ratio_cumulative": float})
    out = pd.DataFrame(rows, columns=FP_TABLE_COLUMNS)
    out["fp_count"] = out["fp_count"].astype("int64")
    return out


def failure_point_table(samples: pd.DataFrame, predictions: pd.DataFrame, scales: Sequence[float]) -> pd.DataFrame:
    """Distribution of failure points per (classifier, shift) over the scales.

    Columns ``classifier, shift, scale, fp_count, fp_ratio, fp_ratio_cumulative``, one
    row per benchmark scale:

    * ``fp_count``: number of evaluated trajectories whose failure point equals ``scale``.
    * ``fp_ratio``: ``fp_count / n`` with ``n`` the number of evaluated trajectories of
      that (classifier, shift), never-failed ones included.
    * ``fp_ratio_cumulative``: running sum of ``fp_ratio`` over ascending scales
      (computed as running count / n), i.e. the fraction of trajectories that have failed
      at or before ``scale``.

    Besides one block per real shift there is a block with ``shift == "all"`` pooling
    every evaluated trajectory of the classifier (``n`` = all of them).  A (classifier,
    shift) without evaluated trajectories has no rows.  A real shift may therefore not be
    named ``"all"`` (ValueError).
    """
    ev = _evaluate(samples, predictions, scales)
    return _fp_table(ev, _failure_points(ev))


def _summary(ev: _Evaluated, acc: pd.DataFrame, fps: pd.DataFrame, margin_max_scale: float, ddof: int) -> pd.DataFrame:
    columns = summary_columns(ev.scales)
    rows: list[dict[str, Any]] = []
    for clf in ev.classifiers:
        a = acc[acc["classifier"] == clf]
        row: dict[str, Any] = {"classifier": clf}
        # Per shift first, then the unweighted mean over shifts (the reference's
        # "per classifier, per shift, then averaged"): every shift weighs the same
        # whatever number of its trajectories survived the filter.
        for scale in ev.scales:
            row[f"acc_drop_{scale_tag(scale)}"] = float(a.loc[a["scale"] == scale, "accuracy_drop"].mean())
        # Pooled: every evaluated image of every shift counts once (the original results
        # notebook's "all shifts" view); shifts with more surviving trajectories weigh more.
        pooled = a.assign(n_correct=a["accuracy"] * a["n"]).groupby("scale")[["n_correct", "n"]].sum()
        pooled_acc = pooled["n_correct"] / pooled["n"]
        for scale in ev.scales:
            value = math.nan
            if scale in pooled_acc.index and 0.0 in pooled_acc.index:
                value = float(pooled_acc.loc[0.0] - pooled_acc.loc[scale])
            row[f"acc_drop_pooled_{scale_tag(scale)}"] = value
        row["accuracy_scale0"] = float(a.loc[a["scale"] == 0.0, "accuracy"].mean())
        fp = fps.loc[fps["classifier"] == clf, "failure_point"].to_numpy(dtype=float)
        failed = fp[~np.isnan(fp)]
        row["fp_avg"] = float(failed.mean()) if failed.size else math.nan
        row["fp_std"] = float(failed.std(ddof=ddof)) if failed.size > ddof else math.nan
        row["margin_fp_avg"] = float(np.mean(margin_max_scale - np.where(np.isnan(fp), margin_max_scale, fp)))
        row["n_failed"] = int(failed.size)
        row["n_trajectories"] = int(fp.size)
        rows.append(row)
    if not rows:
        dtypes = {c: float for c in columns if c != "classifier"}
        dtypes.update(n_failed="int64", n_trajectories="int64")
        return empty_frame(columns, dtypes)
    out = pd.DataFrame(rows, columns=columns)
    out[["n_failed", "n_trajectories"]] = out[["n_failed", "n_trajectories"]].astype("int64")
    return out


def summary_table(
    samples: pd.DataFrame,
    predictions: pd.DataFrame,
    scales: Sequence[float],
    margin_max_scale: float = DEFAULT_MARGIN_MAX_SCALE,
    fp_std_ddof: int = 1,
) -> pd.DataFrame:
    """One row per classifier (columns :func:`summary_columns`).

    * ``acc_drop_{tag}`` for every scale (``tag`` = :func:`pipeline.plan.scale_tag`,
      e.g. ``acc_drop_2500`` for 2.5): the unweighted mean over shifts of
      ``accuracy_drop`` (positive = drop) at that scale from :func:`accuracy_table`
      (``acc_drop_0000`` is 0 by construction).
    * ``acc_drop_pooled_{tag}``: ``accuracy(0) - accuracy(scale)`` with both accuracies
      pooled over the evaluated images of all shifts (the original notebook's
      all-shift view): the mean of the per-shift drops weighted by each shift's
      number of evaluated trajectories.
    * ``accuracy_scale0``: the unweighted mean over shifts of the accuracy at scale 0
      (the same averaging as the drops, so ``accuracy_scale0 - acc_drop_{tag}`` is the
      shift-averaged accuracy at that scale).
    * ``fp_avg``: mean failure point over the classifier's *failed* evaluated
      trajectories, pooled over all shifts; NaN when none failed.
    * ``fp_std``: standard deviation of the same values with ``ddof = fp_std_ddof``;
      the default 1 (sample std) is what the original CNS-Bench code computed with
      pandas' ``Series.std()``; ``fp_std_ddof=0`` gives the population std.  NaN when no trajectory failed (or, with
      ddof=1, only one did).
    * ``margin_fp_avg``: mean over *all* evaluated trajectories of
      ``margin_max_scale - FP`` where never-failed trajectories get
      ``FP = margin_max_scale`` (so contribute 0); the reference uses 3.0.
    * ``n_failed``: evaluated trajectories with a failure point; ``n_trajectories``:
      all evaluated trajectories of the classifier (over all shifts).
    """
    if margin_max_scale < max(check_scales(scales)):
        raise CnsbenchError(f"margin_max_scale ({margin_max_scale}) must be >= the largest scale")
    ev = _evaluate(samples, predictions, scales)
    return _summary(ev, _accuracy(ev), _failure_points(ev), float(margin_max_scale), fp_std_ddof)


def _kept_by_scale(samples: pd.DataFrame, scales: list[float]) -> pd.DataFrame:
    samples = require_columns(samples, ["scale", "kept"], "samples")
    milli = milli_keys(samples["scale"]) if len(samples) else pd.Series(dtype="int64")
    kept = kept_flags(samples["kept"]) if len(samples) else pd.Series(dtype=bool)
    rows = []
    for scale in scales:
        at = (milli == round(scale * 1000)).to_numpy()
        n, k = int(at.sum()), int(kept.to_numpy()[at].sum())
        rows.append({"scale": scale, "n_samples": n, "n_kept": k, "kept_share": k / n if n else math.nan})
    return pd.DataFrame(rows, columns=KEPT_COLUMNS).astype({"n_samples": "int64", "n_kept": "int64"})


# --------------------------------------------------------------------------- bundle
@dataclass
class Metrics:
    """Every metric of a build plus the dataset counts behind them.

    Tables: ``accuracy`` (:func:`accuracy_table`), ``failure_points``
    (:func:`failure_points`, one row per evaluated trajectory and classifier),
    ``failure_point_table`` (:func:`failure_point_table`), ``summary``
    (:func:`summary_table`), ``kept_by_scale`` (columns ``scale, n_samples, n_kept,
    kept_share``: share of the samples at each benchmark scale kept by the filter, NaN
    where there are none).  Counts: ``n_samples`` / ``n_kept`` (rows of ``samples`` and
    those kept), ``n_trajectories_total`` (distinct trajectory ids in ``samples``),
    ``n_trajectories_complete`` (:func:`complete_trajectories`).
    """

    scales: list[float]
    margin_max_scale: float
    fp_std_ddof: int
    classifiers: list[str]
    shifts: list[str]
    accuracy: pd.DataFrame
    failure_points: pd.DataFrame
    failure_point_table: pd.DataFrame
    summary: pd.DataFrame
    kept_by_scale: pd.DataFrame
    n_samples: int
    n_kept: int
    n_trajectories_complete: int
    n_trajectories_total: int
    # Per (shift, scale) realisation measures (:func:`shift_realisation`); defaulted so
    # code constructing Metrics without it keeps working.
    shift_realisation: pd.DataFrame = field(
        default_factory=empty_realisation
    )

    @property
    def kept_share(self) -> dict[float, float]:
        """Scale -> share of that scale's samples kept by the filter (NaN if none)."""
        return {float(s): float(v) for s, v in zip(self.kept_by_scale["scale"], self.kept_by_scale["kept_share"])}

    def to_json(self) -> dict[str, Any]:
        """JSON-serialisable dict (NaN -> null).

        Holds the scales, settings, counts and the ``kept_by_scale``, ``summary``,
        ``accuracy``, ``failure_point_table`` and ``shift_realisation`` tables as lists of
        records.  The
        per-trajectory ``failure_points`` are left out: one row per trajectory and
        classifier is too large for a summary file at full benchmark size.
        """
        return jsonable(
            {
                "scales": self.scales,
                "scale_tags": [scale_tag(s) for s in self.scales],
                "margin_max_scale": self.margin_max_scale,
                "fp_std_ddof": self.fp_std_ddof,
                "classifiers": self.classifiers,
                "shifts": self.shifts,
                "counts": {
                    "n_samples": self.n_samples,
                    "n_kept": self.n_kept,
                    "n_trajectories_total": self.n_trajectories_total,
                    "n_trajectories_complete": self.n_trajectories_complete,
                },
                "kept_by_scale": records(self.kept_by_scale),
                "summary": records(self.summary),
                "accuracy": records(self.accuracy),
                "failure_point_table": records(self.failure_point_table),
                "shift_realisation": records(self.shift_realisation),
            }
        )


def compute_metrics(samples: pd.DataFrame, predictions: pd.DataFrame, scales: Sequence[float],
                    margin_max_scale: float = DEFAULT_MARGIN_MAX_SCALE, fp_std_ddof: int = 1) -> Metrics:
    """Compute every table once (shared evaluation) and return them as :class:`Metrics`.

    Same definitions as the individual functions; raises ValueError on invalid scales,
    ``margin_max_scale`` below the largest scale, missing columns, duplicated samples or
    predictions, or a shift named ``"all"``.  Empty inputs give empty tables.
    """
    scale_list = check_scales(scales)
    if margin_max_scale < max(scale_list):
        raise CnsbenchError(f"margin_max_scale ({margin_max_scale}) must be >= the largest scale ({max(scale_list)})")
    ev = _evaluate(samples, predictions, scale_list)
    acc = _accuracy(ev)
    fps = _failure_points(ev)
    samples = require_columns(samples, _SAMPLE_COLUMNS, "samples")
    kept = kept_flags(samples["kept"]) if len(samples) else pd.Series(dtype=bool)
    return Metrics(
        scales=scale_list,
        margin_max_scale=float(margin_max_scale),
        fp_std_ddof=int(fp_std_ddof),
        classifiers=ev.classifiers,
        shifts=ev.shifts,
        accuracy=acc,
        failure_points=fps,
        failure_point_table=_fp_table(ev, fps),
        summary=_summary(ev, acc, fps, float(margin_max_scale), int(fp_std_ddof)),
        kept_by_scale=_kept_by_scale(samples, scale_list),
        n_samples=int(len(samples)),
        n_kept=int(kept.sum()),
        n_trajectories_complete=len(complete_trajectories(samples, scale_list)),
        n_trajectories_total=int(samples["trajectory_id"].nunique()),
        shift_realisation=shift_realisation(samples, scale_list),
    )
