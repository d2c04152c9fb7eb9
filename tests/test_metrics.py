"""Hand-computed checks of pipeline.aggregate.metrics and pipeline.aggregate.report.

Toy benchmark: scales 0, 1, 2; shifts "snow" and "style"; class 1; classifiers A, B, C.
Correctness per scale (1 = correct, 0 = wrong) of the four complete trajectories:

    trajectory     A        B        C
    snow/seed1     1 1 0    1 0 0    1 1 1
    snow/seed2     1 1 1    1 1 1    1 1 1
    style/seed1    0 1 1    1 1 1    1 1 1
    style/seed2    1 1 1    1 1 0    1 1 1

Two more "snow" trajectories must be dropped from every metric; every prediction on
them is wrong, so any leak would change the snow numbers:
    snow/seed3: no sample at scale 2 (incomplete)
    snow/seed4: all scales present, the scale-1 image not kept by the filter
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.aggregate.metrics import (
    ACCURACY_COLUMNS,
    FAILURE_POINT_COLUMNS,
    FP_TABLE_COLUMNS,
    Metrics,
    accuracy_table,
    complete_trajectories,
    compute_metrics,
    failure_point_table,
    failure_points,
    first_failure,
    summary_columns,
    summary_table,
)
from pipeline.aggregate.report import write_report
from pipeline.plan import sample_id, trajectory_id
from pipeline.plan.schema import PREDICTIONS, SAMPLES

SCALES = [0.0, 1.0, 2.0]
CLASSIFIERS = ["A", "B", "C"]
TABLE = {  # (shift, seed) -> {classifier: correctness per scale}
    ("snow", 1): {"A": [1, 1, 0], "B": [1, 0, 0], "C": [1, 1, 1]},
    ("snow", 2): {"A": [1, 1, 1], "B": [1, 1, 1], "C": [1, 1, 1]},
    ("style", 1): {"A": [0, 1, 1], "B": [1, 1, 1], "C": [1, 1, 1]},
    ("style", 2): {"A": [1, 1, 1], "B": [1, 1, 0], "C": [1, 1, 1]},
}
T = {key: trajectory_id(key[0], 1, key[1]) for key in [*TABLE, ("snow", 3), ("snow", 4)]}


def _sample(shift: str, seed: int, scale: float, kept: bool) -> dict:
    row = {f.name: None for f in SAMPLES}
    row.update(
        sample_id=sample_id(shift, 1, seed, scale),
        trajectory_id=trajectory_id(shift, 1, seed),
        class_id=1,
        class_name="goldfish",
        seed=seed,
        shift=shift,
        scale=scale,
        shard="shard-000",
        key=sample_id(shift, 1, seed, scale),
        n_pass=4 if kept else 0,
        kept=kept,
    )
    return row


def _prediction(sid: str, classifier: str, correct: bool) -> dict:
    return dict(sample_id=sid, classifier=classifier, top1=1 if correct else 2, top5=[1, 2, 3, 4, 5],
                p_true=0.9 if correct else 0.1, correct=correct)


def toy() -> tuple[pd.DataFrame, pd.DataFrame]:
    samples, preds = [], []
    for (shift, seed), by_clf in TABLE.items():
        for i, scale in enumerate(SCALES):
            samples.append(_sample(shift, seed, scale, True))
            for clf in CLASSIFIERS:
                preds.append(_prediction(samples[-1]["sample_id"], clf, bool(by_clf[clf][i])))
    dropped = [("snow", 3, 0.0, True), ("snow", 3, 1.0, True),  # seed 3: scale 2 missing
               ("snow", 4, 0.0, True), ("snow", 4, 1.0, False), ("snow", 4, 2.0, True)]  # seed 4: scale 1 not kept
    for shift, seed, scale, kept in dropped:
        samples.append(_sample(shift, seed, scale, kept))
        for clf in CLASSIFIERS:
            preds.append(_prediction(samples[-1]["sample_id"], clf, False))
    s = pd.DataFrame(samples, columns=SAMPLES.names).astype({"scale": float, "kept": bool})
    p = pd.DataFrame(preds, columns=PREDICTIONS.names)
    return s, p


def rows_of(df: pd.DataFrame, **where) -> pd.DataFrame:
    mask = np.ones(len(df), dtype=bool)
    for col, val in where.items():
        mask &= (df[col] == val).to_numpy()
    return df[mask]


# --------------------------------------------------------------------------- metrics
def test_complete_trajectories_drop_missing_scale_and_not_kept():
    s, _ = toy()
    assert complete_trajectories(s, SCALES) == {T[k] for k in TABLE}
    # Ignoring the extra scale makes seed 3 complete; the unkept seed 4 never is.
    assert T[("snow", 3)] in complete_trajectories(s, [0.0, 1.0])
    assert T[("snow", 4)] not in complete_trajectories(s, [0.0, 1.0])


def test_accuracy_and_drop_by_hand():
    s, p = toy()
    acc = accuracy_table(s, p, SCALES)
    assert list(acc.columns) == ACCURACY_COLUMNS
    # (classifier, shift) -> accuracy at scales 0, 1, 2 over the 2 complete trajectories:
    #   A snow : (1+1)/2, (1+1)/2, (0+1)/2 = 1.0, 1.0, 0.5 -> change 0, 0, -0.5
    #   A style: (0+1)/2, (1+1)/2, (1+1)/2 = 0.5, 1.0, 1.0 -> change 0, +0.5, +0.5
    #   B snow : 1.0, (0+1)/2, (0+1)/2 = 1.0, 0.5, 0.5    -> change 0, -0.5, -0.5
    #   B style: 1.0, 1.0, (1+0)/2 = 1.0, 1.0, 0.5         -> change 0, 0, -0.5
    #   C      : 1.0 everywhere                            -> change 0
    # accuracy_drop is the paper's sign: -change (positive = drop).
    expected = {
        ("A", "snow"): ([1.0, 1.0, 0.5], [0.0, 0.0, -0.5]),
        ("A", "style"): ([0.5, 1.0, 1.0], [0.0, 0.5, 0.5]),
        ("B", "snow"): ([1.0, 0.5, 0.5], [0.0, -0.5, -0.5]),
        ("B", "style"): ([1.0, 1.0, 0.5], [0.0, 0.0, -0.5]),
        ("C", "snow"): ([1.0, 1.0, 1.0], [0.0, 0.0, 0.0]),
        ("C", "style"): ([1.0, 1.0, 1.0], [0.0, 0.0, 0.0]),
    }
    assert len(acc) == len(expected) * len(SCALES)
    for (clf, shift), (accuracy, drop) in expected.items():
        r = rows_of(acc, classifier=clf, shift=shift)
        assert r["scale"].tolist() == SCALES
        assert r["n"].tolist() == [2, 2, 2]  # the dropped snow seeds 3 and 4 are not counted
        assert r["accuracy"].tolist() == accuracy
        assert r["accuracy_change"].tolist() == drop
        assert r["accuracy_drop"].tolist() == [-d for d in drop]
    # Ordering: classifiers as they appear in predictions, then shift, then scale.
    assert acc["classifier"].tolist()[:: len(SCALES) * 2] == CLASSIFIERS


def test_failure_points_by_hand():
    s, p = toy()
    fp = failure_points(s, p, SCALES)
    assert list(fp.columns) == FAILURE_POINT_COLUMNS
    assert len(fp) == 4 * 3  # 4 complete trajectories x 3 classifiers, dropped ones absent
    got = {(r.trajectory_id, r.classifier): r.failure_point for r in fp.itertuples()}
    assert got[(T[("snow", 1)], "A")] == 2.0
    assert math.isnan(got[(T[("snow", 2)], "A")])
    assert got[(T[("style", 1)], "A")] == 0.0  # wrong at scale 0, right later: still FP 0
    assert math.isnan(got[(T[("style", 2)], "A")])
    assert got[(T[("snow", 1)], "B")] == 1.0
    assert got[(T[("style", 2)], "B")] == 2.0
    assert all(math.isnan(got[(T[k], "C")]) for k in TABLE)  # C never fails
    assert set(fp["shift"]) == {"snow", "style"}


def test_first_failure_is_the_smallest_wrong_scale():
    assert float(first_failure([0.0, 1.0, 2.0], [True, False, False])) == 1.0
    assert float(first_failure([0.0, 1.0, 2.0], [False, True, True])) == 0.0  # wrong at scale 0 counts
    assert math.isnan(float(first_failure([0.0, 1.0, 2.0], [True, True, True])))  # never failed
    # scales in any order, several trajectories at once
    got = first_failure([2.0, 0.5, 0.0], [[False, False, True], [False, True, True], [True, True, True]])
    assert got.shape == (3,) and got[0] == 0.5 and got[1] == 2.0 and math.isnan(got[2])
    with pytest.raises(ValueError, match="shape"):
        first_failure([0.0, 1.0], [True, False, True])


def test_failure_point_table_by_hand():
    s, p = toy()
    tab = failure_point_table(s, p, SCALES)
    assert list(tab.columns) == FP_TABLE_COLUMNS
    # (classifier, shift) -> (fp_count, fp_ratio, fp_ratio_cumulative) at scales 0, 1, 2
    # n = 2 per shift, 4 for "all".
    expected = {
        ("A", "snow"): ([0, 0, 1], [0.0, 0.0, 0.5], [0.0, 0.0, 0.5]),  # FP 2.0 ; never
        ("A", "style"): ([1, 0, 0], [0.5, 0.0, 0.0], [0.5, 0.5, 0.5]),  # FP 0.0 ; never
        ("A", "all"): ([1, 0, 1], [0.25, 0.0, 0.25], [0.25, 0.25, 0.5]),
        ("B", "snow"): ([0, 1, 0], [0.0, 0.5, 0.0], [0.0, 0.5, 0.5]),  # FP 1.0 ; never
        ("B", "style"): ([0, 0, 1], [0.0, 0.0, 0.5], [0.0, 0.0, 0.5]),  # never ; FP 2.0
        ("B", "all"): ([0, 1, 1], [0.0, 0.25, 0.25], [0.0, 0.25, 0.5]),
        ("C", "snow"): ([0, 0, 0], [0.0] * 3, [0.0] * 3),
        ("C", "style"): ([0, 0, 0], [0.0] * 3, [0.0] * 3),
        ("C", "all"): ([0, 0, 0], [0.0] * 3, [0.0] * 3),
    }
    assert len(tab) == len(expected) * len(SCALES)
    for (clf, shift), (count, ratio, cum) in expected.items():
        r = rows_of(tab, classifier=clf, shift=shift)
        assert r["scale"].tolist() == SCALES
        assert r["fp_count"].tolist() == count
        assert r["fp_ratio"].tolist() == ratio
        assert r["fp_ratio_cumulative"].tolist() == cum
    # "all" rows come after the real shifts of each classifier.
    assert tab["shift"].tolist()[: 3 * len(SCALES)] == ["snow"] * 3 + ["style"] * 3 + ["all"] * 3


def test_summary_by_hand():
    s, p = toy()
    summ = summary_table(s, p, SCALES, fp_std_ddof=0)
    assert list(summ.columns) == summary_columns(SCALES) == [
        "classifier", "acc_drop_0000", "acc_drop_1000", "acc_drop_2000",
        "acc_drop_pooled_0000", "acc_drop_pooled_1000", "acc_drop_pooled_2000",
        "accuracy_scale0", "fp_avg", "fp_std", "margin_fp_avg", "n_failed", "n_trajectories",
    ]
    by = summ.set_index("classifier")
    assert by.index.tolist() == CLASSIFIERS
    # acc_drop = mean over shifts of the per-shift drops, positive = drop (see
    # test_accuracy_and_drop_by_hand):
    #   A: scale 1 (0 - 0.5)/2 = -0.25 (a gain), scale 2 (0.5 - 0.5)/2 = 0.0; accuracy_scale0 (1 + 0.5)/2
    #   B: scale 1 (0.5 + 0)/2 = 0.25, scale 2 (0.5 + 0.5)/2 = 0.5; accuracy_scale0 1.0
    # Every shift has 2 evaluated trajectories here, so the pooled drops are the same.
    for pre in ("acc_drop_", "acc_drop_pooled_"):
        cols = [f"{pre}0000", f"{pre}1000", f"{pre}2000"]
        assert by.loc["A", cols].tolist() == [0.0, -0.25, 0.0]
        assert by.loc["B", cols].tolist() == [0.0, 0.25, 0.5]
        assert by.loc["C", cols].tolist() == [0.0, 0.0, 0.0]
    assert by["accuracy_scale0"].tolist() == [0.75, 1.0, 1.0]
    # A: failed FPs {0, 2}: mean 1, population std sqrt(((0-1)^2 + (2-1)^2)/2) = 1;
    #    margin (3-0 + 3-2 + 0 + 0)/4 = 1   (never-failed get FP = 3, contributing 0)
    assert by.loc["A", ["fp_avg", "fp_std", "margin_fp_avg"]].tolist() == [1.0, 1.0, 1.0]
    # B: failed FPs {1, 2}: mean 1.5, population std 0.5; margin (2 + 1 + 0 + 0)/4 = 0.75
    assert by.loc["B", ["fp_avg", "fp_std", "margin_fp_avg"]].tolist() == [1.5, 0.5, 0.75]
    # C: never fails: no FP statistics, margin 0 (all at margin_max_scale)
    assert math.isnan(by.loc["C", "fp_avg"]) and math.isnan(by.loc["C", "fp_std"])
    assert by.loc["C", "margin_fp_avg"] == 0.0
    assert by["n_failed"].tolist() == [2, 2, 0]
    assert by["n_trajectories"].tolist() == [4, 4, 4]
    assert summ["n_failed"].dtype == np.int64


def test_summary_margin_max_scale_and_ddof():
    s, p = toy()
    # margin_max_scale 2.5: A (2.5-0 + 2.5-2)/4 = 0.75 ; B (1.5 + 0.5)/4 = 0.5
    by = summary_table(s, p, SCALES, margin_max_scale=2.5).set_index("classifier")
    assert by["margin_fp_avg"].tolist() == [0.75, 0.5, 0.0]
    # Sample std (ddof=1, the original code's pandas .std()): A sqrt(2), B sqrt(0.125*4)= sqrt(0.5)
    by1 = summary_table(s, p, SCALES, fp_std_ddof=1).set_index("classifier")
    assert by1.loc["A", "fp_std"] == math.sqrt(2.0)
    assert by1.loc["B", "fp_std"] == math.sqrt(0.5)
    with pytest.raises(ValueError, match="margin_max_scale"):
        summary_table(s, p, SCALES, margin_max_scale=1.5)


def test_missing_prediction_excludes_trajectory_for_that_classifier_only():
    s, p = toy()
    sid = sample_id("snow", 1, 1, 2.0)
    p = p[~((p["sample_id"] == sid) & (p["classifier"] == "A"))]
    by = summary_table(s, p, SCALES).set_index("classifier")
    assert by["n_trajectories"].tolist() == [3, 4, 4]
    acc = accuracy_table(s, p, SCALES)
    assert rows_of(acc, classifier="A", shift="snow")["n"].tolist() == [1, 1, 1]
    assert rows_of(acc, classifier="B", shift="snow")["n"].tolist() == [2, 2, 2]


def test_float_noise_in_scales_and_invalid_inputs():
    s, p = toy()
    noisy = s.assign(scale=s["scale"] + 1e-9)
    assert accuracy_table(noisy, p, SCALES).equals(accuracy_table(s, p, SCALES))
    with pytest.raises(ValueError, match="include 0"):
        accuracy_table(s, p, [1.0, 2.0])
    with pytest.raises(ValueError, match="ascending"):
        accuracy_table(s, p, [0.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="several rows"):
        accuracy_table(s, pd.concat([p, p.iloc[:1]]), SCALES)
    with pytest.raises(ValueError, match="reserved"):
        failure_point_table(s.assign(shift=s["shift"].replace("style", "all")), p, SCALES)


def test_compute_metrics_counts_and_json():
    s, p = toy()
    m = compute_metrics(s, p, SCALES, margin_max_scale=3.0)
    assert isinstance(m, Metrics)
    assert m.classifiers == CLASSIFIERS and m.shifts == ["snow", "style"]
    # 4 complete x 3 + seed 3 (2 samples) + seed 4 (3 samples, 1 not kept)
    assert (m.n_samples, m.n_kept) == (17, 16)
    assert (m.n_trajectories_total, m.n_trajectories_complete) == (6, 4)
    # scale 0: 6 of 6 kept; scale 1: 5 of 6 (seed 4); scale 2: 5 of 5 (seed 3 has none)
    assert m.kept_by_scale["n_samples"].tolist() == [6, 6, 5]
    assert m.kept_by_scale["n_kept"].tolist() == [6, 5, 5]
    assert m.kept_share == {0.0: 1.0, 1.0: 5 / 6, 2.0: 1.0}
    assert m.summary.equals(summary_table(s, p, SCALES))
    assert m.accuracy.equals(accuracy_table(s, p, SCALES))
    assert m.failure_point_table.equals(failure_point_table(s, p, SCALES))
    assert m.failure_points.equals(failure_points(s, p, SCALES))

    doc = m.to_json()
    text = json.dumps(doc, allow_nan=False)  # NaN must already be null
    back = json.loads(text)
    assert back["counts"] == {"n_samples": 17, "n_kept": 16, "n_trajectories_total": 6, "n_trajectories_complete": 4}
    c = next(r for r in back["summary"] if r["classifier"] == "C")
    assert c["fp_avg"] is None and c["fp_std"] is None and c["n_failed"] == 0
    assert back["scales"] == SCALES and back["scale_tags"] == ["0000", "1000", "2000"]


# --------------------------------------------------------------------------- report
def _read_csv(path: str) -> pd.DataFrame:
    return pd.read_csv(path, keep_default_na=True)


def _assert_records_match(records: list[dict], df: pd.DataFrame) -> None:
    assert len(records) == len(df)
    for rec, (_, row) in zip(records, df.iterrows()):
        assert list(rec) == list(df.columns)
        for col in df.columns:
            a, b = rec[col], row[col]
            if a is None:
                assert pd.isna(b), (col, a, b)
            elif isinstance(a, float) or isinstance(b, float):
                assert float(a) == float(b), (col, a, b)
            else:
                assert a == b, (col, a, b)


def test_report_files_and_consistency(tmp_path: Path):
    s, p = toy()
    m = compute_metrics(s, p, SCALES)
    out = write_report(m, tmp_path / "report", title="Toy <bench> & co", config_hash="abc123")
    names = {"accuracy.csv", "failure_points.csv", "summary.csv", "metrics.json",
             "accuracy_drop.png", "fp_cumulative.png", "fp_distribution.png", "index.html"}
    assert set(out) == names
    for name, path in out.items():
        assert Path(path).is_file() and Path(path).name == name and Path(path).stat().st_size > 0
    for png in ("accuracy_drop.png", "fp_cumulative.png", "fp_distribution.png"):
        assert Path(out[png]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # No temporary files left behind by the atomic writes.
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == sorted(names)

    acc = _read_csv(out["accuracy.csv"])
    fpt = _read_csv(out["failure_points.csv"])
    summ = _read_csv(out["summary.csv"])
    assert list(acc.columns) == ["classifier", "shift", "scale", "n", "accuracy", "accuracy_change", "accuracy_drop"]
    assert list(fpt.columns) == ["classifier", "shift", "scale", "fp_count", "fp_ratio", "fp_ratio_cumulative"]
    assert list(summ.columns) == summary_columns(SCALES)
    assert len(acc) == 18 and len(fpt) == 27 and len(summ) == 3

    doc = json.loads(Path(out["metrics.json"]).read_text())
    assert doc["title"] == "Toy <bench> & co" and doc["config_hash"] == "abc123"
    _assert_records_match(doc["accuracy"], acc)
    _assert_records_match(doc["failure_point_table"], fpt)
    _assert_records_match(doc["summary"], summ)
    assert summ.set_index("classifier").loc["B", "margin_fp_avg"] == 0.75

    page = Path(out["index.html"]).read_text()
    for png in ("accuracy_drop.png", "fp_cumulative.png", "fp_distribution.png"):
        assert f'src="{png}"' in page
    assert "Toy &lt;bench&gt; &amp; co" in page and "<bench>" not in page
    assert "abc123" in page and "margin_fp_avg" in page
    assert "http://" not in page and "https://" not in page


def test_report_without_plots(tmp_path: Path):
    s, p = toy()
    out = write_report(compute_metrics(s, p, SCALES), tmp_path, title="t", plots=False, per_trajectory=True)
    assert not any(name.endswith(".png") for name in out)
    assert ".png" not in Path(out["index.html"]).read_text()
    traj = _read_csv(out["trajectory_failure_points.csv"])
    assert list(traj.columns) == FAILURE_POINT_COLUMNS and len(traj) == 12


@pytest.mark.parametrize("kind", ["schema", "bare"])
def test_empty_input(tmp_path: Path, kind: str):
    if kind == "schema":
        s = pd.DataFrame({n: pd.Series(dtype=object) for n in SAMPLES.names})
        p = pd.DataFrame({n: pd.Series(dtype=object) for n in PREDICTIONS.names})
    else:
        s, p = pd.DataFrame(), pd.DataFrame()
    assert complete_trajectories(s, SCALES) == set()
    m = compute_metrics(s, p, SCALES)
    assert m.n_samples == 0 and m.n_trajectories_complete == 0 and m.classifiers == []
    assert list(m.accuracy.columns) == ACCURACY_COLUMNS and m.accuracy.empty
    assert list(m.failure_points.columns) == FAILURE_POINT_COLUMNS and m.failure_points.empty
    assert list(m.failure_point_table.columns) == FP_TABLE_COLUMNS and m.failure_point_table.empty
    assert list(m.summary.columns) == summary_columns(SCALES) and m.summary.empty
    json.dumps(m.to_json(), allow_nan=False)

    out = write_report(m, tmp_path, title="empty")
    assert Path(out["accuracy.csv"]).read_text() == ",".join(ACCURACY_COLUMNS) + "\n"
    assert Path(out["failure_points.csv"]).read_text() == ",".join(FP_TABLE_COLUMNS) + "\n"
    assert Path(out["summary.csv"]).read_text() == ",".join(summary_columns(SCALES)) + "\n"
    for png in ("accuracy_drop.png", "fp_cumulative.png", "fp_distribution.png"):
        assert Path(out[png]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(Path(out["metrics.json"]).read_text())
    assert doc["summary"] == [] and doc["counts"]["n_trajectories_complete"] == 0
    assert all(r["kept_share"] is None for r in doc["kept_by_scale"])
    assert "no rows" in Path(out["index.html"]).read_text()


def test_complete_trajectories_without_predictions_is_not_a_crash(tmp_path: Path):
    s, p = toy()
    m = compute_metrics(s, p.iloc[0:0], SCALES)
    assert m.n_trajectories_complete == 4 and m.classifiers == [] and m.summary.empty
    out = write_report(m, tmp_path, title="no predictions")
    assert Path(out["fp_distribution.png"]).is_file()
