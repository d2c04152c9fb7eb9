"""An adaptive build's output with the rest of the pipeline (docs/adaptive.md): its card entry
carries the weighted numbers and their intervals, ``refine`` leaves its report weighted, a
classifier added later gets weighted estimates of its own, and the default runner (Ray)
builds what the local runner builds.

The output: the tiny config over seeds 1..4 with a target it cannot meet, a pilot of 2 seeds
per (class, shift) and one round of 3 trajectories until the cap of 66 images, so the four
strata have unequal seeds and weighted numbers differ from pooled ones.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from buildproc import build_here, shared_build, tiny_config

from pipeline.io.digest import output_digest
from pipeline.io.store import OutputStore

pytestmark = pytest.mark.usefixtures("tiny_assets_one_thread")

PRE = {"resize": 64, "crop": 64, "interpolation": "bilinear", "mean": [0.5] * 3, "std": [0.5] * 3}
TWO = {0: 1, 1: 22}  # the model's two outputs: goldfish, bald eagle


def unequal(raw: dict) -> None:
    raw["benchmark"]["seeds"] = "1..4"
    raw.setdefault("aggregate", {})["bootstrap"] = {"resamples": 0}
    raw["sampling"] = {"target": 0.01, "max_images": 66, "pilot": 2, "round_size": 3}
    raw["protocol"] = "custom"  # each model's own preprocessing (the brightness model's 64 px)


def unequal_tiny(directory: Path) -> Path:
    return tiny_config(directory, unequal, name="adaptive-unequal.yaml")


@pytest.fixture(scope="module")
def adaptive_out(tmp_path_factory) -> tuple[Path, Path]:
    return shared_build(tmp_path_factory, "adaptive_unequal", unequal_tiny)


def copied(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def metrics(out: Path) -> dict:
    return json.loads((out / "report" / "metrics.json").read_text())


def stratified_by_hand(out: Path, classifier: str) -> pd.DataFrame:
    """The uniform design's quantity with equal (class, shift) weights, computed directly: per
    stratum the mean over its trajectories, then the mean over the shift's classes; columns
    ``shift, scale, accuracy, accuracy_drop`` (every committed trajectory is evaluated here)."""
    from pipeline.io.tables import load_predictions, load_samples

    store = OutputStore(str(out))
    s, p = load_samples(store), load_predictions(store)
    rows = s.merge(p[p["classifier"] == classifier][["sample_id", "correct"]], on="sample_id")
    rows["correct"] = rows["correct"].astype(float)
    zero = rows[rows["scale"] == 0].set_index("trajectory_id")["correct"]
    rows["drop"] = rows["trajectory_id"].map(zero) - rows["correct"]
    strata = rows.groupby(["shift", "class_id", "scale"])[["correct", "drop"]].mean()
    out_ = strata.groupby(["shift", "scale"]).mean().reset_index()
    return out_.rename(columns={"correct": "accuracy", "drop": "accuracy_drop"})


def test_the_strata_have_unequal_seeds(adaptive_out):
    _, out = adaptive_out
    seeds = [r["seeds"] for r in metrics(out)["sampling"]["seeds_per_stratum"]]
    assert sum(seeds) == 11 and len(set(seeds)) > 1, seeds


def TwoWay() -> torch.nn.Module:  # noqa: N802 (a model's name, as a class's would be)
    """Goldfish or bald eagle from a random convolution: right on some images, wrong on others."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=4), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 16 * 16, 2))


