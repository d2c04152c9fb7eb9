"""The released ImageNet-D layout evaluated end to end with configs/tiny.yaml (in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from pipeline import cli
from pipeline.sources import SourceError, detect_kind, open_source
from pipeline.labels import label_space

REPO = Path(__file__).resolve().parents[1]

# (kind, class folder, images): class folders named as in the release.
LAYOUT = [("background", "banana", 2), ("background", "backpack", 1), ("texture", "chair", 2), ("material", "t_shirt", 1)]


def make_release(root: Path) -> Path:
    for i, (kind, folder, n) in enumerate(LAYOUT):
        d = root / kind / folder
        d.mkdir(parents=True)
        for j in range(n):
            Image.new("RGB", (40, 40), (30 * i + 10 * j, 120, 200 - 20 * j)).save(d / f"{folder}_{j}.jpg", quality=90)
    (root / "questions").mkdir()
    (root / "questions" / "background.csv").write_text("image,question\n")
    return root


def test_release_layout_is_detected_and_indexed(tmp_path):
    root = make_release(tmp_path / "ImageNet-D")
    assert detect_kind(str(root)) == "imagenet_d"
    src = open_source(str(root), label_space("imagenet"))  # the layout brings its own label space
    assert src.labels == "imagenet_d"
    assert src.shifts == ["background", "material", "texture"]
    assert src.scales == [0.0]
    space = label_space("imagenet_d")
    ids = {r["trajectory_id"]: r["class_name"] for r in src.rows}
    assert ids["background/002/seed_0001"] == "banana"
    assert ids["material/089/seed_0000"] == "t shirt"
    assert ids["texture/016/seed_0001"] == space.name(16) == "chair"
    assert src.n_images == 6


def test_unknown_class_folder_is_named(tmp_path):
    root = make_release(tmp_path / "r")
    (root / "texture" / "goldfish").mkdir()
    Image.new("RGB", (8, 8)).save(root / "texture" / "goldfish" / "a.jpg")
    with pytest.raises(SourceError, match="texture/goldfish"):
        open_source(str(root), label_space("imagenet"))


def test_evaluate_release_with_tiny_config(tmp_path, capsys):
    from pipeline.demo.assets import ensure_tiny_assets

    ensure_tiny_assets()
    root = make_release(tmp_path / "ImageNet-D")
    out = tmp_path / "out"
    rc = cli.main(["evaluate", str(root), "--config", str(REPO / "configs" / "tiny.yaml"), "--output", str(out), "--runner", "local"])
    assert rc == 0
    cfg = json.loads((out / "config.json").read_text())["config"]
    assert cfg["benchmark"]["labels"] == "imagenet_d"
    assert cfg["benchmark"]["shifts"] == ["background", "material", "texture"]
    samples = pd.read_parquet(out / "samples")
    preds = pd.read_parquet(out / "predictions")
    assert len(samples) == 6
    assert set(preds["classifier"]) == {"tiny-resnet", "tiny-vit", "tiny-clip-zs"}
    # The multi-id rule: ImageNet classifiers' top-1 is an ImageNet-D class id or -1, and
    # correct == (top1 == class id); CLIP zero-shot predicts among the 113 classes.
    merged = preds.merge(samples[["sample_id", "class_id"]], on="sample_id")
    space = label_space("imagenet_d")
    assert merged["top1"].between(-1, len(space) - 1).all()
    assert (merged["correct"] == (merged["top1"] == merged["class_id"])).all()
    assert (merged.loc[merged["classifier"] == "tiny-clip-zs", "top1"] >= 0).all()
    acc = pd.read_csv(out / "report" / "accuracy.csv")
    assert set(acc["shift"]) == {"background", "material", "texture"}  # accuracy per nuisance kind
