"""XIMAGENET-12 robustness score: the published Table 2 from its own cells, hand cases,
probes, the regression, mask statistics and the released layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.analyses.robustness_score import fit_probe_cv, robustness_score, score_from_squared_deviations

# Seed 003, Table 2: per-scenario squared accuracy drops in % (Blur_background, Blur_object,
# Image_g, Image_b, Image_grey, Image_r, Random_background, Segmented_image), then the
# printed variances (external, internal) and robustness score.
TABLE2 = {
    "ResNet50": ([0.18, 0.50, 1.17, 0.68, 0.10, 0.38, 53.04, 7.12], [0.10, 0.00, 0.11, 0.17, 0.20, 0.00, 6.96, 0.30], 0.0902, 0.0112, 0.8985),
    "DenseNet121": ([0.13, 0.72, 1.00, 1.01, 0.17, 0.84, 50.39, 7.69], [0.21, 0.00, 0.07, 0.14, 0.18, 0.01, 2.77, 0.29], 0.0885, 0.0052, 0.9062),
    "VGG-16": ([0.15, 0.15, 2.30, 5.45, 1.52, 1.72, 47.93, 19.53], [0.33, 0.06, 0.26, 0.51, 0.72, 0.01, 0.01, 0.17], 0.1125, 0.0029, 0.8845),
    "ViT": ([0.25, 0.07, 7.60, 9.38, 5.18, 7.24, 58.11, 19.74], [0.51, 0.72, 0.15, 0.07, 0.08, 0.57, 16.54, 0.00], 0.1536, 0.0266, 0.8196),
    "Swin": ([0.96, 0.84, 6.84, 6.17, 4.61, 6.94, 50.87, 21.33], [0.02, 56.28, 0.48, 0.61, 0.56, 0.05, 37.10, 65.03], 0.1408, 0.2287, 0.6305),
}
# The cells are rounded to 0.01 %: eight of them bound the error of a variance (n - 1 = 7)
# by 8 * 0.00005 / 7 < 0.0001, and the printed variances and scores are rounded to 0.0001.
TOL = 1.5e-4


@pytest.mark.parametrize("model", sorted(TABLE2))
def test_table2_is_reproduced_by_the_table_variant(model):
    ext, inn, v_ext, v_inn, score = TABLE2[model]
    got = score_from_squared_deviations([x / 100 for x in ext], [x / 100 for x in inn], "table")
    assert abs(got["var_cross"] - v_ext) < TOL
    assert abs(got["var_inner"] - v_inn) < TOL
    assert abs(got["score"] - score) < 2 * TOL


# Seed 003, Table 1: top-1 accuracies in % on the same eight scenarios (Blur_bg, Blur_obj, Color_g,
# Color_b, Color_grey, Color_r, Rand_bg, Seg_img): EX1 (trained on originals) and EX2 (trained and
# tested on the scenario) -- C(i) and C'(i).  mu and mu' are not printed.
TABLE1 = {
    "ResNet50": ([90.97, 88.17, 84.42, 86.98, 92.13, 89.03, 22.41, 68.55], [83.52, 80.24, 83.61, 84.45, 84.71, 80.40, 53.91, 85.76]),
    "DenseNet121": ([93.77, 88.92, 87.39, 87.33, 93.23, 88.21, 26.41, 69.67], [90.79, 86.57, 88.92, 89.96, 90.44, 87.37, 69.58, 91.60]),
    "VGG-16": ([89.92, 89.91, 78.64, 70.46, 81.48, 80.68, 24.58, 49.62], [74.85, 71.54, 74.18, 76.26, 77.58, 69.91, 70.25, 73.27]),
    "ViT": ([88.44, 90.77, 65.87, 62.82, 70.69, 66.53, 17.21, 49.01], [71.51, 70.21, 74.77, 75.96, 75.80, 71.14, 38.01, 78.69]),
    "Swin": ([80.97, 81.57, 64.59, 65.91, 69.28, 64.41, 19.43, 44.57], [72.81, 75.02, 81.05, 81.96, 81.63, 76.42, 13.23, 80.64]),
}
# A cell (C - mu)^2 in % from accuracies rounded to 0.01 %: the printed cell's rounding (0.005)
# plus 2 |C - mu| x 0.005 % (< 0.0075) -- 0.02 covers both.
CELL_TOL = 0.02


def _reference(acc: list[float], cells: list[float]) -> float:
    """The reference accuracy (mu or mu') the printed cells imply: least squares on a 1e-5 grid."""
    a, c = np.array(acc) / 100, np.array(cells) / 100
    grid = np.arange(0, 1, 1e-5)
    err = (((a[None, :] - grid[:, None]) ** 2 - c[None, :]) ** 2).sum(1)
    return float(grid[err.argmin()])


@pytest.mark.parametrize("model", ["ResNet50", "DenseNet121", "VGG-16", "ViT"])
def test_table2_is_reproduced_from_the_table1_accuracies(model):
    """Every cell of Table 2 is (C(i) - mu)^2 of Table 1's accuracies, with one mu per row and a separate mu'."""
    ext, inn, v_ext, v_inn, score = TABLE2[model]
    cross, inner = (np.array(x) / 100 for x in TABLE1[model])
    mu, mu_inner = _reference(TABLE1[model][0], ext), _reference(TABLE1[model][1], inn)
    assert np.abs((cross - mu) ** 2 * 100 - ext).max() < CELL_TOL
    assert np.abs((inner - mu_inner) ** 2 * 100 - inn).max() < CELL_TOL
    assert mu > mu_inner + 0.05  # mu' is not mu: trained and tested on originals vs the EX2 reference
    got = robustness_score(list(cross), list(inner), mu, mu_inner, "table")
    assert abs(got["var_cross"] - v_ext) < TOL and abs(got["var_inner"] - v_inn) < TOL
    assert abs(got["score"] - score) < 2 * TOL


def test_the_swin_row_is_not_reproducible_from_its_accuracies():
    """Swin's internal Blur_object and Segmented_image cells are C'(i)^2: computed with mu' = 0."""
    ext, inn, v_ext, v_inn, score = TABLE2["Swin"]
    cross, inner = (np.array(x) / 100 for x in TABLE1["Swin"])
    mu = _reference(TABLE1["Swin"][0], ext)
    assert np.abs((cross - mu) ** 2 * 100 - ext).max() < CELL_TOL  # the external row is fine
    zero = [1, 7]  # Blur_object, Segmented_image
    assert np.abs(inner[zero] ** 2 * 100 - np.array(inn)[zero]).max() < CELL_TOL  # 0.7502^2, 0.8064^2
    rest = [i for i in range(8) if i not in zero]
    mu_inner = _reference([TABLE1["Swin"][1][i] for i in rest], [inn[i] for i in rest])
    assert np.abs((inner[rest] - mu_inner) ** 2 * 100 - np.array(inn)[rest]).max() < CELL_TOL
    assert np.abs((inner[zero] - mu_inner) ** 2 * 100 - np.array(inn)[zero]).min() > 40  # not with the row's mu'
    # The printed variance and score follow the mixed cells, not one mu'.
    mixed = score_from_squared_deviations([x / 100 for x in ext], list((inner[rest] - mu_inner) ** 2) + list(inner[zero] ** 2))
    assert abs(mixed["var_inner"] - v_inn) < TOL and abs(mixed["score"] - score) < 2 * TOL
    one = robustness_score(list(cross), list(inner), mu, mu_inner, "table")
    assert one["score"] == pytest.approx(0.803, abs=1e-3)  # with one mu' Swin scores 0.803, not 0.6305


def test_the_printed_equations_divide_by_n_and_do_not_give_the_table():
    ext, inn, v_ext, v_inn, score = TABLE2["ResNet50"]
    got = score_from_squared_deviations([x / 100 for x in ext], [x / 100 for x in inn], "equation")
    # by hand: (0.6317 / 8, 0.0784 / 8) -> S = 1 - 0.0789625 - 0.0098 = 0.9112375
    assert got["var_cross"] == pytest.approx(0.6317 / 8)
    assert got["score"] == pytest.approx(1 - 0.6317 / 8 - 0.0784 / 8)
    assert abs(got["score"] - score) > 0.01


def test_score_from_accuracies_by_hand():
    # mu = 0.9; C = (0.8, 0.5, 0.9): squared drops 0.01, 0.16, 0 -> table 0.17 / 2, equation 0.17 / 3
    # C' = (0.9, 0.7, 0.85) about mu' = 0.95: 0.0025, 0.0625, 0.01 -> 0.075 / 2, 0.075 / 3
    t = robustness_score([0.8, 0.5, 0.9], [0.9, 0.7, 0.85], 0.9, 0.95, "table")
    e = robustness_score([0.8, 0.5, 0.9], [0.9, 0.7, 0.85], 0.9, 0.95, "equation")
    assert t["score"] == pytest.approx(1 - 0.085 - 0.0375)
    assert e["score"] == pytest.approx(1 - 0.17 / 3 - 0.025)
    assert robustness_score([0.9, 0.9], [0.9, 0.9], 0.9)["score"] == pytest.approx(1.0)


def test_linear_probe_cross_validation():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 20)
    centres = np.array([[4.0, 0, 0], [0, 4.0, 0], [0, 0, 4.0]])
    x = centres[y] + rng.normal(0, 0.3, (60, 3))
    folds = np.tile(np.arange(5), 12)
    assert fit_probe_cv(x, y, folds, 1e-2, 100) == 1.0
    noise = rng.normal(0, 1, (60, 3))  # no signal: about chance
    assert fit_probe_cv(noise, y, folds, 1e-2, 100) < 0.6


