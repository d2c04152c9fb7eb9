"""Bootstrap intervals of the CNS metrics on hand-made tables (pipeline.aggregate.bootstrap)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.aggregate import bootstrap
from pipeline.aggregate.metrics import compute_metrics
from pipeline.plan import sample_id, trajectory_id

SCALES = [0.0, 1.0, 2.0]


def tables(correct: dict[tuple[str, int, int, str], list[bool]], kept: dict | None = None):
    """samples/predictions from {(shift, class, seed, classifier): [correct per scale]}."""
    samples, preds = {}, []
    for (shift, cls, seed, clf), row in correct.items():
        for scale, ok in zip(SCALES, row):
            sid = sample_id(shift, cls, seed, scale)
            samples[sid] = {
                "sample_id": sid, "trajectory_id": trajectory_id(shift, cls, seed), "class_id": cls,
                "shift": shift, "scale": scale, "kept": (kept or {}).get(sid, True),
            }
            preds.append({"sample_id": sid, "classifier": clf, "correct": ok})
    return pd.DataFrame(list(samples.values())), pd.DataFrame(preds)


def run(samples, preds, **kw):
    m = compute_metrics(samples, preds, SCALES)
    return m, bootstrap.intervals(samples, preds, m, **kw)


def test_resample_counts_keep_every_stratum_size():
    strata = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])
    w = bootstrap.resample_counts(strata, 500, np.random.default_rng(3))
    assert w.shape == (500, 9)
    for k, size in ((0, 3), (1, 2), (2, 4)):
        assert (w[:, strata == k].sum(axis=1) == size).all()  # a stratum is redrawn to its own size
    # uniform within a stratum: every trajectory drawn once per resample on average
    assert np.allclose(w.mean(axis=0), 1.0, atol=0.15)


def test_two_trajectory_distribution_by_hand():
    # One stratum of two trajectories; at scale 1 one is right, one wrong.  A resample
    # draws 2 of them: accuracy 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4.
    s, p = tables({("snow", 1, 1, "a"): [True, True, True], ("snow", 1, 2, "a"): [True, False, False]})
    m, iv = run(s, p, resamples=4000, level=0.95, seed=0)
    row = iv.accuracy[(iv.accuracy["scale"] == 1.0)].iloc[0]
    assert (row["accuracy_ci_low"], row["accuracy_ci_high"]) == (0.0, 1.0)
    # a 40% interval is [q(0.3), q(0.7)] = [0.5, 0.5]
    _, narrow = run(s, p, resamples=4000, level=0.4, seed=0)
    row = narrow.accuracy[(narrow.accuracy["scale"] == 1.0)].iloc[0]
    assert (row["accuracy_ci_low"], row["accuracy_ci_high"]) == (0.5, 0.5)
    # scale 0: both right in every resample
    row = iv.accuracy[(iv.accuracy["scale"] == 0.0)].iloc[0]
    assert (row["accuracy_drop_ci_low"], row["accuracy_drop_ci_high"]) == (0.0, 0.0)


def test_degenerate_data_give_point_intervals_and_columns_join():
    data = {}
    for cls in (1, 2):
        for seed in range(5):
            data[("snow", cls, seed, "early")] = [True, False, False]  # fails at 1 everywhere
            data[("snow", cls, seed, "late")] = [True, True, False]  # fails at 2 everywhere
            data[("fog", cls, seed, "early")] = [True, False, True]
            data[("fog", cls, seed, "late")] = [True, True, True]  # never fails on fog
    s, p = tables(data)
    m, iv = run(s, p, resamples=200, seed=1)
    out = bootstrap.with_intervals(m, iv)
    summ = out.summary.set_index("classifier")
    assert list(out.summary.columns[:4]) == ["classifier", "acc_drop_0000", "acc_drop_0000_ci_low", "acc_drop_0000_ci_high"]
    assert summ.loc["early", ["fp_avg", "fp_avg_ci_low", "fp_avg_ci_high"]].tolist() == [1.0, 1.0, 1.0]
    assert summ.loc["late", ["fp_avg", "fp_avg_ci_low", "fp_avg_ci_high"]].tolist() == [2.0, 2.0, 2.0]
    # summary drop at scale 2: mean over shifts of per-shift drops (early: 1 snow, 0 fog)
    assert summ.loc["early", ["acc_drop_2000", "acc_drop_2000_ci_low", "acc_drop_2000_ci_high"]].tolist() == [0.5] * 3
    fpt = out.failure_point_table
    row = fpt[(fpt["classifier"] == "late") & (fpt["shift"] == "all") & (fpt["scale"] == 2.0)].iloc[0]
    assert row["fp_ratio"] == row["fp_ratio_ci_low"] == row["fp_ratio_ci_high"] == 0.5
    assert row["fp_ratio_cumulative"] == row["fp_ratio_cumulative_ci_high"] == 0.5
    pw = iv.pairwise.set_index(["metric", "classifier_a", "classifier_b"])
    r = pw.loc[("fp_avg", "early", "late")]
    assert (r["difference"], r["ci_low"], r["ci_high"], r["excludes_zero"], r["n_common"]) == (-1.0, -1.0, -1.0, True, 20)
    # margin (3 - FP, never failed at 3): early 2 on snow and fog; late 1 on snow, 0 on fog
    r = pw.loc[("margin_fp_avg", "early", "late")]
    assert r["difference"] == pytest.approx(1.5) and r["ci_low"] == pytest.approx(1.5) and r["excludes_zero"]


def test_deterministic_for_a_seed_and_identical_classifiers_do_not_differ():
    rng = np.random.default_rng(0)
    data = {}
    for cls in range(4):
        for seed in range(6):
            row = [True] + list(rng.random(2) < 0.6)
            data[("snow", cls, seed, "a")] = row
            data[("snow", cls, seed, "b")] = row  # the same predictions as a
    s, p = tables(data)
    _, one = run(s, p, resamples=300, seed=7)
    _, two = run(s, p, resamples=300, seed=7)
    _, other = run(s, p, resamples=300, seed=8)
    pd.testing.assert_frame_equal(one.summary, two.summary)
    pd.testing.assert_frame_equal(one.accuracy, two.accuracy)
    assert not one.summary.equals(other.summary)
    r = one.pairwise[one.pairwise["metric"] == "fp_avg"].iloc[0]
    assert (r["difference"], r["ci_low"], r["ci_high"], r["excludes_zero"]) == (0.0, 0.0, 0.0, False)


def test_incomplete_trajectories_are_not_resampled():
    data = {("snow", 1, s, "a"): [True, s % 2 == 0, False] for s in range(4)}
    s, p = tables(data, kept={sample_id("snow", 1, 3, 1.0): False})
    m, iv = run(s, p, resamples=100)
    d = bootstrap.design(s, p, m)
    assert len(d.trajectories) == 3 and trajectory_id("snow", 1, 3) not in d.trajectories


def _design(correct: np.ndarray, n_classes: int) -> bootstrap.Design:
    """A one-shift, one-classifier design from a (trajectories x scales) correctness matrix."""
    n = len(correct)
    wrong = correct == 0
    return bootstrap.Design(
        trajectories=[str(i) for i in range(n)], shifts=["snow"], classifiers=["a"], scales=SCALES,
        shift_of=np.zeros(n, dtype=int), stratum_of=np.repeat(np.arange(n_classes), n // n_classes),
        correct=correct[:, None, :].astype(float), evaluated=np.ones((n, 1), dtype=bool),
        fp_index=np.where(wrong.any(1), wrong.argmax(1), -1)[:, None],
    )


def test_simulated_coverage_of_the_accuracy_drop_and_mean_failure_point():
    """Nominal 90% intervals cover the true value in about 90% of simulated benchmarks.

    Each benchmark: 5 classes x 12 seeds, a classifier right at scale s with probability
    p[s] independently.  True accuracy drop at scale 2: p[0] - p[2]; true mean failure
    point over failed trajectories: sum_s s P(first wrong at s) / P(some wrong).
    """
    p_true = np.array([0.9, 0.7, 0.4])
    p_first = np.array([1 - p_true[0], p_true[0] * (1 - p_true[1]), p_true[0] * p_true[1] * (1 - p_true[2])])
    fp_true = float((p_first * np.array(SCALES)).sum() / p_first.sum())
    rng = np.random.default_rng(2024)
    n_sets, covered_drop, covered_fp = 400, 0, 0
    for _ in range(n_sets):
        d = _design(rng.random((60, 3)) < p_true, n_classes=5)
        stats = bootstrap.bootstrap_statistics(d, 400, int(rng.integers(1 << 30)), margin_max_scale=3.0)
        low, high = bootstrap.percentile_interval(stats["accuracy_drop"][:, 0, 0, 2], 0.9)
        covered_drop += low <= p_true[0] - p_true[2] <= high
        low, high = bootstrap.percentile_interval(stats["fp_avg"][:, 0], 0.9)
        covered_fp += low <= fp_true <= high
    # 90% +- 3.3 binomial standard deviations (1.5 points) of 400 sets
    assert 0.85 <= covered_drop / n_sets <= 0.95, covered_drop
    assert 0.85 <= covered_fp / n_sets <= 0.95, covered_fp


def test_bad_options_are_refused():
    s, p = tables({("snow", 1, 1, "a"): [True, True, False]})
    m = compute_metrics(s, p, SCALES)
    with pytest.raises(ValueError, match="level"):
        bootstrap.intervals(s, p, m, level=1.5)
    with pytest.raises(ValueError, match="resamples"):
        bootstrap.intervals(s, p, m, resamples=0)
