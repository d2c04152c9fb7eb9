"""Cards of the world's classifiers over the five world benchmarks, end to end (slow).

One suite of small world builds, made once for the module: the demo world of the shared
``demo_world`` build (copied: the cards add models to it) and the other four families at
a few classes and seeds, without figures.  The tests check the card's contract, that every
number on a card is the same number of the benchmark's own report, that a second card run
touches no model, that an interrupted card resumes, that the exported linear classifier
added to the committed outputs (only it runs) scores what its TorchScript form scores, and
the leaderboard of the cards.
"""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
WORLD = REPO / "assets" / "world"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (WORLD / "world.json").is_file(), reason="assets/world not trained"),
]

QUICK = ["aggregate.plots=false", "aggregate.strips.count=0", "benchmark.seeds=[1, 2]", "generator.steps=10"]
SMALL = {
    "corruptions": ("world_corruptions.yaml", QUICK + [
        "benchmark.classes=[two, seven]", "families[0].shifts=[gaussian_noise, fog, contrast]",
        "families[0].scales=[0, 1, 2, 3, 4, 5]"]),
    "imagenet_d": ("world_imagenet_d.yaml", QUICK + ["benchmark.classes=[zero, one, two, three]"]),
    "ximagenet": ("world_ximagenet.yaml", QUICK + ["benchmark.classes=[zero, one, two]"]),
    "imagenet_e": ("world_imagenet_e.yaml", QUICK + ["benchmark.classes=[two, three]"]),
}


