"""The ImageNet-E world (`cnsbench demo --family imagenet_e`) builds and shows real effects."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
WORLD = REPO / "assets" / "world" / "world.json"


def test_world_config_validates_and_names_its_parts():
    from pipeline.assets import check_registry_keys, missing_assets
    from pipeline.config import ConfigError, load_config

    cfg = load_config(REPO / "configs" / "world_imagenet_e.yaml")
    (group,) = cfg.family_groups()
    assert group.kind == "object_edit" and list(group.scales) == [0.0, 0.25, 0.5, 0.7, 1.0]
    assert cfg.source.masks.kind == "ink_threshold"
    assert check_registry_keys(cfg) == []
    if WORLD.is_file():
        assert missing_assets(cfg) == []
    with pytest.raises(ConfigError, match="unknown attribute 'colour'"):
        load_config(REPO / "configs" / "world_imagenet_e.yaml", {"benchmark": {"shifts": ["size", "colour"]}})
    with pytest.raises(ConfigError, match="size.share_to"):
        load_config(REPO / "configs" / "world_imagenet_e.yaml", {"generator": {"options": {"size": {"share_to": 1.5}}}})
    bad = load_config(REPO / "configs" / "world_imagenet_e.yaml", {"source": {"masks": {"kind": "none"}}})
    assert any("needs object masks" in p for p in missing_assets(bad))
    bad = load_config(REPO / "configs" / "world_imagenet_e.yaml", {"source": {"masks": {"options": {"threshold": 2}}}})
    assert any(p.startswith("source.masks.options.threshold") for p in missing_assets(bad))
    release = load_config(REPO / "configs" / "world_imagenet_e.yaml", {"benchmark": {"shifts": ["size_full"]}})
    assert any("exist only as released ImageNet-E sets" in p for p in missing_assets(release))


@pytest.mark.skipif(not WORLD.is_file(), reason="assets/world not trained")
@pytest.mark.slow
def test_world_build_size_breaks_the_linear_classifier_and_failure_points_differ(tmp_path):
    from pipeline.cli import main

    out = tmp_path / "out"
    # No matplotlib figures: the tests read tables (the report tests draw them).
    assert main(["demo", "--family", "imagenet_e", "--output", str(out), "--runner", "local",
                 "--set", "aggregate.plots=false"]) == 0
    table = pd.read_csv(out / "report" / "attributes.csv")
    assert list(table.columns[:5]) == ["classifier", "attribute", "level", "accuracy", "accuracy_drop"]
    assert set(table["attribute"]) == {"size", "position", "rotation", "background_complexity", "background_simplicity"}
    acc = table.set_index(["classifier", "attribute", "level"])["accuracy"]
    # Every trajectory starts from a digit the linear classifier gets right ...
    assert acc[("linear", "size", 0.0)] == 1.0
    # ... and the strongest size level (object pixel rate 0.05) costs it at least 30 points.
    assert acc[("linear", "size", 0.0)] - acc[("linear", "size", 1.0)] >= 0.30
    drop = table.set_index(["classifier", "attribute", "level"])["accuracy_drop"]
    assert drop[("linear", "size", 1.0)] >= 0.30

    # Failure points differ between classifiers: the share of trajectories failed by the
    # last level is not the same for all of them on some attribute.
    fps = pd.read_csv(out / "report" / "attributes_failure_points.csv")
    last = fps[fps["level"] == 1.0].pivot_table(index="attribute", columns="classifier", values="fp_ratio_cumulative")
    assert (last.max(axis=1) - last.min(axis=1)).max() >= 0.25

    # Physical parameters per image: the size edit reached its target object pixel rate.
    samples = pd.concat(pd.read_parquet(p) for p in (out / "samples").glob("*.parquet"))
    size = samples[(samples["shift"] == "size") & (samples["scale"] > 0)]
    for raw in size["params"]:
        p = json.loads(raw)
        assert abs(p["share"] - p["target_share"]) <= 0.015
    # The paper's lambdas (+-20 at level 1), mapped by the calibrated gains, and still an accuracy drop.
    for shift, sign in (("background_complexity", 1.0), ("background_simplicity", -1.0)):
        lambdas = [json.loads(raw)["lambda"] for raw in samples.loc[(samples["shift"] == shift) & (samples["scale"] > 0), "params"]]
        assert max(abs(v) for v in lambdas) == 20.0 and all(v * sign > 0 for v in lambdas)
    complexity = table[(table["attribute"] == "background_complexity") & (table["level"] == 1.0)]
    assert complexity["accuracy_drop"].max() >= 0.10, complexity
    summary = pd.read_csv(out / "report" / "attributes_summary.csv")
    assert set(summary["classifier"]) == {"linear", "cnn", "vit", "clip-zs"}
    assert "Attribute edits (ImageNet-E)" in (out / "report" / "index.html").read_text()
