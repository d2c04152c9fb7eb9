"""The miniature trained world (``assets/world``, ``configs/demo.yaml``, ``docs/world.md``):
the embedded default that ``cnsbench demo`` builds.

Fast tests: the ``torchscript`` classifier kind, the world's shift operations, and that
``configs/demo.yaml`` agrees with the shipped assets and the training script's settings.

Slow tests (``-m slow``): the session's one ``cnsbench demo`` (configs/demo.yaml, in process; conftest),
then the effects the world exists to show, read from the output's Parquet tables
and report CSVs: accuracy falls with the shift scale, classifiers fail at different
points, and the out-of-class filter removes more images at high scales than at low ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from pipeline.cli import REPO_ROOT, main
from pipeline.config import ClassifierSpec, load_config
from pipeline.demo import world_data as W
from pipeline.demo import world_models as M
from pipeline.labels import label_space

WORLD_CONFIG = REPO_ROOT / "configs" / "demo.yaml"
WORLD_ASSETS = REPO_ROOT / "assets" / "world"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


# --------------------------------------------------------------------------- torchscript kind
class _Lin(torch.nn.Module):
    def __init__(self, k: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3 * 8 * 8, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def _scripted(tmp_path: Path, k: int = 10, preprocess: dict | None = None) -> str:
    torch.manual_seed(0)
    path = tmp_path / f"m{k}.pt"
    extra = {"preprocess.json": json.dumps(preprocess)} if preprocess else {}
    torch.jit.save(torch.jit.script(_Lin(k)), str(path), _extra_files=extra)
    return str(path)


def _images(n: int = 3, size: int = 20):
    from PIL import Image

    return [Image.new("RGB", (size, size), (40 * i, 0, 255 - 40 * i)) for i in range(n)]


def test_torchscript_classifier_matches_manual_preprocessing(tmp_path):
    from pipeline.registry import CLASSIFIERS

    pre = {"input_size": [3, 8, 8], "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "interpolation": "bilinear"}
    path = _scripted(tmp_path, 10, pre)
    spec = ClassifierSpec(name="lin", kind="torchscript", model="linear", checkpoint=path)
    labels = label_space(list(W.DIGIT_NAMES))
    clf = CLASSIFIERS.get("torchscript")(spec, "cpu", labels)
    assert clf.out_to_label == list(range(10))
    imgs = _images()
    logits = clf.predict(imgs)
    assert logits.shape == (3, 10)
    # Same numbers by hand: resize to 8x8, [0, 1], normalise, forward.
    import numpy as np

    x = torch.stack([
        torch.from_numpy(np.asarray(im.resize((8, 8), resample=2), dtype=np.float32) / 255).permute(2, 0, 1)
        for im in imgs
    ])
    model = torch.jit.load(path)
    expected = model((x - 0.5) / 0.25)
    # PIL's and torchvision's bilinear resize agree to rounding on these flat images.
    assert torch.allclose(logits, expected, atol=1e-3)


def test_torchscript_classifier_kwargs_override_and_errors(tmp_path):
    from pipeline.registry import CLASSIFIERS

    cls = CLASSIFIERS.get("torchscript")
    labels = label_space(list(W.DIGIT_NAMES))
    bare = _scripted(tmp_path, 10)
    with pytest.raises(ValueError, match="input_size"):
        cls(ClassifierSpec(name="a", kind="torchscript", model="m", checkpoint=bare), "cpu", labels)
    spec = ClassifierSpec(name="a", kind="torchscript", model="m", checkpoint=bare,
                          model_kwargs={"input_size": [3, 8, 8], "mean": [0.1] * 3, "std": [0.2] * 3})
    clf = cls(spec, "cpu", labels)
    assert clf.preprocess_cfg["mean"] == [0.1] * 3 and clf.predict(_images(2)).shape == (2, 10)
    with pytest.raises(ValueError, match="unknown keys"):
        cls(ClassifierSpec(name="a", kind="torchscript", model="m", checkpoint=bare,
                           model_kwargs={"input_size": [3, 8, 8], "img_size": 8}), "cpu", labels)
    with pytest.raises(FileNotFoundError, match="checkpoint"):
        cls(ClassifierSpec(name="a", kind="torchscript", model="m", checkpoint=str(tmp_path / "nope.pt")), "cpu", labels)
    # 4 outputs in a 10-class space: only with a label map.
    four = _scripted(tmp_path, 4, {"input_size": [3, 8, 8]})
    with pytest.raises(ValueError, match="label_map"):
        cls(ClassifierSpec(name="a", kind="torchscript", model="m", checkpoint=four), "cpu", labels)
    mapped = cls(ClassifierSpec(name="a", kind="torchscript", model="m", checkpoint=four,
                                label_map={0: 3, 1: 5, 2: 7}), "cpu", labels)
    assert mapped.out_to_label == [3, 5, 7, -1]


def test_torchscript_kind_is_registered_and_listed():
    from pipeline.registry import CLASSIFIERS

    assert "torchscript" in CLASSIFIERS.keys()
    assert main(["ls"]) == 0


# --------------------------------------------------------------------------- world data
def test_shifts_are_identity_at_zero_and_graded():
    x, y = W.load_digits_tensor()
    assert x.shape == (1797, 1, 32, 32) and set(y.tolist()) == set(range(10))
    batch = x[:20]
    for shift in W.SHIFTS:
        assert torch.allclose(W.apply_shift(batch, shift, 0.0), batch, atol=1e-5), shift
        d = [float((W.apply_shift(batch, shift, s) - batch).abs().mean()) for s in (0.25, 0.5, 1.0)]
        assert d[0] < d[1] < d[2], (shift, d)
    # thick strokes add ink, blur lowers the peak, rotation keeps the ink roughly constant
    assert W.apply_shift(batch, "thick_strokes", 1.0).mean() > 1.5 * batch.mean()
    assert W.apply_shift(batch, "blur", 1.0).amax(dim=(1, 2, 3)).mean() < batch.amax(dim=(1, 2, 3)).mean()
    ratio = float(W.apply_shift(batch, "rotation", 1.0).sum() / batch.sum())
    assert 0.85 < ratio < 1.1
    # per-sample strengths
    s = torch.linspace(0, 1, 20)
    assert torch.allclose(W.apply_shift(batch, "blur", s)[0], batch[0], atol=1e-5)


def test_train_test_split_is_fixed_and_disjoint():
    _, y = W.load_digits_tensor()
    tr, te = W.split(y)
    tr2, te2 = W.split(y)
    assert torch.equal(tr, tr2) and torch.equal(te, te2)
    assert len(set(tr.tolist()) & set(te.tolist())) == 0 and len(tr) + len(te) == len(y)


# --------------------------------------------------------------------------- config vs assets
needs_assets = pytest.mark.skipif(not (WORLD_ASSETS / "world.json").is_file(), reason="assets/world not trained")


@needs_assets
def test_world_config_is_valid_and_complete():
    from pipeline.assets import check_registry_keys, missing_assets

    cfg = load_config(WORLD_CONFIG)
    assert cfg.benchmark.label_space.names == W.DIGIT_NAMES
    assert set(cfg.benchmark.shifts) <= set(W.SHIFTS) and len(cfg.benchmark.shifts) >= 3
    assert len(cfg.benchmark.classes) >= 4 and len(cfg.benchmark.seeds) >= 2
    assert cfg.benchmark.scales == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert check_registry_keys(cfg) == [] and missing_assets(cfg) == []
    # Every (class, shift) of the world has a slider, not only the configured ones.
    assert len(list((WORLD_ASSETS / "sliders").glob("*/*.safetensors"))) == 10 * len(W.SHIFTS)


@needs_assets
def test_world_config_matches_training_settings():
    from pipeline.demo import train_world as T

    raw = yaml.safe_load(WORLD_CONFIG.read_text())
    cfg = load_config(WORLD_CONFIG)
    thresholds = json.loads((WORLD_ASSETS / "filter_thresholds.json").read_text())
    assert cfg.filter.thresholds.model_dump() == pytest.approx(thresholds)
    assert {k: raw["slider_training"][k] for k in T.SLIDER_SETTINGS} == T.SLIDER_SETTINGS
    for key, value in T.GENERATION.items():
        assert getattr(cfg.generator, key) == value, key
    assert cfg.generator.resolution == M.RESOLUTION
    entries = M.config_entries("../assets/world")
    assert raw["classifiers"] == entries["classifiers"]
    assert raw["filter"]["clip"] == entries["filter"]["clip"] and raw["filter"]["dino"] == entries["filter"]["dino"]
    for key, value in entries["generator"].items():
        assert raw["generator"][key] == value, key


@needs_assets
def test_world_assets_are_small_and_load():
    from pipeline.models.diffusion import load_pipeline

    total = sum(p.stat().st_size for p in WORLD_ASSETS.rglob("*") if p.is_file())
    assert total < 20 * 2**20
    pipe = load_pipeline(str(WORLD_ASSETS / "sd"), torch.float32, "cpu")
    assert pipe.scheduler.config.prediction_type == "v_prediction"
    assert pipe.unet.config.cross_attention_dim == pipe.text_encoder.config.hidden_size
    assert pipe.vae_scale_factor * pipe.unet.config.sample_size == M.RESOLUTION


def test_demo_names_the_missing_world(tmp_path, monkeypatch, capsys):
    import pipeline.cli.demo as demo

    monkeypatch.setattr(demo, "REPO_ROOT", tmp_path)
    assert main(["demo", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "assets" / "world" / "world.json") in err and "train_world" in err
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- the build
@pytest.fixture(scope="module")
def world_build(demo_world):
    out = demo_world
    samples = pd.concat([pq.read_table(p).to_pandas() for p in sorted((out / "samples").glob("*.parquet"))])
    preds = pd.concat([pq.read_table(p).to_pandas() for p in sorted((out / "predictions").glob("*.parquet"))])
    return {
        "out": out,
        "cfg": load_config(WORLD_CONFIG),
        "samples": samples.reset_index(drop=True),
        "predictions": preds.merge(samples[["sample_id", "shift", "scale", "kept", "trajectory_id"]], on="sample_id"),
        "accuracy": pd.read_csv(out / "report" / "accuracy.csv"),
        "failure_points": pd.read_csv(out / "report" / "failure_points.csv"),
    }


def _mean_over_classifiers(acc: pd.DataFrame, shift: str, scale: float) -> float:
    rows = acc[(acc["shift"] == shift) & (acc["scale"] == scale)]
    return float(rows["accuracy"].mean())


@pytest.mark.slow
def test_build_is_complete(world_build):
    cfg, samples, preds = world_build["cfg"], world_build["samples"], world_build["predictions"]
    b = cfg.benchmark
    n = len(b.classes) * len(b.seeds) * len(b.shifts) * len(b.scales)
    assert len(samples) == n and samples["sample_id"].is_unique
    assert set(samples["class_name"]) == {W.DIGIT_NAMES[c] for c in b.classes}
    assert len(preds) == n * len(cfg.classifiers)
    # scale 0 is the reference image: always kept, and the generator draws recognisable digits
    assert samples.loc[samples["scale"] == 0, "kept"].all()
    acc0 = preds[preds["scale"] == 0].groupby("classifier")["correct"].mean()
    assert (acc0 >= 0.9).all(), acc0.to_dict()


@pytest.mark.slow
def test_accuracy_falls_with_shift_scale(world_build):
    """For at least two shifts, mean accuracy (over classifiers) at the top scale is >= 10
    points below scale 0 -- on the report's complete trajectories and on all images."""
    acc, preds = world_build["accuracy"], world_build["predictions"]
    top = max(world_build["cfg"].benchmark.scales)
    shifts = world_build["cfg"].benchmark.shifts
    drops = {s: _mean_over_classifiers(acc, s, 0.0) - _mean_over_classifiers(acc, s, top) for s in shifts}
    assert sum(d >= 0.10 for d in drops.values()) >= 2, drops
    by_scale = preds.groupby(["shift", "scale"])["correct"].mean()
    raw = {s: float(by_scale[(s, 0.0)] - by_scale[(s, top)]) for s in shifts}
    assert sum(d >= 0.10 for d in raw.values()) >= 2, raw
    # ... and it falls gradually: the mean accuracy over shifts and classifiers at scale 0.5
    # is above the one at the top scale.
    mid = acc[acc["scale"] == 0.5]["accuracy"].mean()
    assert mid > acc[acc["scale"] == top]["accuracy"].mean() + 0.05