def test_regression_estimates_are_the_cell_differences_in_a_balanced_design():
    from pipeline.analyses.scenario_regression import fit, stars

    rows = []
    for clf, off_c in (("a", 0.0), ("b", -0.1)):
        for sc, off_s in (("original", 0.0), ("blur_object", -0.2), ("random_background", -0.5)):
            for cls, off_k in (("zero", 0.0), ("one", 0.05)):
                rows.append({"classifier": clf, "scenario": sc, "class_name": cls, "accuracy": 0.9 + off_c + off_s + off_k})
    table, info = fit(pd.DataFrame(rows), ["a", "b"])
    est = dict(zip(table["variable"], table["estimate"]))
    assert est["classifier[b]"] == pytest.approx(-0.1)
    assert est["scenario[random_background]"] == pytest.approx(-0.5)
    assert est["scenario[blur_object]"] == pytest.approx(-0.2)
    assert info["r_squared"] == pytest.approx(1.0)
    assert [stars(p) for p in (1e-5, 5e-4, 5e-3, 0.02, 0.3)] == ["****", "***", "**", "*", "ns"]


def test_regression_gives_statsmodels_numbers_on_an_unbalanced_design():
    """numpy's least squares give the numbers statsmodels' ols(formula).fit() gave (recorded from
    statsmodels 0.14 on this table: 14 of 18 cells, the reference classifier named second)."""
    from pipeline.analyses.scenario_regression import fit

    missing = {("vit", "colour", "seven"), ("cnn", "blur", "two"), ("vit", "original", "zero"), ("cnn", "colour", "zero")}
    acc = iter([0.9, 0.7, 0.8, 0.4, 0.6, 0.3, 0.85, 0.5, 0.75, 0.2, 0.65, 0.1, 0.95, 0.55])
    rows = [{"classifier": c, "scenario": s, "class_name": k, "accuracy": next(acc)}
            for c in ("cnn", "vit") for s in ("original", "blur", "colour") for k in ("zero", "two", "seven")
            if (c, s, k) not in missing]
    table, info = fit(pd.DataFrame(rows), ["vit", "cnn"])
    assert list(table["variable"]) == ["Intercept", "classifier[cnn]", "scenario[blur]", "scenario[colour]",
                                       "class[two]", "class[zero]"]
    assert table["estimate"].tolist() == pytest.approx(
        [0.745335820896, 0.050559701493, -0.363666044776, -0.051026119403, -0.132416044776, 0.036473880597], abs=1e-11)
    assert table["std_error"].tolist() == pytest.approx(
        [0.170725183502, 0.137727048879, 0.164339045513, 0.168680496766, 0.164339045513, 0.168680496766], abs=1e-11)
    assert table["p_value"].tolist() == pytest.approx(
        [0.002394240503, 0.723064660041, 0.057818806668, 0.76998551028, 0.443676026575, 0.834219759744], abs=1e-11)
    assert list(table["significance"]) == ["**", "ns", "ns", "ns", "ns", "ns"]
    assert info == {"r_squared": 0.4495, "n_cells": 14, "formula": "accuracy ~ C(classifier, Treatment('vit')) + "
                    "C(scenario, Treatment('original')) + C(class_name)"}


