"""ImageNet-D on the miniature world: the hard set mined by three surrogates transfers to the
held-out classifier, and its export is evaluated again by ``cnsbench evaluate``.

One in-process build of ``configs/world_imagenet_d.yaml`` (what ``cnsbench demo --family
imagenet_d`` builds).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from pipeline import cli
REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "world_imagenet_d.yaml"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world_imagenet_d") / "out"
    # No matplotlib figures (the tests read tables; hard_set.png is drawn either way): they
    # cost the report about a third of its time, and the report tests draw them.
    assert cli.main(["build", str(CONFIG), "--output", str(out), "--runner", "local", "--set", "aggregate.plots=false"]) == 0
    return out


def test_contract_files(built):
    report = built / "report"
    hard = pd.read_parquet(report / "hard_set.parquet")
    assert len(hard) >= 10
    assert hard["sample_id"].str.endswith("_scale_1000").all()  # nuisance images, never the plain reference
    assert (hard["n_wrong"] >= 2).all()
    transfer = pd.read_csv(report / "transfer.csv")
    assert set(transfer["role"]) == {"held_out", "leave_one_out"}
    assert (report / "shared_failures.csv").is_file()
    assert list((report / "hard_set").glob("*.tar"))
    assert (report / "hard_set.png").is_file() and 'src="hard_set.png"' in (report / "index.html").read_text()
    metrics = json.loads((report / "metrics.json").read_text())["analyses"]["hard_mining"]
    assert metrics["n_hard"] == len(hard) and metrics["surrogates"] == ["linear", "cnn", "clip-zs"]


def test_hard_set_transfers_to_the_held_out_classifier(built):
    t = pd.read_csv(built / "report" / "transfer.csv")
    held = t[t["role"] == "held_out"].set_index("classifier")
    assert list(held.index) == ["vit", "vlm"]  # the ViT and the vision-language model are held out
    vit = held.loc["vit"]
    # The real effect: at least 15 points below same-size random subsets.
    assert vit["acc_hard"] <= vit["acc_random_mean"] - 0.15, vit.to_dict()
    assert abs(vit["acc_random_mean"] - vit["acc_all"]) < 0.05


def test_rotation_produces_most_shared_failures(built):
    shared = pd.read_csv(built / "report" / "shared_failures.csv")
    nuis = shared[shared["level"] == "nuisance"]
    assert nuis.iloc[0]["shift"] == "rotation" and nuis.iloc[0]["kind"] == "pose"
    samples = pd.read_parquet(built / "samples")
    params = samples.loc[samples["scale"] == 1, "params"].map(json.loads)
    assert params.map(lambda p: p["prompt"].endswith(", in " + p["nuisance"])).all()


def test_export_is_evaluated_again(built, tmp_path):
    """`cnsbench evaluate report/hard_set` reproduces the held-out accuracy on the hard set."""
    out = tmp_path / "eval"
    rc = cli.main([
        "evaluate", str(built / "report" / "hard_set"), "--config", str(CONFIG), "--output", str(out),
        "--classifiers", "vit", "--runner", "local",
    ])
    assert rc == 0
    preds = pd.read_parquet(out / "predictions")
    hard = pd.read_parquet(built / "report" / "hard_set.parquet")
    assert len(preds) == len(hard)
    t = pd.read_csv(built / "report" / "transfer.csv").set_index("classifier")
    assert preds["correct"].mean() == pytest.approx(t.loc["vit", "acc_hard"])


def test_the_vlm_is_a_classifier_of_the_report(built):
    """The world's VLM (its CLIP tower + a small trained Llama) asked ImageNet-D's two-choice question."""
    report = built / "report"
    acc = pd.read_csv(report / "accuracy.csv")
    assert "vlm" in set(pd.read_csv(report / "failure_points.csv")["classifier"])
    clean = acc[(acc["classifier"] == "vlm") & (acc["scale"] == 0) & acc["shift"].isin(["thick_strokes", "rotation", "blur"])]
    assert len(clean) == 3 and clean["accuracy"].mean() > 0.5  # above chance (0.5): its answers mean something
    answers = pd.read_csv(report / "vlm_answers.csv")
    assert set(answers["shift"]) == {"thick_strokes", "rotation", "blur"} and set(answers["scale"]) == {0.0, 1.0}
    assert (answers["n_true"] + answers["n_false"] + answers["n_excluded"] == answers["n"]).all()
    assert (answers["n"] == 60).all()
    preds = pd.read_parquet(built / "predictions")
    vlm = preds[preds["classifier"] == "vlm"]
    assert vlm["answer"].notna().all() and vlm["excluded"].notna().all()
    assert (vlm["correct"].isna() == vlm["excluded"]).all()
