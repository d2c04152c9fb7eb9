"""Analysis ``attributes`` on hand-made samples and predictions."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from pipeline.analyses.attributes import CONTRACT_COLUMNS, run, summary
from pipeline.aggregate.analysis import AnalysisContext
from pipeline.config import load_config
from pipeline.plan import sample_id, trajectory_id

REPO = Path(__file__).resolve().parents[1]
SCALES = [0.0, 0.25, 0.5, 0.7, 1.0]


def _config():
    return load_config(REPO / "configs" / "world_imagenet_e.yaml", {"aggregate": {"plots": False}})


def _tables(correct: dict[tuple[str, str, int], list[bool]]):
    """correct[(classifier, shift, seed)] = correctness at SCALES -> (samples, predictions)."""
    samples, preds = {}, []
    for (clf, shift, seed), flags in correct.items():
        for scale, ok in zip(SCALES, flags):
            sid = sample_id(shift, 3, seed, scale)
            params = {"attribute": shift, "level": scale}
            if shift == "size" and scale:
                params["target_share"] = 0.15 - 0.1 * scale
            samples[sid] = {
                "sample_id": sid,
                "trajectory_id": trajectory_id(shift, 3, seed),
                "shift": shift,
                "scale": scale,
                "kept": True,
                "params": json.dumps(params),
            }
            preds.append({"sample_id": sid, "classifier": clf, "correct": ok})
    return pd.DataFrame(list(samples.values())), pd.DataFrame(preds)


def test_accuracy_drop_failure_points_and_published_summary_by_hand():
    T, F = True, False
    correct = {
        # linear: size trajectory 1 fails from 0.5 on, trajectory 2 from 1.0; rotation never
        ("linear", "size", 1): [T, T, F, F, F],
        ("linear", "size", 2): [T, T, T, T, F],
        ("linear", "rotation", 1): [T, T, T, T, T],
        ("linear", "rotation", 2): [T, T, T, T, T],
        # cnn: size never fails, rotation trajectory 1 fails at 0.25
        ("cnn", "size", 1): [T, T, T, T, T],
        ("cnn", "size", 2): [T, T, T, T, T],
        ("cnn", "rotation", 1): [T, F, F, T, F],
        ("cnn", "rotation", 2): [T, T, T, T, T],
    }
    samples, preds = _tables(correct)
    ctx = AnalysisContext(_config(), samples, preds)
    result = run(ctx)
    table = result.tables["attributes"]
    assert list(table.columns[:5]) == CONTRACT_COLUMNS
    got = {(r.classifier, r.attribute, r.level): (r.accuracy, r.accuracy_drop) for r in table.itertuples()}
    assert got[("linear", "size", 0.5)] == pytest.approx((0.5, 0.5))
    assert got[("linear", "size", 1.0)] == pytest.approx((0.0, 1.0))
    assert got[("cnn", "rotation", 0.25)] == pytest.approx((0.5, 0.5))
    assert got[("cnn", "rotation", 0.7)] == pytest.approx((1.0, 0.0))
    # Physical values: from params where recorded, else the object_edit mapping (90 degrees at 1).
    size = table[(table["classifier"] == "linear") & (table["attribute"] == "size")].set_index("level")
    assert size.loc[0.7, "value"] == pytest.approx(0.08) and size.loc[0.7, "parameter"] == "target_share"
    rot = table[(table["classifier"] == "linear") & (table["attribute"] == "rotation")].set_index("level")
    assert rot.loc[0.5, "value"] == pytest.approx(45.0)  # no params: the default mapping (90 degrees at 1)
    # Published: rates 0.1, 0.08, 0.05 (levels 0.5, 0.7, 1); rotation has no published level (the
    # released direction set is random).
    pub = table[(table["classifier"] == "linear") & table["published"]]
    assert sorted(zip(pub["attribute"], pub["level"])) == [("size", 0.5), ("size", 0.7), ("size", 1.0)]
    summ = result.tables["attributes_summary"].set_index("classifier")
    # linear: drops 0.5, 0.5, 1.0 (size) -> mean 2/3 (positive = accuracy fell)
    assert summ.loc["linear", "mean_drop_published"] == pytest.approx(2 / 3)
    # cnn: size 0, 0, 0 -> 0 (its rotation drop 0.5 at level 1 is not a published level)
    assert summ.loc["cnn", "mean_drop_published"] == pytest.approx(0.0)
    assert summ.loc["cnn", "accuracy_original"] == pytest.approx(1.0)
    fps = result.tables["attributes_failure_points"]
    lin = fps[(fps["classifier"] == "linear") & (fps["attribute"] == "size")].set_index("level")
    assert lin["fp_count"].to_dict() == {0.0: 0, 0.25: 0, 0.5: 1, 0.7: 0, 1.0: 1}
    cnn = fps[(fps["classifier"] == "cnn") & (fps["attribute"] == "rotation")].set_index("level")
    assert cnn.loc[0.25, "fp_ratio_cumulative"] == pytest.approx(0.5)
    assert [r["classifier"] for r in result.json["summary"]] == ["linear", "cnn"]
    assert "Attribute edits" in result.title and "<table" in result.html


def test_random_sets_without_a_level_are_reported_apart_and_left_out_of_the_published_mean():
    samples, preds = _tables({
        ("linear", "size", 1): [True, True, False, False, False],
        ("linear", "size", 2): [True, True, True, True, False],
    })
    extra_s, extra_p = [], []
    for seed, ok in ((1, False), (2, True)):
        for scale, good in ((0.0, True), (1.0, ok)):  # released rp: the original and the set's image
            sid = sample_id("random_position", 3, seed, scale)
            extra_s.append({"sample_id": sid, "trajectory_id": trajectory_id("random_position", 3, seed),
                            "shift": "random_position", "scale": scale, "kept": True, "params": ""})
            extra_p.append({"sample_id": sid, "classifier": "linear", "correct": good})
    samples = pd.concat([samples, pd.DataFrame(extra_s)], ignore_index=True)
    preds = pd.concat([preds, pd.DataFrame(extra_p)], ignore_index=True)
    result = run(AnalysisContext(_config(), samples, preds))
    assert "random_position" not in set(result.tables["attributes"]["attribute"])  # not a level curve
    sets = result.tables["attributes_release_sets"]
    assert sets.to_dict("records") == [{"classifier": "linear", "attribute": "random_position", "accuracy_original": 1.0,
                                        "accuracy": 0.5, "accuracy_drop": 0.5, "n": 2}]
    summ = result.tables["attributes_summary"].set_index("classifier")
    assert summ.loc["linear", "mean_drop_published"] == pytest.approx(2 / 3)  # the size levels only
    assert summ.loc["linear", "drop_random_position"] == pytest.approx(0.5)


def test_background_published_level_is_lambda_20():
    table = pd.DataFrame(
        {
            "classifier": ["a"] * 4,
            "attribute": ["background_simplicity"] * 2 + ["background_complexity"] * 2,
            "level": [0.0, 1.0, 0.0, 1.0],
            "accuracy": [1.0, 0.8, 1.0, 0.6],
            "accuracy_drop": [0.0, 0.2, 0.0, 0.4],
            "published": [False, True, False, True],
        }
    )
    row = summary(table).iloc[0]
    assert row["mean_drop_published"] == pytest.approx(0.3) and row["n_published"] == 2
    samples, preds = _tables(
        {("a", "background_simplicity", 1): [True] * 5, ("a", "background_complexity", 1): [True, True, True, True, False]}
    )
    out = run(AnalysisContext(_config(), samples, preds)).tables["attributes"]
    # Without params (released images): level 1 is lambda +-20, a published level.
    assert set(out.loc[out["level"] == 1.0, "value"]) == {20.0, -20.0}
    assert out.loc[out["level"] == 1.0, "published"].all()
    # A build records lambda per image: the world's 200 at level 1 is not the published 20.
    samples["params"] = [json.dumps({"lambda": 200.0 * sc * (1 if sh.endswith("complexity") else -1)})
                         for sh, sc in zip(samples["shift"], samples["scale"])]
    out = run(AnalysisContext(_config(), samples, preds)).tables["attributes"]
    assert set(out.loc[out["level"] == 1.0, "value"]) == {200.0, -200.0}
    assert not out["published"].any()


def test_nothing_to_report_without_an_unedited_level():
    samples, preds = _tables({("a", "size", 1): [True] * 5})
    samples = samples[samples["scale"] != 0]
    result = run(AnalysisContext(_config(), samples, preds))
    assert "attributes" not in result.tables and "No attribute" in result.html