def test_mask_quality_check_by_hand():
    from pipeline.sources.mask_quality import MaskBounds, assess, iou, main_component

    m = np.zeros((10, 10), bool)
    m[1:4, 1:4] = True  # 9 px
    m[7, 7] = True  # 1 px: main share 0.9
    got = assess(m, MaskBounds(0.05, 0.9, 0.9))
    assert got["mask_area"] == 0.1 and got["mask_components"] == 2 and got["mask_main_share"] == 0.9
    assert got["mask_unusable"] is None
    assert "main component" in assess(m, MaskBounds(0.05, 0.9, 0.95))["mask_unusable"]
    assert "< 0.2" in assess(m, MaskBounds(0.2, 0.9, 0.5))["mask_unusable"]
    assert main_component(m).sum() == 9
    assert iou(m, main_component(m)) == pytest.approx(0.9)


def test_guided_filter_keeps_a_constant_and_follows_edges():
    from pipeline.sources.attention_maps import guided_filter

    guide = np.zeros((16, 16))
    guide[:, 8:] = 1.0
    flat = np.full((16, 16), 0.3)
    assert np.allclose(guided_filter(guide, flat, 2, 1e-3), 0.3)
    blurry = np.clip((np.arange(16) - 4) / 8, 0, 1)[None, :].repeat(16, 0)  # a soft ramp
    out = guided_filter(guide, blurry, 2, 1e-4)
    assert out[:, 7].max() < 0.5 < out[:, 8].min()  # the step of the guide, not the ramp


