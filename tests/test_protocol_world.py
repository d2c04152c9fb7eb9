"""On the demo world: ``cns`` and ``model`` preprocessing feed a classifier different inputs,
and the resolved config written next to the build records which one each classifier ran."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
needs_world = pytest.mark.skipif(not (REPO / "assets" / "world" / "world.json").is_file(), reason="assets/world not trained")


def _world_config(tmp_path: Path) -> Path:
    raw = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    text = yaml.safe_dump(raw).replace("../assets/", str(REPO / "assets") + "/")
    raw = yaml.safe_load(text)
    cnn = next(c for c in raw["classifiers"] if c["name"] == "cnn")
    own, cns = copy.deepcopy(cnn), copy.deepcopy(cnn)
    own.update(name="cnn-model", preprocess="model")
    cns.update(name="cnn-cns", preprocess="cns")
    raw["classifiers"] = [own, cns]
    raw["benchmark"].update(classes=["two", "seven"], seeds=[1], shifts=["blur"])
    raw["filter"]["enabled"] = False
    path = tmp_path / "world_protocol.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@needs_world
def test_cns_and_model_preprocessing_give_different_inputs(tmp_path):
    import torch

    from pipeline.config import load_config
    from pipeline.demo.world_data import load_digits_tensor, to_pil
    from pipeline.models.classifiers import TimmClassifier

    cfg = load_config(_world_config(tmp_path))
    own, cns = (TimmClassifier(spec, "cpu", cfg.benchmark.label_space) for spec in cfg.classifiers)
    images = to_pil(load_digits_tensor()[0][:4])
    a, b = own.inputs(images), cns.inputs(images)
    assert a.shape == (4, 3, 32, 32)  # the world CNN's own data config: 32 px, mean/std 0.5
    assert b.shape == (4, 3, 224, 224)  # Resize(256) bicubic, CenterCrop(224), ImageNet mean/std
    assert not torch.allclose(own.predict(images), cns.predict(images))


@needs_world
@pytest.mark.slow
def test_world_build_records_the_preprocessing_each_classifier_ran(tmp_path):
    import pandas as pd

    from pipeline.build import build
    from pipeline.config import load_config

    cfg = load_config(_world_config(tmp_path))
    out = tmp_path / "out"
    build(cfg, str(out), runner="local", echo=lambda *_: None)

    resolved = yaml.safe_load((out / "config.yaml").read_text())
    assert resolved["protocol"] == "custom"
    assert {c["name"]: c["preprocess"] for c in resolved["classifiers"]} == {"cnn-model": "model", "cnn-cns": "cns"}

    preds = pd.concat(pd.read_parquet(p) for p in (out / "predictions").glob("*.parquet"))
    p_true = preds.pivot(index="sample_id", columns="classifier", values="p_true")
    assert len(p_true) == 12  # 2 classes x 1 seed x 1 shift x 6 scales
    # Same weights, different inputs: the probabilities differ on every image.
    assert (p_true["cnn-model"] - p_true["cnn-cns"]).abs().min() > 1e-6
