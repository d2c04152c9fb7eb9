"""The released XIMAGENET-12 tree, shaped as the repository's scripts write it.

``image/<wnid>/<wnid>_N.JPEG`` (originals), ``masks/`` and ``standard_masks/`` (PNG masks,
``MaskStandardization.py``), ``segmented_image/segmented_image/<wnid>/`` (``segementwithRGB.py``
keeps the JPEG name), ``segmented_image_transparent/<wnid>/<wnid>_N_segmented.png``
(``Segmentbackground.py``), ``transparent_img/<wnid>/<wnid>_N.png`` (``transparent.py``),
``blur_background/`` (``utils.blur``), ``image_r`` / ``image_rainbow`` (``Color_image.py``) and
``combine/`` (``generated_background.py``'s random backgrounds).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

WNIDS = ("n01689811", "n02992211")
IDS = (17, 3)


def make_release(root: Path, numeric: bool = False) -> Path:
    """A two-class, two-image tree in the release's layout (``numeric``: class folders renamed 0, 1)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for k, wnid in enumerate(WNIDS):
        cls = str(k) if numeric else wnid
        for i in IDS:
            stem = f"{wnid}_{i}"
            img = Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8))
            mask = np.zeros((40, 48), np.uint8)
            mask[10:30, 12:36] = 1  # the raw masks hold small labels; standard_masks 0 / 255
            files = {
                f"image/{cls}/{stem}.JPEG": (img, "JPEG"),
                f"masks/{cls}/{stem}.png": (Image.fromarray(mask), "PNG"),
                f"standard_masks/{cls}/{stem}.png": (Image.fromarray(mask * 255), "PNG"),
                f"segmented_image/segmented_image/{cls}/{stem}.JPEG": (img, "JPEG"),
                f"segmented_image_transparent/{cls}/{stem}_segmented.png": (img.convert("RGBA"), "PNG"),
                f"transparent_img/{cls}/{stem}.png": (img.convert("RGBA"), "PNG"),
                f"blur_background/{cls}/{stem}.JPEG": (img, "JPEG"),
                f"image_r/{cls}/{stem}.JPEG": (img, "JPEG"),
                f"image_rainbow/{cls}/{stem}.JPEG": (img, "JPEG"),
                f"combine/{cls}/{stem}.JPEG": (img, "JPEG"),
            }
            for rel, (im, fmt) in files.items():
                path = root / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                im.save(path, format=fmt)
    return root


def test_release_tree_mask_folders_are_not_scenarios_and_the_nested_segmented_image_is_read(tmp_path):
    from pipeline.labels import label_space
    from pipeline.sources import detect_kind, open_source

    root = make_release(tmp_path / "x12")
    assert detect_kind(str(root)) == "ximagenet"
    src = open_source(str(root), label_space("imagenet"))
    assert src.shifts == ["blur_background", "image_r", "image_rainbow", "random_background", "segmented_image",
                          "transparent_image"]
    assert src.classes == [44, 486] and src.seeds == [0, 1]
    paths = [p for r in src.rows for p in r["paths"]]
    assert not any("/masks/" in p or "standard_masks" in p or "segmented_image_transparent" in p for p in paths)
    seg = next(r for r in src.rows if r["trajectory_id"] == "segmented_image/044/seed_0000")
    assert seg["paths"][1].endswith("segmented_image/segmented_image/n01689811/n01689811_17.JPEG")
    note = next(n for n in src.notes if "mask folders" in n)
    assert "masks, segmented_image_transparent, standard_masks are not scenarios" in note
    assert "masks are read from standard_masks/, then masks/ (4 of 4 originals have one" in note


def test_numeric_class_folders_are_refused_with_the_wnids(tmp_path, capsys):
    from pipeline.cli import main
    from pipeline.labels import label_space
    from pipeline.sources import SourceError, detect_kind, open_source

    root = make_release(tmp_path / "x12", numeric=True)
    assert detect_kind(str(root)) == "ximagenet"  # not read as plain class folders 0, 1
    with pytest.raises(SourceError, match=r"class folder '0' in '\w+' is a bare number") as err:
        open_source(str(root), label_space("imagenet"))
    assert "n01689811 (lizard)" in str(err.value) and "n07614500 (ice cream)" in str(err.value)
    repo = Path(__file__).resolve().parents[1]
    rc = main(["evaluate", str(root), "--config", str(repo / "configs" / "demo.yaml"), "--output", str(tmp_path / "o")])
    assert rc == 2
    assert "class folder '0'" in capsys.readouterr().err


