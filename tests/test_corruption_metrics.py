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


def alexnet_like(factor: float = 1.0, drop: tuple[str, float] | None = None):
    """Errors of a classifier that makes ``factor`` x AlexNet's published error on every
    benchmark corruption at every severity (clean: AlexNet's 43.5 %); ``drop`` leaves out
    one (corruption, severity)."""
    from pipeline.analyses.corruption import alexnet_errors

    errs, clean = alexnet_errors()
    rows = []
    for cor, e in errs.items():
        rows.append((f"x{factor}", cor, 0.0, 10, clean))
        rows += [(f"x{factor}", cor, float(s), 10, factor * e) for s in range(1, 6) if drop != (cor, float(s))]
    return errors_table(rows)


def test_alexnet_row_gives_mce_100_and_a_partial_grid_none():
    from pipeline.analyses.corruption import alexnet_errors, alexnet_mce_gaps

    errs, clean = alexnet_errors()
    assert len(errs) == 15 and clean == pytest.approx(0.435)
    t = corruption_table(pd.concat([alexnet_like(1.0), alexnet_like(0.5)]), alexnet=(errs, clean))
    mean = t[t["corruption"] == MEAN_ROW].set_index("classifier")
    assert 100 * mean.loc["x1.0", "ce_alexnet"] == pytest.approx(100.0)  # AlexNet: mCE 100
    assert 100 * mean.loc["x1.0", "relative_ce_alexnet"] == pytest.approx(100.0)
    assert 100 * mean.loc["x0.5", "ce_alexnet"] == pytest.approx(50.0)
    # relative CE of x0.5 on fog: (0.5 * E - 0.435) / (E - 0.435)
    fog = t[(t["classifier"] == "x0.5") & (t["corruption"] == "fog")].iloc[0]
    assert fog["relative_ce_alexnet"] == pytest.approx((0.5 * errs["fog"] - clean) / (errs["fog"] - clean))
    # One severity missing: that corruption has no AlexNet CE and the classifier no AlexNet mCE.
    part = corruption_table(alexnet_like(1.0, drop=("fog", 3.0)), alexnet=(errs, clean))
    assert math.isnan(part.set_index("corruption").loc["fog", "ce_alexnet"])
    assert part.set_index("corruption").loc["snow", "ce_alexnet"] == pytest.approx(1.0)
    assert math.isnan(part.set_index("corruption").loc[MEAN_ROW, "ce_alexnet"])
    assert alexnet_mce_gaps(part[part["corruption"] != MEAN_ROW]) == ["severities 1..5 incomplete for fog"]
    # Corruptions missing: named.
    few = corruption_table(alexnet_like(1.0).query("corruption in ['fog', 'snow']"), alexnet=(errs, clean))
    assert math.isnan(few.set_index("corruption").loc[MEAN_ROW, "ce_alexnet"])
    assert "13 of the 15 benchmark corruptions missing" in alexnet_mce_gaps(few[few["corruption"] != MEAN_ROW])[0]
