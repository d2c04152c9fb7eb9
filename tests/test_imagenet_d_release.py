"""The released ImageNet-D layout: detection (both revisions), indexing, and evaluation as the
original does (chenshuang-zhang/imagenet_d evaluate_imagenet_models.py, evaluate_vlm.py), in process."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from pipeline import cli
from pipeline.labels import label_space
from pipeline.sources import SourceError, detect_kind, open_source

REPO = Path(__file__).resolve().parents[1]

# (kind, class folder, images): class folders named as in the release.
LAYOUT = [("background", "banana", 2), ("background", "backpack", 1), ("texture", "chair", 2), ("material", "t_shirt", 1)]
OPENAI_MEAN, OPENAI_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def make_release(root: Path) -> Path:
    """Shaped as the release: ``<kind>/<class folder>/<random name>.png`` and ``questions/<kind>.csv``
    (tab-separated, the columns evaluate_vlm.py writes: image_dir, gt_category, top1/top2 guesses)."""
    rng = np.random.default_rng(0)
    questions: dict[str, list[str]] = {}
    for i, (kind, folder, n) in enumerate(LAYOUT):
        d = root / kind / folder
        d.mkdir(parents=True)
        for j in range(n):
            name = hashlib.sha1(f"{kind}/{folder}/{j}".encode()).hexdigest()[:20] + ".png"
            Image.fromarray(rng.integers(0, 255, (128, 128, 3), dtype=np.uint8)).save(d / name)
            words = folder.replace("_", " ")
            other = "lemon" if folder == "banana" else "banana"  # the distractor is never the truth
            questions.setdefault(kind, []).append(f"{kind}/{folder}/{name}\t{words}\t{words}\t{other}")
    (root / "questions").mkdir()
    for kind, lines in questions.items():
        header = "image_dir\tgt_category\ttop1_pred_cate\ttop2_pred_cate"
        (root / "questions" / f"{kind}.csv").write_text("\n".join([header, *lines]) + "\n")
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
    assert src.n_images == 6  # questions/*.csv are not images
    assert not any("questions" in p for r in src.rows for p in r["paths"])
    assert any("questions/: 6 questions" in n for n in src.notes)


def test_older_revision_with_a_data_folder(tmp_path):
    """An older revision of the release nests the kinds in ``data/`` (beside README files)."""
    flat = make_release(tmp_path / "flat")
    root = tmp_path / "ImageNet-D"
    (root / "data").mkdir(parents=True)
    for part in ("background", "texture", "material", "questions"):
        shutil.move(str(flat / part), str(root / "data" / part))
    (root / "README.md").write_text("ImageNet-D\n")
    (root / ".gitattributes").write_text("*.png filter=lfs\n")
    assert detect_kind(str(root)) == "imagenet_d"
    src = open_source(str(root), label_space("imagenet"))
    assert src.n_images == 6 and src.shifts == ["background", "material", "texture"]
    assert all("/data/" in p for r in src.rows for p in r["paths"])
    assert any("questions/: 6 questions" in n for n in src.notes)
    (root / "other").mkdir()  # another folder beside data/: not this layout
    assert detect_kind(str(root)) != "imagenet_d"


def test_unknown_class_folder_is_named(tmp_path):
    root = make_release(tmp_path / "r")
    (root / "texture" / "goldfish").mkdir()
    Image.new("RGB", (8, 8)).save(root / "texture" / "goldfish" / "a.png")
    with pytest.raises(SourceError, match="texture/goldfish"):
        open_source(str(root), label_space("imagenet"))


def release_config(tmp_path: Path) -> Path:
    """configs/tiny.yaml with three classifiers: a timm model whose own data config is torchvision's
    (Resize 256 bilinear, CenterCrop 224), CLIP zero-shot with no templates of its own, and a
    timm model that sets its own transform (an override)."""
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
    by_name = {c["name"]: c for c in raw["classifiers"]}
    tv = dict(by_name["tiny-resnet"], name="tv-resnet")
    tv["model_kwargs"] = {
        **tv["model_kwargs"],
        "pretrained_cfg_overlay": {"input_size": [3, 224, 224], "crop_pct": 0.875, "interpolation": "bilinear",
                                   "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
    }  # fmt: skip
    clip = {k: v for k, v in by_name["tiny-clip-zs"].items() if k != "templates"}
    vit = dict(by_name["tiny-vit"], preprocess="cns")
    raw["classifiers"] = [tv, clip, vit]

    def absolute(value):  # the asset paths are relative to configs/
        if isinstance(value, dict):
            return {k: absolute(v) for k, v in value.items()}
        if isinstance(value, list):
            return [absolute(v) for v in value]
        return str((REPO / "configs" / value).resolve()) if isinstance(value, str) and value.startswith("../") else value

    out = tmp_path / "imagenet_d.yaml"
    out.write_text(yaml.safe_dump(absolute(raw)))
    return out


def clip_transform(n_px: int):
    """clip.load's preprocess, written as the CLIP repository does (clip/clip.py ``_transform``)."""
    from torchvision.transforms import CenterCrop, Compose, InterpolationMode, Normalize, Resize, ToTensor

    return Compose([
        Resize(n_px, interpolation=InterpolationMode.BICUBIC),
        CenterCrop(n_px),
        lambda image: image.convert("RGB"),
        ToTensor(),
        Normalize(OPENAI_MEAN, OPENAI_STD),
    ])


