"""Released ImageNet-E sets as an evaluate source: set names, layout, errors, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from pipeline.labels import label_space
from pipeline.sources import SourceError, detect_kind, open_source
from pipeline.sources.imagenet_e import load_imagenet_e, parse_set

REPO = Path(__file__).resolve().parents[1]
WORLD = REPO / "assets" / "world" / "world.json"
DIGITS = label_space(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"])


@pytest.mark.parametrize(
    "name,expected",
    [
        ("ori", ("none", 0.0)),
        ("Original", ("none", 0.0)),
        ("bg_20", ("background_complexity", 1.0)),
        ("bg+20", ("background_complexity", 1.0)),
        ("bg-20", ("background_simplicity", 1.0)),
        ("bg_-20", ("background_simplicity", 1.0)),
        ("bg_10", ("background_complexity", 0.5)),
        ("bg20-adv", ("background_complexity_adv", 1.0)),
        ("size_0.1", ("size", 0.5)),
        ("size0.08", ("size", 0.7)),
        ("rate-0.05", ("size", 1.0)),
        ("full", ("size_full", 1.0)),
        ("rp", ("random_position", None)),  # a random box position per image: no level
        ("random_position", ("random_position", None)),
        ("rd", ("random_direction", None)),
        ("ro", ("random_direction", None)),
        ("unknown_set", None),
        ("size_0.5", None),  # larger than the scale's origin (0.15): no level
    ],
)
def test_set_names(name, expected):
    got = parse_set(name)
    if expected is None:
        assert got is None
    elif expected[1] is None:
        assert got == expected
    else:
        assert got[0] == expected[0] and got[1] == pytest.approx(expected[1])


def test_wordnet_ids_in_imagenet_order():
    from pipeline.labels.imagenet import wnid_index, wnids

    assert len(wnids()) == 1000 and wnid_index("n01440764") == 0 and wnid_index("n15075141") == 999


def _release(root: Path, sets=("ori", "bg-20", "bg_20", "bg20_adv", "size_0.1", "size_0.05", "full", "rp", "rd")):
    rng = np.random.default_rng(0)
    for s in sets:
        for folder, stems in (("three", ["ILSVRC2012_val_00000007", "ILSVRC2012_val_00000003"]), ("seven", ["ILSVRC2012_val_00000011"])):
            (root / s / folder).mkdir(parents=True, exist_ok=True)
            for stem in stems:
                Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(root / s / folder / f"{stem}.png")
    return root


def rows_of(src, shift: str) -> list[dict]:
    return [r for r in src.rows if r["shift"] == shift]


def test_layout_to_trajectories(tmp_path):
    root = _release(tmp_path / "ie")
    assert detect_kind(str(root)) == "imagenet_e"
    src = open_source(str(root), DIGITS)
    assert src.kind == "imagenet_e" and src.classes == [3, 7]
    assert set(src.shifts) == {
        "background_complexity", "background_simplicity", "background_complexity_adv", "size", "size_full",
        "random_position", "random_direction",
    }
    assert rows_of(src, "random_position")[0]["scales"] == [0.0, 1.0]  # scale 1 marks the set, not a level
    assert any("rp=random_position (no level)" in n for n in src.notes)
    rows = {r["trajectory_id"]: r for r in src.rows}
    # Stems sorted within a class give the seeds: ..._00000003 -> 0, ..._00000007 -> 1.
    size = rows["size/003/seed_0001"]
    assert size["scales"] == [0.0, 0.5, 1.0]
    assert size["paths"][0].endswith("ori/three/ILSVRC2012_val_00000007.png")
    assert size["paths"][2].endswith("size_0.05/three/ILSVRC2012_val_00000007.png")
    assert rows["background_simplicity/007/seed_0000"]["scales"] == [0.0, 1.0]
    # 3 source images x 8 edited sets, plus the original once per (attribute, image) trajectory.
    assert src.n_images == 3 * 8 + 3 * 7


def test_levels_file_and_errors(tmp_path):
    root = _release(tmp_path / "ie", sets=("ori", "mystery"))
    with pytest.raises(SourceError, match="cannot tell the attribute and level of set folder.*'mystery'"):
        load_imagenet_e(str(root), DIGITS)
    (root / "levels.json").write_text(json.dumps({"mystery": {"attribute": "rotation", "level": 0.5}}))
    src = load_imagenet_e(str(root), DIGITS)
    assert src.shifts == ["rotation"] and src.scales == [0.0, 0.5]
    (root / "levels.json").write_text(json.dumps({"mystery": {"attribute": "rotation"}}))
    with pytest.raises(SourceError, match="levels.json: entry 'mystery'"):
        load_imagenet_e(str(root), DIGITS)
    (root / "levels.json").write_text(json.dumps({"mystery": {"attribute": "random_crop", "level": None}}))
    src = load_imagenet_e(str(root), DIGITS)
    assert src.shifts == ["random_crop"] and any("random_crop (no level)" in n for n in src.notes)
    (root / "levels.json").write_text(json.dumps({"mystery": {"attribute": "crop", "level": None}}))
    with pytest.raises(SourceError, match="without a level needs an attribute named random_"):
        load_imagenet_e(str(root), DIGITS)
    bad = _release(tmp_path / "no_ori", sets=("bg_20",))
    with pytest.raises(SourceError, match="no set of unedited originals"):
        load_imagenet_e(str(bad), DIGITS)
    (tmp_path / "ie2" / "ori" / "n01440764").mkdir(parents=True)
    (tmp_path / "ie2" / "rp" / "not_a_class").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "ie2" / "rp" / "not_a_class" / "a.png")
    with pytest.raises(SourceError, match="'not_a_class' are neither WordNet ids"):
        load_imagenet_e(str(tmp_path / "ie2"), DIGITS)


@pytest.mark.skipif(not WORLD.is_file(), reason="assets/world not trained")
def test_evaluate_reports_accuracy_per_attribute_and_level(tmp_path):
    from pipeline.cli import main

    root = _release(tmp_path / "ie")
    out = tmp_path / "out"
    code = main(["evaluate", str(root), "--config", str(REPO / "configs" / "world_imagenet_e.yaml"),
                 "--output", str(out), "--runner", "local"])
    assert code == 0
    table = pd.read_csv(out / "report" / "attributes.csv")
    assert list(table.columns[:5]) == ["classifier", "attribute", "level", "accuracy", "accuracy_drop"]
    levels = {a: sorted(set(t["level"])) for a, t in table.groupby("attribute")}
    assert levels["size"] == [0.0, 0.5, 1.0] and levels["size_full"] == [0.0, 1.0]
    assert levels["background_simplicity"] == [0.0, 1.0]
    assert not {"random_position", "random_direction"} & set(levels)  # no level: apart from the curves
    assert set(table["classifier"]) == {"linear", "cnn", "vit", "clip-zs"}
    assert table["accuracy"].between(0, 1).all()
    sets = pd.read_csv(out / "report" / "attributes_release_sets.csv")
    assert sorted(set(sets["attribute"])) == ["random_direction", "random_position"] and len(sets) == 8
    summ = pd.read_csv(out / "report" / "attributes_summary.csv")
    # The published levels: 2 size + full + bg +-20 + adv; rp and rd are reported on their own.
    assert set(summ["n_published"]) == {6}
    assert {"drop_random_position", "drop_random_direction"} <= set(summ.columns)


def test_cli_names_an_unknown_set_folder_with_exit_code_2(tmp_path, capsys):
    from pipeline.cli import main

    root = _release(tmp_path / "ie", sets=("ori", "bg_20", "mystery"))
    code = main(["evaluate", str(root), "--config", str(REPO / "configs" / "world_imagenet_e.yaml"),
                 "--output", str(tmp_path / "out"), "--runner", "local", "--source-kind", "imagenet_e"])
    assert code == 2
    assert "'mystery'" in capsys.readouterr().err


def test_evaluate_release_with_random_sets_as_easyrobust(tmp_path, monkeypatch):
    """WordNet-id class folders, the random sets without a level: every 224 px classifier receives
    easyrobust's transform of every file, config.json records it, rp / rd stay off the level curves."""
    from test_corruption_imagenet_c import spy_inputs
    from test_ximagenet_release import assert_fed_each, release_config
    from torchvision import transforms

    from pipeline.cli import main
    from pipeline.demo.assets import ensure_tiny_assets

    ensure_tiny_assets()
    root = tmp_path / "ImageNet-E"
    rng = np.random.default_rng(1)
    for s in ("ori", "bg_20", "rp", "rd"):
        for wnid in ("n01440764", "n01443537"):
            (root / s / wnid).mkdir(parents=True)
            Image.fromarray(rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)).save(root / s / wnid / "ILSVRC2012_val_00000001.png")
    seen = spy_inputs(monkeypatch)
    out = tmp_path / "out"
    assert main(["evaluate", str(root), "--config", str(release_config(tmp_path)), "--output", str(out), "--runner", "local"]) == 0
    cfg = json.loads((out / "config.json").read_text())["config"]
    easyrobust = {"resize": 256, "crop": 224, "interpolation": "bicubic", "mean": [0.485, 0.456, 0.406],
                  "std": [0.229, 0.224, 0.225], "shifted_crop_only": False}
    assert {c["name"]: c["preprocess"] for c in cfg["classifiers"]} == {"resnet224": easyrobust, "tiny-clip-zs": easyrobust}
    assert sorted(cfg["benchmark"]["shifts"]) == ["background_complexity", "random_direction", "random_position"]
    # benchmarks/benchmark.py: Resize(int(224 / 0.875), interpolation=3), CenterCrop(224), ToTensor, ImageNet mean/std.
    original = transforms.Compose([transforms.Resize(int(224 / 0.875), interpolation=transforms.InterpolationMode.BICUBIC),
                                   transforms.CenterCrop(224), transforms.ToTensor(),
                                   transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    rows = open_source(str(root), label_space("imagenet")).rows
    files = [Path(p) for r in rows for p in r["paths"]]
    for name in ("resnet224", "tiny-clip-zs"):
        assert_fed_each([x for n, x in seen if n == name], [original(Image.open(f).convert("RGB")) for f in files])
    table = pd.read_csv(out / "report" / "attributes.csv")
    assert set(table["attribute"]) == {"background_complexity"}
    sets = pd.read_csv(out / "report" / "attributes_release_sets.csv")
    assert sorted(set(sets["attribute"])) == ["random_direction", "random_position"]
    summary = pd.read_csv(out / "report" / "attributes_summary.csv")
    assert set(summary["n_published"]) == {1}  # bg 20 only: the random sets are not levels
