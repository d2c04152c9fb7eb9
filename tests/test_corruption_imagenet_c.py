"""The ImageNet-C release layout evaluated end to end: corruptions as shifts, severities as scales."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from pipeline.labels import label_space

REPO = Path(__file__).resolve().parents[1]
TINY_CONFIG = REPO / "configs" / "tiny.yaml"
WNIDS = {"n01443537": 1, "n01614925": 22}  # goldfish, bald eagle: the tiny config's classes
FILES = ["ILSVRC2012_val_00000293.JPEG", "ILSVRC2012_val_00002138.JPEG"]


@pytest.fixture(scope="module")
def tiny_assets():
    from pipeline.demo.assets import ensure_tiny_assets

    return ensure_tiny_assets()


def make_layout(root: Path, corruptions=("gaussian_noise", "contrast"), clean: bool = False) -> Path:
    """Shaped as the release: ``<corruption>/<severity>/<wnid>/ILSVRC2012_val_*.JPEG`` at 224 px
    (make_imagenet_c.py corrupts the Resize(256) / CenterCrop(224) image and saves it as JPEG
    quality 85); the clean validation images at their own, larger size."""
    rng = np.random.default_rng(0)
    for wnid in WNIDS:
        for name in FILES:
            img = rng.integers(0, 255, (250, 300, 3), dtype=np.uint8)
            if clean:
                (root / "clean" / wnid).mkdir(parents=True, exist_ok=True)
                Image.fromarray(img).save(root / "clean" / wnid / name, "JPEG")
            crop = img[13:237, 38:262]
            for cor in corruptions:
                for sev in range(1, 6):
                    d = root / cor / str(sev) / wnid
                    d.mkdir(parents=True, exist_ok=True)
                    out = np.clip(crop.astype(int) + 10 * sev, 0, 255).astype(np.uint8)
                    Image.fromarray(out).save(d / name, "JPEG", quality=85, optimize=True)
    return root


def original_input(path: Path, clean: bool):
    """The tensor hendrycks/robustness ImageNet-C/test.py feeds a model (ImageFolder loads RGB)."""
    import torchvision.transforms as trn

    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    if clean:
        t = trn.Compose([trn.Resize(256), trn.CenterCrop(224), trn.ToTensor(), trn.Normalize(mean, std)])
    else:
        t = trn.Compose([trn.CenterCrop(224), trn.ToTensor(), trn.Normalize(mean, std)])
    return t(Image.open(path).convert("RGB"))


def spy_inputs(monkeypatch) -> list:
    """Record (classifier name, input tensor) of every batch a classifier is fed (in process)."""
    from pipeline.models import classifiers

    seen, inputs = [], classifiers.Classifier.inputs

    def spy(self, images, shifted=None):
        x = inputs(self, images, shifted)
        seen.append((self.name, x.clone()))
        return x

    monkeypatch.setattr(classifiers.Classifier, "inputs", spy)
    return seen


def assert_fed(received, expected) -> None:
    """Every received input is one of the expected tensors, and each expected one is received once."""
    import torch

    want = torch.stack(expected)
    got = torch.cat(received)
    assert got.shape == want.shape
    hits = []
    for x in got:
        diff = (want - x).abs().flatten(1).amax(dim=1)
        assert float(diff.min()) < 1e-6, f"an input matches none of the original's (closest differs by {float(diff.min())})"
        hits.append(int(diff.argmin()))
    assert sorted(hits) == list(range(len(expected)))


def read_dir(out: Path, kind: str) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(p) for p in sorted((out / kind).glob("*.parquet"))], ignore_index=True)


def test_layout_is_detected_and_indexed(tmp_path):
    from pipeline.sources import SourceError, detect_kind, open_source

    root = make_layout(tmp_path / "inc")
    assert detect_kind(str(root)) == "imagenet_c"
    src = open_source(str(root), label_space("imagenet"))
    assert src.shifts == ["contrast", "gaussian_noise"] and src.scales == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert src.classes == [1, 22] and src.seeds == [0, 1] and len(src.rows) == 8
    row = next(r for r in src.rows if r["trajectory_id"] == "contrast/022/seed_0001")
    assert row["paths"][2].endswith("contrast/3/n01614925/ILSVRC2012_val_00002138.JPEG")
    assert any("no clean/ folder" in n for n in src.notes)
    (root / "fog" / "7").mkdir(parents=True)
    with pytest.raises(SourceError, match="severity folders must be named 1..5"):
        open_source(str(root), label_space("imagenet"))
    bad = make_layout(tmp_path / "bad", corruptions=("fog",))
    (bad / "fog" / "1" / "n99999999").mkdir()
    Image.new("RGB", (8, 8)).save(bad / "fog" / "1" / "n99999999" / "x.JPEG")
    with pytest.raises(SourceError, match="not ImageNet-1k WordNet ids"):
        open_source(str(bad), label_space("imagenet"))
    with pytest.raises(SourceError, match="label space"):
        open_source(str(make_layout(tmp_path / "ok", corruptions=("fog",))), label_space(["a", "b"]))


def test_evaluate_imagenet_c_layout_end_to_end(tiny_assets, tmp_path):
    from pipeline.cli import main

    root = make_layout(tmp_path / "imagenet-c")
    out = tmp_path / "eval"
    rc = main(["evaluate", str(root), "--config", str(TINY_CONFIG), "--output", str(out), "--runner", "local"])
    assert rc == 0
    samples, preds = read_dir(out, "samples"), read_dir(out, "predictions")
    assert set(samples["shift"]) == {"gaussian_noise", "contrast"}
    assert sorted(set(samples["scale"])) == [1.0, 2.0, 3.0, 4.0, 5.0] and len(samples) == 40
    assert samples.set_index("sample_id").loc["gaussian_noise/001/seed_0000_scale_3000", "class_id"] == 1
    cfg = json.loads((out / "config.json").read_text())["config"]
    assert cfg["benchmark"]["scales"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert "corruption_error" in cfg["aggregate"]["analyses"]
    # CE = mean over severities of the top-1 error, recomputed from the predictions
    ce = pd.read_csv(out / "report" / "corruption_error.csv")
    merged = preds.merge(samples[["sample_id", "shift", "scale"]], on="sample_id")
    for (clf, cor), part in merged.groupby(["classifier", "shift"]):
        want = float((1 - part.groupby("scale")["correct"].mean()).mean())
        got = ce[(ce["classifier"] == clf) & (ce["corruption"] == cor)]["ce_unnormalized"].item()
        assert got == pytest.approx(want)
    assert set(ce["corruption"]) == {"gaussian_noise", "contrast", "mean"}
    assert ce["error_clean"].isna().all()  # ImageNet-C ships no clean images


def test_clean_folder_gives_scale_zero(tiny_assets, tmp_path, monkeypatch):
    """The release evaluated as test.py does: clean images Resize(256) / CenterCrop(224), corrupted ones
    CenterCrop(224) only; the classifier receives exactly the original's tensors."""
    from pipeline.cli import main

    root = make_layout(tmp_path / "imagenet-c", corruptions=("fog",), clean=True)
    out = tmp_path / "eval"
    seen = spy_inputs(monkeypatch)
    assert main(["evaluate", str(root), "--config", str(TINY_CONFIG), "--output", str(out), "--runner", "local",
                 "--classifiers", "tiny-resnet"]) == 0  # fmt: skip
    files = sorted(root.rglob("*.JPEG"))
    assert_fed([x for name, x in seen if name == "tiny-resnet"], [original_input(f, f.parts[-3] == "clean") for f in files])
    cfg = json.loads((out / "config.json").read_text())["config"]
    assert cfg["classifiers"][0]["preprocess"] == {
        "resize": 256, "crop": 224, "interpolation": "bilinear", "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225], "shifted_crop_only": True,
    }  # fmt: skip
    protocol = next(a for a in cfg["aggregate"]["analyses"] if isinstance(a, dict) and a["name"] == "release_protocol")
    assert protocol["protocol"] == "imagenet_c" and protocol["overridden"] == {}
    named = pd.read_csv(out / "report" / "release_protocol.csv")
    assert named["classifier"].tolist() == ["tiny-resnet"] and named["comparable"].all()
    assert "imagenet_c" in (out / "report" / "index.html").read_text()
    metrics = json.loads((out / "report" / "metrics.json").read_text())
    assert "14 of the 15 benchmark corruptions missing" in json.dumps(metrics)  # no AlexNet mCE, said why
    samples = read_dir(out, "samples")
    assert sorted(set(samples["scale"])) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and len(samples) == 24
    acc = pd.read_csv(out / "report" / "accuracy.csv")
    assert set(acc["shift"]) == {"fog"} and set(acc["scale"]) == {0.0, 1.0, 2.0, 3.0, 4.0, 5.0}
    ce = pd.read_csv(out / "report" / "corruption_error.csv").set_index("corruption")
    assert not np.isnan(ce.loc["fog", "error_clean"]) and not np.isnan(ce.loc["fog", "relative_ce_alexnet"])


