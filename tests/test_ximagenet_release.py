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
    assert "standard_masks/ (4 of 4 originals have one" in note


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