def test_released_layout_is_indexed(tmp_path):
    from PIL import Image

    from pipeline.labels import label_space
    from pipeline.sources import detect_kind, open_source
    from pipeline.sources.ximagenet import XIMAGENET_CLASSES

    assert len(XIMAGENET_CLASSES) == 12
    assert XIMAGENET_CLASSES["n02992211"][0] == 486 and XIMAGENET_CLASSES["n07614500"][0] == 928
    img = Image.new("RGB", (8, 8), (10, 20, 30))
    for folder, ext, suffix in (("image", "JPEG", ""), ("blur_background", "JPEG", ""), ("segmented_image", "png", "_segmented")):
        for wnid in ("n01689811", "n02992211"):
            d = tmp_path / folder / wnid
            d.mkdir(parents=True)
            for i in (3, 17):
                img.save(d / f"{wnid}_{i}{suffix}.{ext}", format="PNG" if ext == "png" else "JPEG")
    (tmp_path / "segmented_image" / "n01689811" / "n01689811_99_segmented.png").write_bytes(
        (tmp_path / "segmented_image" / "n01689811" / "n01689811_3_segmented.png").read_bytes()
    )
    assert detect_kind(str(tmp_path)) == "ximagenet"
    src = open_source(str(tmp_path), label_space("imagenet"))
    assert src.kind == "ximagenet" and src.shifts == ["blur_background", "segmented_image"]
    assert src.classes == [44, 486] and src.seeds == [0, 1] and src.scales == [0.0, 1.0]
    row = next(r for r in src.rows if r["trajectory_id"] == "segmented_image/044/seed_0001")
    assert row["paths"][0].endswith("image/n01689811/n01689811_3.JPEG")  # sorted names: _17 before _3
    assert row["paths"][1].endswith("n01689811_3_segmented.png")
    assert any("1 scenario image" in n for n in src.notes)
    assert "robustness_score" in src.analyses


def test_unknown_class_folder_in_the_release_is_a_clear_error(tmp_path):
    from PIL import Image

    from pipeline.labels import label_space
    from pipeline.sources import SourceError
    from pipeline.sources.ximagenet import load_ximagenet

    for folder in ("image/n01689811", "blur_object/n01689811", "blur_object/lizards"):
        (tmp_path / folder).mkdir(parents=True)
        Image.new("RGB", (4, 4)).save(tmp_path / folder / "n01689811_1.png")
    with pytest.raises(SourceError, match="class folder 'lizards' in 'blur_object'"):
        load_ximagenet(str(tmp_path), label_space("imagenet"))