# --------------------------------------------------------------------------- cards
def test_a_card_entry_carries_the_weighted_numbers_and_their_intervals(adaptive_out, tmp_path):
    from cnsbench import card

    _, built = adaptive_out
    out = copied(built, tmp_path / "out")
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"suite: one\nbenchmarks:\n  - {{name: cns, family: cns, output: {out}, protocol: custom}}\n")
    card(TwoWay(), str(suite), name="later", output=str(tmp_path / "card"), preprocess=PRE, label_map=TWO, echo=lambda m: None)
    (entry,) = json.loads((tmp_path / "card" / "card.json").read_text())["benchmarks"]
    out = tmp_path / "card" / "outputs" / "cns"  # the benchmark is only read: the card's own evaluation of it
    assert entry["output"] == str(out)
    report = metrics(out)
    summary = next(r for r in report["summary"] if r["classifier"] == "later")
    # The headline: the report's weighted drop at the top scale, mean over shifts, with its interval.
    assert entry["value"] == pytest.approx(summary["acc_drop_2500"])
    assert entry["ci_low"] == pytest.approx(summary["acc_drop_2500_ci_low"])
    assert entry["ci_high"] == pytest.approx(summary["acc_drop_2500_ci_high"])
    assert entry["ci_low"] < entry["value"] < entry["ci_high"]
    assert entry["ci"]["method"] == "stratified" and entry["ci"]["level"] == 0.95
    by_hand = stratified_by_hand(out, "later")
    top = by_hand[by_hand["scale"] == 2.5]
    assert entry["value"] == pytest.approx(top["accuracy_drop"].mean())
    # Each shift's drop: the report's weighted row and interval, the design's quantity.
    rows = {(r["shift"], r["scale"]): r for r in report["accuracy"] if r["classifier"] == "later"}
    drops = [d for d in entry["details"] if d["metric"] == "accuracy_drop"]
    assert len(drops) == 2
    for d in drops:
        r = rows[(d["key"]["shift"], d["key"]["scale"])]
        assert (d["value"], d["ci_low"], d["ci_high"]) == pytest.approx(
            (r["accuracy_drop"], r["accuracy_drop_ci_low"], r["accuracy_drop_ci_high"]))
        assert d["value"] == pytest.approx(float(top.loc[top["shift"] == d["key"]["shift"], "accuracy_drop"].iloc[0]))
    clean = next(d for d in entry["details"] if d["metric"] == "accuracy_clean")
    assert clean["value"] == pytest.approx(summary["accuracy_scale0"])
    assert clean["ci_low"] <= clean["value"] <= clean["ci_high"]
    fp = next(d for d in entry["details"] if d["metric"] == "fp_avg")
    assert (fp["value"], fp["ci_low"], fp["ci_high"]) == pytest.approx(
        (summary["fp_avg"], summary["fp_avg_ci_low"], summary["fp_avg_ci_high"]), nan_ok=True)
    # The unaggregated accuracy per (shift, scale): the weighted one, as the report's accuracy.csv.
    for r in entry["accuracy"]:
        assert r["accuracy"] == pytest.approx(rows[(r["shift"], r["scale"])]["accuracy"])
    # The failure-point distribution over every shift: weighted too, its shares summing to the
    # weighted share of trajectories that fail.
    ratios = [d for d in entry["details"] if d["metric"] == "fp_ratio"]
    assert len(ratios) == 6 and all(d["ci_low"] <= d["value"] <= d["ci_high"] for d in ratios if d["value"] is not None)
    assert "stratified estimates" in (tmp_path / "card" / "card.html").read_text()


