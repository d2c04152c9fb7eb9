"""corruption_error (CE, mCE, relative mCE) and family_comparison (Spearman) on hand-made tables."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from pipeline.analyses.corruption import MEAN_ROW, corruption_table, severity_errors
from pipeline.analyses.family_comparison import correlations, spearman


def errors_table(rows):
    return pd.DataFrame(rows, columns=["classifier", "corruption", "severity", "n", "error"])


def hand_errors():
    rows = []
    # classifier a: fog errors 0.1..0.5 by severity, clean 0.1; speckle (extra) all 0.2
    # classifier b: fog errors 0.2..1.0, clean 0.2; speckle all 0.4
    for s, (ea, eb) in zip(range(6), [(0.1, 0.2), (0.1, 0.2), (0.2, 0.4), (0.3, 0.6), (0.4, 0.8), (0.5, 1.0)]):
        rows.append(("a", "fog", float(s), 10, ea))
        rows.append(("b", "fog", float(s), 10, eb))
    for s in range(6):
        rows.append(("a", "speckle_noise", float(s), 10, 0.1 if s == 0 else 0.2))
        rows.append(("b", "speckle_noise", float(s), 10, 0.2 if s == 0 else 0.4))
    return errors_table(rows)


def test_corruption_error_by_hand():
    alexnet = ({"fog": 0.6}, 0.4)
    t = corruption_table(hand_errors(), baseline="b", alexnet=alexnet).set_index(["classifier", "corruption"])
    fog_a = t.loc[("a", "fog")]
    assert fog_a["ce_unnormalized"] == pytest.approx(0.3)  # mean of 0.1..0.5
    assert fog_a["ce_baseline"] == pytest.approx(1.5 / 3.0)  # sum a / sum b
    # relative: sum (E - clean) = 0 + .1 + .2 + .3 + .4 = 1.0; b: 0 + .2 + .4 + .6 + .8 = 2.0
    assert fog_a["relative_ce_baseline"] == pytest.approx(0.5)
    assert fog_a["ce_alexnet"] == pytest.approx(0.3 / 0.6)
    assert fog_a["relative_ce_alexnet"] == pytest.approx((0.3 - 0.1) / (0.6 - 0.4))
    assert fog_a["error_s3"] == pytest.approx(0.3) and fog_a["error_clean"] == pytest.approx(0.1)
    assert bool(fog_a["in_mce"]) and not bool(t.loc[("a", "speckle_noise"), "in_mce"])
    assert math.isnan(t.loc[("a", "speckle_noise"), "ce_alexnet"])  # no published AlexNet error
    assert t.loc[("b", "fog"), "ce_baseline"] == pytest.approx(1.0)
    # mCE: the benchmark corruptions only (fog), the extra speckle noise is not averaged
    mean_a = t.loc[("a", MEAN_ROW)]
    assert mean_a["ce_unnormalized"] == pytest.approx(0.3) and mean_a["ce_baseline"] == pytest.approx(0.5)
    assert mean_a["n_images"] == 60


def test_mce_averages_benchmark_corruptions_and_extras_only_alone():
    rows = []
    for cor, e in (("fog", 0.2), ("contrast", 0.6)):
        for s in range(1, 6):
            rows.append(("a", cor, float(s), 5, e))
    t = corruption_table(errors_table(rows)).set_index(["classifier", "corruption"])
    assert t.loc[("a", MEAN_ROW), "ce_unnormalized"] == pytest.approx(0.4)
    assert math.isnan(t.loc[("a", MEAN_ROW), "error_clean"])  # no severity-0 images
    only_extra = corruption_table(errors_table([("a", "saturate", 1.0, 5, 0.3)])).set_index("corruption")
    assert only_extra.loc[MEAN_ROW, "ce_unnormalized"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="baseline classifier 'z'"):
        corruption_table(errors_table(rows), baseline="z")


def test_severity_errors_from_output_tables():
    samples = pd.DataFrame(
        {
            "sample_id": ["fog/1/0", "fog/1/1", "fog/2/0", "fog/2/1", "slider/1/0"],
            "shift": ["fog", "fog", "fog", "fog", "thick"],
            "scale": [0.0, 1.0, 0.0, 1.0, 0.0],
            "kept": [True, True, True, True, True],
        }
    )
    preds = pd.DataFrame(
        {
            "sample_id": ["fog/1/0", "fog/1/1", "fog/2/0", "fog/2/1", "slider/1/0"],
            "classifier": ["a"] * 5,
            "correct": [True, False, True, True, False],
        }
    )
    e = severity_errors(samples, preds, ["fog"]).set_index("severity")
    assert e.loc[0.0, "error"] == 0.0 and e.loc[1.0, "error"] == 0.5 and e.loc[1.0, "n"] == 2


def test_spearman_by_hand():
    assert spearman([1, 2, 3, 4], [2, 1, 4, 3]) == pytest.approx(0.6)  # 1 - 6 * 4 / (4 * 15)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    # ties take average ranks: x ranks 1, 2.5, 2.5, 4; y ranks 1..4 -> rho = 0.9487
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5.0))
    assert math.isnan(spearman([1, 2], [1, 2]))  # fewer than 3 pairs
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))  # constant side
    assert spearman([1, float("nan"), 3, 4, 5], [1, 9, 2, 3, 4]) == pytest.approx(1.0)  # NaN pairs dropped


def test_family_correlations_table():
    table = pd.DataFrame(
        {
            "classifier": ["a", "b", "c", "d"] * 2,
            "family": ["slider"] * 4 + ["corruption"] * 4,
            "mean_accuracy_drop": [-0.1, -0.2, -0.3, -0.4, -0.2, -0.1, -0.4, -0.3],
            "accuracy_drop_max": [-0.1, -0.2, -0.3, -0.4, -0.1, -0.2, -0.3, -0.4],
            "fp_relative": [0.9, 0.8, 0.7, 0.6, 0.6, 0.7, 0.8, 0.9],
            "failed_share": [0.5] * 8,
        }
    )
    corr = correlations(table).set_index("measure")
    assert corr.loc["mean_accuracy_drop", "spearman"] == pytest.approx(0.6)
    assert corr.loc["accuracy_drop_max", "spearman"] == pytest.approx(1.0)
    assert corr.loc["fp_relative", "spearman"] == pytest.approx(-1.0)
    assert math.isnan(corr.loc["failed_share", "spearman"])
    assert set(corr["family_a"]) == {"slider"} and set(corr["n_classifiers"]) == {4}