@pytest.mark.slow
def test_failure_points_differ_between_classifiers(world_build):
    fp = world_build["failure_points"]
    allfp = fp[fp["shift"] == "all"].pivot_table(index="classifier", columns="scale", values="fp_ratio")
    names = list(allfp.index)
    assert len(names) >= 3
    # total variation between the failure-point distributions of the most different pair
    tv = max(float((allfp.loc[a] - allfp.loc[b]).abs().sum()) for a in names for b in names if a < b)
    assert tv >= 0.2, allfp
    # and the share of trajectories that fail at all differs by at least 15 points
    failed = allfp.sum(axis=1)
    assert failed.max() - failed.min() >= 0.15, failed.to_dict()


@pytest.mark.slow
def test_filter_removes_more_at_high_scales(world_build):
    samples = world_build["samples"]
    kept = samples.groupby("scale")["kept"].mean()
    low = float(kept[[0.5, 1.0]].mean())
    high = float(kept[[2.0, 2.5]].mean())
    assert kept[0.0] == 1.0
    assert 1 - kept[2.5] >= 0.05, kept.to_dict()  # a measurable share removed at the top scale
    assert high <= low - 0.05, kept.to_dict()
    # the detectors see the shift grow: image similarity to scale 0 falls with the scale
    sim = samples.groupby("scale")[["clip_image", "dino_image"]].median()
    assert (sim.loc[2.5] < sim.loc[0.5]).all()