def test_corruption_of_an_image_collection(tiny_assets, tmp_path):
    """generator.kind corruption over class folders: no text-to-image model, the folder images are scale 0."""
    from pipeline.build import build
    from pipeline.config import load_config

    rng = np.random.default_rng(1)
    for folder in ("001_goldfish", "022_bald eagle"):
        (tmp_path / "photos" / folder).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(tmp_path / "photos" / folder / f"{i}.png")
    cfg = load_config(
        TINY_CONFIG,
        {
            "benchmark": {"seeds": [0, 1], "shifts": ["gaussian_noise", "pixelate"], "scales": [0, 1, 2.5, 5]},
            "generator": {"kind": "corruption", "model": str(tmp_path / "no-model")},
            "source": {"kind": "folders", "path": str(tmp_path / "photos")},
            "filter": {"enabled": False},
            "aggregate": {"margin_max_scale": 5.0},
        },
    )
    out = tmp_path / "out"
    build(cfg, str(out), runner="local")
    samples = read_dir(out, "samples")
    assert len(samples) == 2 * 2 * 2 * 4 and set(samples["shift"]) == {"gaussian_noise", "pixelate"}
    p = json.loads(samples.set_index("sample_id").loc["pixelate/022/seed_0001_scale_2500", "params"])
    assert p == {"source": "folders", "relpath": "022_bald eagle/1.png", "corruption": "pixelate", "severity": 2.5, "table": [0.45]}
    ce = pd.read_csv(out / "report" / "corruption_error.csv")
    assert set(ce["corruption"]) == {"gaussian_noise", "pixelate", "mean"}