def _suite_text(name: str, outputs: Path, cns_output: Path, families=("corruptions", "imagenet_d", "ximagenet", "imagenet_e")) -> str:
    lines = [f"suite: {name}", "baseline: linear", f"outputs: {outputs}", "benchmarks:",
             f"  - {{name: cns, family: cns, config: {REPO}/configs/demo.yaml, output: {cns_output}}}"]
    for fam in families:
        config, sets = SMALL[fam]
        lines.append(f"  - {{name: {fam}, family: {fam}, config: {REPO}/configs/{config}, sets: {json.dumps(sets)}}}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def world(demo_world, tmp_path_factory):
    root = tmp_path_factory.mktemp("card-world")
    cns = root / "cns"
    shutil.copytree(demo_world, cns)
    suite = root / "suite.yaml"
    suite.write_text(_suite_text("world-small", root / "outputs", cns))
    return {"root": root, "suite": suite, "outputs": {"cns": cns, **{f: root / "outputs" / f for f in SMALL}}}


def _card(world, model: str, name: str, *extra: str) -> Path:
    from pipeline.cli import main

    out = world["root"] / "cards" / name
    assert main(["card", model, "--suite", str(world["suite"]), "--output", str(out), "--runner", "local", *extra]) == 0
    return out


@pytest.fixture(scope="module")
def linear_card(world):
    return _card(world, "linear", "linear")  # builds the four small worlds


@pytest.fixture(scope="module")
def cnn_card(world, linear_card):
    return _card(world, "cnn", "cnn")


def _entries(card: Path) -> dict[str, dict]:
    return {b["benchmark"]: b for b in json.loads((card / "card.json").read_text())["benchmarks"]}


def test_the_card_has_one_entry_per_benchmark(linear_card, world):
    card = json.loads((linear_card / "card.json").read_text())
    assert [b["benchmark"] for b in card["benchmarks"]] == ["cns", "corruptions", "imagenet_d", "ximagenet", "imagenet_e"]
    for b in card["benchmarks"]:
        assert {"metric", "value", "ci_low", "ci_high", "protocol", "config_hash"} <= set(b)
        assert b["protocol"] == "custom" and len(b["config_hash"]) == 64
        stored = json.loads((Path(b["output"]) / "config.json").read_text())
        assert b["config_hash"] == stored["config_hash"]
        if b["value"] is not None and b["metric"] != "mce":  # linear is the mCE baseline: 1 on every resample
            assert b["ci_low"] <= b["value"] <= b["ci_high"], b
    model = card["model"]
    import hashlib

    assert model["name"] == "linear" and model["weights_sha256"] == hashlib.sha256(
        (WORLD / "classifiers" / "linear.torchscript.pt").read_bytes()).hexdigest()
    assert card["suite"]["name"] == "world-small" and len(card["suite"]["hash"]) == 64
    page = (linear_card / "card.html").read_text()
    assert "Headline metrics" in page
    mce = next(b for b in card["benchmarks"] if b["benchmark"] == "corruptions")
    assert mce["ci_low"] == pytest.approx(mce["ci_high"], rel=1e-12) and "zero width*" in page  # its own baseline: shown as no spread
    # 3 of ImageNet-C's 15 corruptions: no RobustBench entry, and the page says why
    assert not (linear_card / "robustbench.json").exists() and "3 of the 15 ImageNet-C corruptions" in page


def _report(world, bench: str, name: str) -> pd.DataFrame:
    return pd.read_csv(world["outputs"][bench] / "report" / name)


def _same(card_value, report_value) -> bool:
    """The card's number is the report's (an undefined one, NaN in a report table, is null on the card)."""
    if pd.isna(report_value):
        return card_value is None
    return card_value == pytest.approx(float(report_value), rel=0, abs=1e-12)


def test_every_number_on_a_card_is_its_reports(cnn_card, world):
    """Each value on the cnn card equals the same cell of that benchmark's report tables."""
    e = _entries(cnn_card)
    # CNS: the summary's drop at 2.5 with the report's own bootstrap interval, the failure-point distribution
    summ = _report(world, "cns", "summary.csv").set_index("classifier").loc["cnn"]
    cns = e["cns"]
    assert _same(cns["value"], summ["acc_drop_2500"])
    assert _same(cns["ci_low"], summ["acc_drop_2500_ci_low"]) and _same(cns["ci_high"], summ["acc_drop_2500_ci_high"])
    fpt = _report(world, "cns", "failure_points.csv").query("classifier == 'cnn' and shift == 'all'").set_index("scale")
    fps = [d for d in cns["details"] if d["metric"] == "fp_ratio"]
    assert len(fps) == 6 and all(_same(d["value"], fpt.at[d["key"]["scale"], "fp_ratio"]) for d in fps)
    assert all(_same(d["ci_low"], fpt.at[d["key"]["scale"], "fp_ratio_ci_low"]) for d in fps)
    for d in cns["details"]:
        if d["metric"] in ("fp_avg", "margin_fp_avg"):
            assert _same(d["value"], summ[d["metric"]])
    # corruptions: CE and mCE normalised by the suite's baseline, as corruption_error.csv
    ce = _report(world, "corruptions", "corruption_error.csv").query("classifier == 'cnn'").set_index("corruption")
    cor = e["corruptions"]
    assert cor["metric"] == "mce" and _same(cor["value"], ce.at["mean", "ce_baseline"])
    per = [d for d in cor["details"] if d["metric"] == "ce"]
    assert {d["key"]["corruption"] for d in per} == {"gaussian_noise", "fog", "contrast"}
    assert all(_same(d["value"], ce.at[d["key"]["corruption"], "ce_baseline"]) for d in per)
    rel = next(d for d in cor["details"] if d["metric"] == "relative_mce")
    assert _same(rel["value"], ce.at["mean", "relative_ce_baseline"])
    # ImageNet-D: accuracy per nuisance at scale 1 (accuracy.csv), and their mean
    acc = _report(world, "imagenet_d", "accuracy.csv").query("classifier == 'cnn' and scale == 1.0").set_index("shift")
    d_entry = e["imagenet_d"]
    assert all(_same(d["value"], acc.at[d["key"]["nuisance"], "accuracy"]) for d in d_entry["details"])
    assert _same(d_entry["value"], acc["accuracy"].mean())
    assert all(_same(d["ci_low"], acc.at[d["key"]["nuisance"], "accuracy_ci_low"]) for d in d_entry["details"])
    # XIMAGENET-12: the robustness score and its C(i), C'(i)
    score = _report(world, "ximagenet", "robustness_score.csv").set_index("classifier").loc["cnn"]
    x = e["ximagenet"]
    assert _same(x["value"], score["score"])
    sa = _report(world, "ximagenet", "scenario_accuracy.csv").query("classifier == 'cnn'").set_index("scenario")
    for d in x["details"]:
        if d["metric"] == "accuracy":
            assert _same(d["value"], sa.at[d["key"]["scenario"], "C"])
        elif d["metric"] == "accuracy_probe":
            assert _same(d["value"], sa.at[d["key"]["scenario"], "C_prime"])
        else:
            assert _same(d["value"], score["mu"])
    # ImageNet-E: the mean drop at the published levels and the drop per attribute and level
    ie = e["imagenet_e"]
    summary = _report(world, "imagenet_e", "attributes_summary.csv").set_index("classifier").loc["cnn"]
    assert ie["metric"] == "mean_drop_published" and _same(ie["value"], summary["mean_drop_published"])
    attrs = _report(world, "imagenet_e", "attributes.csv").query("classifier == 'cnn'").set_index(["attribute", "level"])
    drops = [d for d in ie["details"] if d["metric"] == "accuracy_drop"]
    assert len(drops) == 20
    assert all(_same(d["value"], attrs.at[(d["key"]["attribute"], d["key"]["level"]), "accuracy_drop"]) for d in drops)


def test_a_second_identical_card_loads_no_model(cnn_card, world, monkeypatch):
    from pipeline.cli import main

    def refuse(*args, **kwargs):
        raise AssertionError("a model was set up on a complete card")

    monkeypatch.setattr("pipeline.models.classifiers.Classifier.__init__", refuse)
    monkeypatch.setattr("pipeline.stages.classify.ClassifyStage.setup", refuse)
    monkeypatch.setattr(importlib.import_module("pipeline.build"), "build", refuse)  # the module (pipeline.build is the API's function)
    before = (cnn_card / "card.json").read_bytes()
    assert main(["card", "cnn", "--suite", str(world["suite"]), "--output", str(cnn_card), "--runner", "local"]) == 0
    assert (cnn_card / "card.json").read_bytes() == before


def test_an_interrupted_card_resumes(linear_card, world, monkeypatch, capsys):
    from pipeline.card import make
    from pipeline.cli import main

    real = make.compute_entry
    calls = []

    def stop_at_third(p, suite, echo):
        calls.append(p.benchmark.name)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(p, suite, echo)

    monkeypatch.setattr(make, "compute_entry", stop_at_third)
    out = world["root"] / "cards" / "vit"
    assert main(["card", "vit", "--suite", str(world["suite"]), "--output", str(out), "--runner", "local"]) == 130
    assert sorted(p.stem for p in (out / "benchmarks").glob("*.json")) == ["cns", "corruptions"]
    assert not (out / "card.json").exists()
    monkeypatch.setattr(make, "compute_entry", real)
    capsys.readouterr()
    assert main(["card", "vit", "--suite", str(world["suite"]), "--output", str(out), "--runner", "local"]) == 0
    said = capsys.readouterr().out
    assert "cns: up to date" in said and "corruptions: up to date" in said and "imagenet_e: up to date" not in said
    assert len(_entries(out)) == 5


def test_the_exported_linear_added_to_the_outputs_scores_as_its_torchscript_form(linear_card, world, monkeypatch):
    """Only the new model runs, on the committed images; its numbers are the TorchScript form's."""
    from pipeline.stages.classify import ClassifyStage

    made = []
    real = ClassifyStage.setup

    def spy(self):
        real(self)
        made.extend(c.name for c in self.classifiers)

    monkeypatch.setattr(ClassifyStage, "setup", spy)
    n_images = {b: len(list((world["outputs"][b] / "images").glob("*.tar"))) for b in world["outputs"]}
    card = _card(world, "linear-softmax-regression", "exported", "--model-kind", "exported",
                 "--checkpoint", str(WORLD / "classifiers" / "linear.pt2"), "--name", "linear-exported")
    assert made and set(made) == {"linear-exported"}, made  # the classify stages ran the card's model alone
    assert {b: len(list((world["outputs"][b] / "images").glob("*.tar"))) for b in world["outputs"]} == n_images
    exported, scripted = _entries(card), _entries(linear_card)
    for name, entry in exported.items():
        if name == "corruptions":  # normalised by the linear classifier: its twin scores 1
            assert entry["value"] == 1.0
            continue
        assert entry["value"] == scripted[name]["value"], name
        assert [d["value"] for d in entry["details"]] == [d["value"] for d in scripted[name]["details"]], name
    for bench, out in world["outputs"].items():
        cfg = json.loads((out / "config.json").read_text())["config"]
        assert "linear-exported" in [c["name"] for c in cfg["classifiers"]]
    summ = pd.read_csv(world["outputs"]["cns"] / "report" / "summary.csv").set_index("classifier")
    assert np.isclose(summ.at["linear-exported", "acc_drop_2500"], summ.at["linear", "acc_drop_2500"])


def test_leaderboard_of_the_cards_and_a_card_of_another_suite(linear_card, cnn_card, world, capsys):
    from pipeline.cli import main

    vit = _card(world, "vit", "vit")  # complete already when the interrupted-card test ran first
    lb = world["root"] / "lb"
    assert main(["leaderboard", str(linear_card), str(cnn_card), str(vit), "--output", str(lb)]) == 0
    table = pd.read_csv(lb / "leaderboard.csv")
    assert len(table) == 15 and set(table["model"]) == {"linear", "cnn", "vit"}
    assert table.groupby("benchmark")["rank"].min().eq(1).all()
    corr = pd.read_csv(lb / "correlations.csv")
    assert len(corr) == 10 and corr["spearman_rho"].between(-1, 1).all()
    assert "Leaderboard" in (lb / "index.html").read_text()
    # the same cns output, another suite
    other = world["root"] / "other.yaml"
    other.write_text(_suite_text("other", world["root"] / "outputs", world["outputs"]["cns"], families=()))
    out = world["root"] / "cards" / "other"
    assert main(["card", "linear", "--suite", str(other), "--output", str(out), "--runner", "local"]) == 0
    capsys.readouterr()
    assert main(["leaderboard", str(linear_card), str(out), "--output", str(world["root"] / "lb2")]) == 2
    err = capsys.readouterr().err
    assert "suite.hash" in err and "suite.name" in err and "benchmarks" in err