def test_evaluate_release_as_the_original(tmp_path, monkeypatch, capsys):
    """Each classifier receives the original's tensor for every release file; config.json records
    the resolved transforms and templates; the report names the protocol and the override."""
    from test_corruption_imagenet_c import assert_fed, spy_inputs
    from torchvision import models

    from pipeline.demo.assets import ensure_tiny_assets

    ensure_tiny_assets()
    root = make_release(tmp_path / "ImageNet-D")
    out = tmp_path / "out"
    config = release_config(tmp_path)
    seen = spy_inputs(monkeypatch)
    assert cli.main(["evaluate", str(root), "--config", str(config), "--output", str(out), "--runner", "local"]) == 0
    said = capsys.readouterr().out
    assert "evaluated with the imagenet_d protocol" in said
    assert "classifiers[tiny-vit] overrides the imagenet_d protocol (preprocess 'cns'" in said
    assert "not comparable with the published ones" in said and "classifiers[tv-resnet]" not in said
    files = sorted(root.rglob("*.png"))
    # utils/data_loaders_imgnet_id.py opens each file .convert("RGB") and applies the transform;
    # utils/models.py takes the model's weights.transforms() (vgg19_bn, vit_b_16: IMAGENET1K_V1).
    torchvision_own = models.VGG19_BN_Weights.IMAGENET1K_V1.transforms()
    assert_fed([x for n, x in seen if n == "tv-resnet"], [torchvision_own(Image.open(f).convert("RGB")) for f in files])
    # evaluate_vlm.py: clip.load's preprocess (the tiny CLIP's image size is 224, as ViT-B/16's).
    assert_fed([x for n, x in seen if n == "tiny-clip-zs"], [clip_transform(224)(Image.open(f).convert("RGB")) for f in files])

    cfg = json.loads((out / "config.json").read_text())["config"]
    assert cfg["benchmark"]["labels"] == "imagenet_d"
    assert cfg["benchmark"]["shifts"] == ["background", "material", "texture"]
    clf = {c["name"]: c for c in cfg["classifiers"]}
    assert clf["tv-resnet"]["preprocess"] == {
        "resize": torchvision_own.resize_size[0], "crop": torchvision_own.crop_size[0], "interpolation": "bilinear",
        "mean": list(torchvision_own.mean), "std": list(torchvision_own.std), "shifted_crop_only": False,
    }  # fmt: skip
    assert clf["tiny-clip-zs"]["preprocess"] == {
        "resize": 224, "crop": 224, "interpolation": "bicubic", "mean": list(OPENAI_MEAN), "std": list(OPENAI_STD),
        "shifted_crop_only": False,
    }  # fmt: skip
    assert clf["tiny-clip-zs"]["templates"] == ["A photo of a {c}"]  # evaluate_vlm.py:27
    assert clf["tiny-vit"]["preprocess"] == "cns"  # set by the entry: kept, flagged below
    named = pd.read_csv(out / "report" / "release_protocol.csv").set_index("classifier")
    assert named["comparable"].to_dict() == {"tv-resnet": True, "tiny-clip-zs": True, "tiny-vit": False}
    assert "imagenet_d" in (out / "report" / "index.html").read_text()

    samples = pd.read_parquet(out / "samples")
    preds = pd.read_parquet(out / "predictions")
    assert len(samples) == 6
    # The multi-id rule: ImageNet classifiers' top-1 is an ImageNet-D class id or -1, and
    # correct == (top1 == class id); CLIP zero-shot predicts among the 113 classes.
    merged = preds.merge(samples[["sample_id", "class_id"]], on="sample_id")
    space = label_space("imagenet_d")
    assert merged["top1"].between(-1, len(space) - 1).all()
    assert (merged["correct"] == (merged["top1"] == merged["class_id"])).all()
    assert (merged.loc[merged["classifier"] == "tiny-clip-zs", "top1"] >= 0).all()
    acc = pd.read_csv(out / "report" / "accuracy.csv")
    assert set(acc["shift"]) == {"background", "material", "texture"}  # accuracy per nuisance kind


def test_zero_shot_prompts_are_the_originals():
    """The single template over the 113 cleaned names, as evaluate_vlm.py tokenizes them."""
    from pipeline.labels.imagenet_d import class_names
    from pipeline.models.classifiers import zero_shot_templates
    from pipeline.sources.imagenet_d import PROTOCOL

    (template,) = zero_shot_templates(list(PROTOCOL.templates), "t")
    names = class_names()
    assert len(names) == 113
    assert template(names[0]) == f"A photo of a {names[0]}"
    assert "A photo of a binder (closed)" in {template(n) for n in names}