def test_masked_scenario_config_errors():
    from pathlib import Path

    from pipeline.assets import missing_assets
    from pipeline.config import ConfigError, load_config

    world = Path(__file__).resolve().parents[1] / "configs" / "world_ximagenet.yaml"
    with pytest.raises(ConfigError, match="unknown scenario 'blur_bg'"):
        load_config(world, {"benchmark": {"shifts": ["blur_bg"]}})
    cfg = load_config(world, {"benchmark": {"scales": [0, 1, 2]}})
    assert any("strengths must be in [0, 1]" in p for p in missing_assets(cfg))
    cfg = load_config(world, {"source": {"masks": {"kind": "none", "options": {}}}})
    assert any("needs object masks" in p for p in missing_assets(cfg))
    cfg = load_config(world, {"source": {"masks": {"options": {"treshold": 0.3}}}})
    assert any("source.masks.options.treshold" in p for p in missing_assets(cfg))


def test_random_background_class_lies_outside_the_benchmark_and_the_source_prepares_it():
    from pipeline.assets import missing_assets
    from pipeline.config import load_config
    from pipeline.families.base import extra_source_classes
    from pipeline.families.masked_scenario import resolve_background_class
    from pipeline.labels import label_space

    world = Path(__file__).resolve().parents[1] / "configs" / "world_ximagenet.yaml"
    assert extra_source_classes(load_config(world)) == [9]  # 'nine', n02123159's stand-in: its tokens are installed
    inside = load_config(world, {"generator": {"options": {"background_class": "two"}}})
    assert any("class 2 (two) is a class of the benchmark" in p for p in missing_assets(inside))
    wnid = load_config(world, {"generator": {"options": {"background_class": "n02123159"}}})
    assert any("is not ImageNet-1k" in p for p in missing_assets(wnid))
    assert extra_source_classes(load_config(world, {"generator": {"options": {"background_class": None}}})) == []
    assert resolve_background_class("n02123159", label_space("imagenet")) == 282  # tiger cat, outside the 12


@pytest.mark.skipif(not (Path(__file__).resolve().parents[1] / "assets" / "world" / "world.json").is_file(), reason="assets/world not trained")
def test_evaluate_on_a_release_tree_reports_scenarios_and_score(tmp_path):
    """A small tree in the released layout, made of held-out world digits: evaluate in process."""
    from pipeline.cli import main
    from pipeline.demo.world_data import load_digits_tensor, split, to_pil
    from pipeline.families.masked_scenario.scenarios import apply

    x, y = load_digits_tensor()
    _, test = split(y)
    root = tmp_path / "x12"
    picks = {c: [int(i) for i in test if int(y[i]) == c][:5] for c in (3, 7)}
    for c, idx in picks.items():
        other = picks[7 if c == 3 else 3]
        for k, i in enumerate(idx):
            img = np.asarray(to_pil(x[i : i + 1])[0])
            mask = img.mean(-1) >= 64
            bg = np.asarray(to_pil(x[other[k] : other[k] + 1])[0])
            for folder, out in (
                ("image", img),
                ("segmented_image", apply("segmented_image", img, mask, 1.0, {})),
                ("Rand_bg", apply("random_background", img, mask, 1.0, {"background": bg})),
            ):
                d = root / folder / f"{c:03d}_digit"
                d.mkdir(parents=True, exist_ok=True)
                from PIL import Image

                Image.fromarray(out).save(d / f"img_{k:02d}.png")
    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    rc = main(["evaluate", str(root), "--config", str(repo / "configs" / "demo.yaml"), "--output", str(out),
               "--classifiers", "linear,cnn", "--runner", "local"])
    assert rc == 0
    score = pd.read_csv(out / "report" / "robustness_score.csv")
    assert list(score["classifier"]) == ["linear", "cnn"] and score["score"].notna().all()
    acc = pd.read_csv(out / "report" / "scenario_accuracy.csv").set_index(["classifier", "scenario"])
    assert set(acc.index.get_level_values("scenario")) == {"random_background", "segmented_image"}
    assert acc.loc[("cnn", "random_background"), "C"] < acc.loc[("cnn", "segmented_image"), "C"]
    assert acc["C_prime"].notna().all()
    assert (out / "report" / "regression.csv").is_file()
