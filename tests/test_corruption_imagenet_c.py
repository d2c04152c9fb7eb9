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
    rng = np.random.default_rng(0)
    for wnid in WNIDS:
        for name in FILES:
            img = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)
            if clean:
                (root / "clean" / wnid).mkdir(parents=True, exist_ok=True)
                Image.fromarray(img).save(root / "clean" / wnid / name, "JPEG")
            for cor in corruptions:
                for sev in range(1, 6):
                    d = root / cor / str(sev) / wnid
                    d.mkdir(parents=True, exist_ok=True)
                    Image.fromarray(np.clip(img.astype(int) + 10 * sev, 0, 255).astype(np.uint8)).save(d / name, "JPEG")
    return root


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


def test_clean_folder_gives_scale_zero(tiny_assets, tmp_path):
    from pipeline.cli import main

    root = make_layout(tmp_path / "imagenet-c", corruptions=("fog",), clean=True)
    out = tmp_path / "eval"
    assert main(["evaluate", str(root), "--config", str(TINY_CONFIG), "--output", str(out), "--runner", "local",
                 "--classifiers", "tiny-resnet"]) == 0  # fmt: skip
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