def test_folder_masks_of_the_release_any_non_zero_value_is_object(tmp_path):
    from types import SimpleNamespace

    from PIL import Image

    from pipeline.sources.masks import FolderMasks

    root = make_release(tmp_path / "x12")
    image = Image.open(root / "image" / WNIDS[0] / f"{WNIDS[0]}_17.JPEG")
    info = {"relpath": f"{WNIDS[0]}/{WNIDS[0]}_17.JPEG"}

    def provider(folder: str) -> FolderMasks:
        return FolderMasks(SimpleNamespace(source=SimpleNamespace(masks=SimpleNamespace(path=str(root / folder)))))

    raw = provider("masks").mask(None, image, info)
    std = provider("standard_masks").mask(None, image, info)
    assert raw.sum() == std.sum() == 20 * 24  # the raw mask's label 1 is object, as in the scripts
    assert np.array_equal(raw, std)


@pytest.mark.parametrize("masks_path", ["release root", "not set"])
def test_a_build_from_the_release_reads_its_own_masks(tmp_path, masks_path):
    """source.path ROOT/image with source.masks {kind: folder} and path ROOT (or none): each image's mask is the
    release's mask file of the same stem, any non-zero value object; standard_masks/ first, else masks/."""
    import json
    from types import SimpleNamespace

    from PIL import Image

    from pipeline.families.base import UnitContext
    from pipeline.labels import XIMAGENET_CLASSES, label_space
    from pipeline.sources.collection import FoldersSource
    from pipeline.sources.masks import FolderMasks

    root = make_release(tmp_path / "x12")
    rng = np.random.default_rng(1)
    for wnid in WNIDS:  # a different mask per image, with the raw annotation's several labels
        for i in IDS:
            raw = rng.integers(0, 3, (40, 48), dtype=np.uint8)
            Image.fromarray(raw).save(root / "masks" / wnid / f"{wnid}_{i}.png")
            Image.fromarray((raw > 0).astype(np.uint8) * 255).save(root / "standard_masks" / wnid / f"{wnid}_{i}.png")
    (root / "standard_masks" / WNIDS[1] / f"{WNIDS[1]}_3.png").unlink()  # read from masks/ instead

    label_map = tmp_path / "wnids.json"  # plain class folders need a map from the wnids
    label_map.write_text(json.dumps({wnid: XIMAGENET_CLASSES[wnid][0] for wnid in WNIDS}))
    masks = SimpleNamespace(kind="folder", path=str(root) if masks_path == "release root" else None)
    config = SimpleNamespace(
        benchmark=SimpleNamespace(label_space=label_space("imagenet"), classes=[44, 486], seeds=[0, 1]),
        generator=SimpleNamespace(image_size=64),
        source=SimpleNamespace(kind="folders", path=str(root / "image"), label_map=str(label_map), follow_symlinks=False,
                               masks=masks),
    )
    assert FolderMasks.missing_files(config) == []
    source, provider = FoldersSource(config), FolderMasks(config)
    source.setup()
    provider.setup()
    for class_id, wnid in zip((44, 486), WNIDS):
        for seed, name in enumerate(sorted(p.name for p in (root / "image" / wnid).iterdir())):
            base = source.load(UnitContext(class_id, wnid, seed))
            assert base.info["relpath"] == f"{wnid}/{name}"
            got = provider.mask(None, base.image, base.info)
            with Image.open(root / "masks" / wnid / name.replace(".JPEG", ".png")) as m:
                want = np.asarray(m.resize(base.image.size, Image.NEAREST)) > 0
            assert got.shape == (64, 64) and 0 < got.sum() < got.size
            assert np.array_equal(got, want)

    elsewhere = SimpleNamespace(source=SimpleNamespace(path=str(tmp_path), masks=SimpleNamespace(path=None)))
    assert "not set" in FolderMasks.missing_files(elsewhere)[0]  # not a release's originals folder: name a folder