# --------------------------------------------------------------------------- refine
def test_a_classifier_added_to_the_config_leaves_the_rounds_and_refine_the_report_weighted(adaptive_out, tmp_path):
    """The brightness classifier of tests/test_refine.py added by a build of the config naming
    it: it is classified on the committed images only (the rounds, steered by the classifiers
    the pilot was made with, stay as they were); then one round of ``refine`` on it."""
    from test_refine import GOLDFISH, bright_model, tables

    from pipeline.analyses.refined import read_refined
    from pipeline.cli import main

    _, built = adaptive_out
    out = copied(built, tmp_path / "out")
    before = metrics(out)
    samples, light = tables(out)
    samples["b"] = samples["sample_id"].map(light)
    gap, threshold, sign = max(
        (s * (t["b"].iloc[0] - far), (t["b"].iloc[0] + far) / 2, s)
        for _, t in samples[samples["class_id"] == GOLDFISH].sort_values("scale").groupby("trajectory_id")
        for s, far in ((1.0, t["b"].iloc[1:].min()), (-1.0, t["b"].iloc[1:].max())))
    assert gap > 0
    bright_model(tmp_path / "bright.pt", threshold, sign)

    def with_bright(raw: dict) -> None:
        unequal(raw)
        raw["classifiers"].append({"name": "bright", "kind": "torchscript", "model": "brightness",
                                   "checkpoint": str(tmp_path / "bright.pt")})

    assert build_here(tiny_config(tmp_path, with_bright, name="bright.yaml"), out) == 0
    added = metrics(out)
    design = {k: v for k, v in added["sampling"].items() if k != "failure_point_mean"}
    assert design == {k: v for k, v in before["sampling"].items() if k != "failure_point_mean"}
    assert [r for r in added["sampling"]["failure_point_mean"] if r["classifier"] != "bright"] == \
        before["sampling"]["failure_point_mean"]
    from pipeline.io.tables import load_samples

    assert len(load_samples(OutputStore(str(out)))) == 66  # no trajectory beyond the design
    assert [r for r in added["accuracy"] if r["classifier"] != "bright"] == before["accuracy"]
    rows = [r for r in added["accuracy"] if r["classifier"] == "bright"]
    assert len(rows) == 12 and all(r["accuracy_ci_low"] <= r["accuracy"] <= r["accuracy_ci_high"] for r in rows)

    assert main(["refine", str(out), "--classifier", "bright", "--rounds", "1", "--runner", "local"]) == 0
    refined = read_refined(OutputStore(str(out)))
    assert (refined["status"] == "refined").any()
    after = metrics(out)
    assert after["sampling"] == added["sampling"]
    assert after["accuracy"] == added["accuracy"] and after["summary"] == added["summary"]
    assert (out / "report" / "failure_points_refined.csv").is_file()


# --------------------------------------------------------------------------- a classifier added later
def test_a_classifier_added_later_gets_weighted_estimates_with_its_own_intervals(adaptive_out, tmp_path):
    from cnsbench import evaluate
    from pipeline.api.models import classifier_metrics

    _, built = adaptive_out
    out = copied(built, tmp_path / "out")
    before = metrics(out)
    evaluate(TwoWay(), out, output=out, in_place=True, name="later", preprocess=PRE, label_map=TWO, echo=lambda m: None)
    got = classifier_metrics(str(out), "later")
    after = metrics(out)
    assert after["sampling"]["seeds_per_stratum"] == before["sampling"]["seeds_per_stratum"]
    # The classifiers already there keep their numbers.
    old = [r for r in after["accuracy"] if r["classifier"] != "later"]
    assert old == before["accuracy"]
    by_hand = stratified_by_hand(out, "later").set_index(["shift", "scale"])
    assert len(got["accuracy"]) == len(by_hand) == 12
    halves = set()
    for r in got["accuracy"]:
        assert r["accuracy"] == pytest.approx(by_hand.at[(r["shift"], r["scale"]), "accuracy"])
        assert r["accuracy_drop"] == pytest.approx(by_hand.at[(r["shift"], r["scale"]), "accuracy_drop"])
        assert r["accuracy_ci_low"] <= r["accuracy"] <= r["accuracy_ci_high"]
        halves.add(round(r["accuracy_half_width"], 9))
    assert len(halves) > 1  # its own intervals, from its own variance per stratum
    (summary,) = got["summary"]
    assert summary["acc_drop_2500_ci_low"] <= summary["acc_drop_2500"] <= summary["acc_drop_2500_ci_high"]


# --------------------------------------------------------------------------- the Ray runner
@pytest.mark.slow
def test_the_default_runner_builds_what_the_local_runner_builds(adaptive_out, ray_session, tmp_path):
    from pipeline.cli import main

    cfg, built = adaptive_out
    assert main(["build", str(cfg), "--output", str(tmp_path / "ray")]) == 0
    assert metrics(tmp_path / "ray")["sampling"] == metrics(built)["sampling"]
    assert output_digest(str(tmp_path / "ray")) == output_digest(str(built))