def release_config(tmp_path: Path, analyses: tuple = ()) -> Path:
    """configs/tiny.yaml with an ImageNet-sized timm model (own transform: 224 px, ImageNet mean/std)
    and CLIP zero-shot; asset paths made absolute."""
    import yaml

    repo = Path(__file__).resolve().parents[1]
    raw = yaml.safe_load((repo / "configs" / "tiny.yaml").read_text())
    by_name = {c["name"]: c for c in raw["classifiers"]}
    net = dict(by_name["tiny-resnet"], name="resnet224")
    net["model_kwargs"] = {**net["model_kwargs"], "pretrained_cfg_overlay": {
        "input_size": [3, 224, 224], "crop_pct": 0.875, "interpolation": "bicubic",
        "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}  # fmt: skip
    raw["classifiers"] = [net, by_name["tiny-clip-zs"]]
    raw["aggregate"] = {"plots": False, "analyses": ["cns", *analyses]}

    def absolute(value):
        if isinstance(value, dict):
            return {k: absolute(v) for k, v in value.items()}
        if isinstance(value, list):
            return [absolute(v) for v in value]
        return str((repo / "configs" / value).resolve()) if isinstance(value, str) and value.startswith("../") else value

    out = tmp_path / "x12.yaml"
    out.write_text(yaml.safe_dump(absolute(raw)))
    return out


def keras_input(path: Path, size: int, mean, std):
    """train.py's input: Keras load_img(path, target_size=(size, size)) -- PIL, RGB, resize with
    NEAREST to (size, size) -- img_to_array / 255; then the model's normalisation."""
    import torch
    from PIL import Image

    img = Image.open(path)
    img = img.convert("RGB") if img.mode != "RGB" else img
    img = img.resize((size, size), Image.NEAREST)
    x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255).permute(2, 0, 1)
    return (x - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]


def assert_fed_each(received, expected, among=None) -> None:
    """The received inputs are the expected tensors, as a multiset (an original opens every trajectory);
    with ``among`` instead, each received input is one of those tensors."""
    import torch

    if not received:
        return
    got = torch.cat(received)
    want = torch.stack(expected if among is None else among)
    if among is None:
        assert got.shape == want.shape
    free = list(range(len(want)))
    for x in got:
        diff = (want[free] - x).abs().flatten(1).amax(dim=1)
        assert float(diff.min()) < 1e-6, f"an input matches none of the original's (closest differs by {float(diff.min())})"
        if among is None:
            free.pop(int(diff.argmin()))
    assert among is not None or not free


def test_evaluate_release_as_the_original(tmp_path, monkeypatch):
    """Each classifier receives train.py's input of every file it scores; config.json records the transform,
    the 12-way label space and no mask sample; 1000-way when the config sets labels: imagenet."""
    import json

    import pandas as pd
    import torch
    from test_corruption_imagenet_c import spy_inputs

    from pipeline import cli
    from pipeline.demo.assets import ensure_tiny_assets
    from pipeline.labels import label_space
    from pipeline.sources import open_source

    ensure_tiny_assets()
    root = make_release(tmp_path / "x12")
    # Short probes for C'(i): the test is about their inputs, not their convergence.
    config = release_config(tmp_path, ({"name": "robustness_score", "probe_iterations": 5, "probe_folds": 2},))
    seen = spy_inputs(monkeypatch)
    out = tmp_path / "out"
    assert cli.main(["evaluate", str(root), "--config", str(config), "--output", str(out), "--runner", "local"]) == 0

    cfg = json.loads((out / "config.json").read_text())["config"]
    assert cfg["benchmark"]["labels"] == "ximagenet12"
    clf = {c["name"]: c for c in cfg["classifiers"]}
    imagenet = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    assert clf["resnet224"]["preprocess"] == {"resize": 224, "crop": 224, "interpolation": "nearest", **imagenet,
                                              "shifted_crop_only": False, "squash": True}
    clip = clf["tiny-clip-zs"]["preprocess"]
    assert clip["interpolation"] == "nearest" and clip["squash"] and clip["resize"] == clip["crop"] == 224

    rows = open_source(str(root), label_space("imagenet")).rows
    files = [Path(p) for r in rows for p in r["paths"]]
    assert not any(part in {"masks", "standard_masks", "segmented_image_transparent"} for f in files for part in f.parts)
    for name, (mean, std) in (("resnet224", (imagenet["mean"], imagenet["std"])), ("tiny-clip-zs", (clip["mean"], clip["std"]))):
        fed = torch.cat([x for n, x in seen if n == name])
        expected = [keras_input(f, 224, mean, std) for f in files]
        assert_fed_each([fed[: len(files)]], expected)  # the classify stage, one input per image
        assert_fed_each([x[None] for x in fed[len(files):]], None, among=expected)  # C'(i) probes: the same inputs

    samples = pd.read_parquet(out / "samples")
    assert set(samples["shift"]) == {"blur_background", "image_r", "image_rainbow", "random_background",
                                     "segmented_image", "transparent_image"}
    preds = pd.read_parquet(out / "predictions")
    twelve = {44, 46, 124, 147, 153, 277, 393, 405, 479, 480, 486, 928}
    assert set(preds["top1"]) <= twelve  # the 12-way accuracy: top-1 over the 12 classes' outputs
    named = pd.read_csv(out / "report" / "release_protocol.csv").set_index("classifier")
    assert named["comparable"].all()
    assert "robustness_score" in {a if isinstance(a, str) else a["name"] for a in cfg["aggregate"]["analyses"]}

    # 1000-way: the config sets the label space itself.
    wide = tmp_path / "wide"
    assert cli.main(["evaluate", str(root), "--config", str(config), "--output", str(wide), "--runner", "local",
                     "--set", "benchmark.labels=imagenet", "--classifiers", "resnet224"]) == 0
    assert json.loads((wide / "config.json").read_text())["config"]["benchmark"]["labels"] == "imagenet"
    assert not set(pd.read_parquet(wide / "predictions")["top1"]) <= twelve
