"""Evaluate-only mode: existing images through the classifier pool (and optionally the filter).

Sources: a fake published CNS-Bench folder (JPEGs + ``annotations_cns.json``), a
``cnsbench build`` output (WebDataset tars + samples Parquet, and the tars alone), and
class folders with a label map.  Models are the tiny random-weight ones (configs/tiny.yaml).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import yaml
from PIL import Image

from pipeline.cli import TINY_CONFIG
from pipeline.config import load_config
from pipeline.labels import label_space
from pipeline.sources import SourceError, detect_kind, open_source
from pipeline.stages.load import LoadStage

CLASSES = [(22, "bald eagle"), (1, "goldfish")]
SHIFTS = ["painting_style", "heavy_snow"]
SEEDS = [3, 34]
SCALES = [0.0, 1.0, 2.0]
IMAGENET = label_space("imagenet")


@pytest.fixture(scope="module", autouse=True)
def _few_threads():
    """Tiny models gain nothing from intra-op threads on a busy 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_assets():
    from pipeline.demo.assets import ensure_tiny_assets

    return ensure_tiny_assets()


def evaluate_cli(argv: list[str]) -> int:
    """``cnsbench evaluate ...`` through its own argparse registration (as cli.main would)."""
    from pipeline.cli.evaluate import register as add_cli

    parser = argparse.ArgumentParser()
    add_cli(parser.add_subparsers())
    args = parser.parse_args(["evaluate", *argv])
    return args.func(args)


def read_dir(out: Path, kind: str) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(p) for p in sorted((out / kind).glob("*.parquet"))], ignore_index=True)


def random_jpeg(path: Path, rng: np.random.Generator, size: int = 32) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path, quality=90)


def make_cns(root: Path, *, seeds=SEEDS, scales=SCALES) -> dict:
    """A miniature of the published layout: {shift}/{NNN_name}/seed_SSSS_scale_XXXX.jpg + annotations."""
    rng = np.random.default_rng(0)
    images = []
    for shift in SHIFTS:
        for cls, name in CLASSES:
            for seed in seeds:
                for scale in scales:
                    rel = f"{shift}/{cls:03d}_{name}/seed_{seed:04d}_scale_{round(scale * 1000):04d}.jpg"
                    random_jpeg(root / rel, rng)
                    images.append({"image": rel, "seed": seed, "scale": scale, "shift": shift, "class": cls})
    ann = {"info": {"name": "mini"}, "scales": list(scales), "classes": [n for _, n in CLASSES], "shifts": SHIFTS,
           "images": images}
    (root / "annotations_cns.json").write_text(json.dumps(ann))
    return ann


@pytest.fixture(scope="module")
def cns(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cns") / "CNS-Bench"
    make_cns(root)
    return root


# --------------------------------------------------------------------------- sources
def test_cns_source_groups_trajectories(cns):
    src = open_source(str(cns), IMAGENET)
    assert src.kind == "cns" and detect_kind(str(cns)) == "cns"
    assert detect_kind(str(cns / "annotations_cns.json")) == "cns"
    assert len(src.rows) == len(SHIFTS) * len(CLASSES) * len(SEEDS) and src.n_images == 24
    assert src.scales == SCALES and src.classes == [1, 22] and src.seeds == SEEDS
    assert src.image_format == "jpg"
    row = next(r for r in src.rows if r["trajectory_id"] == "painting_style/022/seed_0034")
    assert (row["class_id"], row["class_name"], row["seed"], row["shift"]) == (22, "bald eagle", 34, "painting_style")
    assert row["scales"] == SCALES
    assert row["sample_ids"] == [f"painting_style/022/seed_0034_scale_{t}" for t in ("0000", "1000", "2000")]
    assert row["paths"][1].endswith("painting_style/022_bald eagle/seed_0034_scale_1000.jpg")


def test_cns_scale0_shared_across_shifts(tmp_path):
    ann = make_cns(tmp_path, seeds=[1])
    # Keep scale 0 only under painting_style: heavy_snow borrows it.
    ann["images"] = [e for e in ann["images"] if e["scale"] != 0.0 or e["shift"] == "painting_style"]
    (tmp_path / "annotations_cns.json").write_text(json.dumps(ann))
    src = open_source(str(tmp_path), IMAGENET)
    snow = next(r for r in src.rows if r["trajectory_id"] == "heavy_snow/001/seed_0001")
    paint = next(r for r in src.rows if r["trajectory_id"] == "painting_style/001/seed_0001")
    assert snow["scales"] == SCALES and snow["paths"][0] == paint["paths"][0]
    assert snow["sample_ids"][0] == "heavy_snow/001/seed_0001_scale_0000"
    assert any("scale-0 image of another shift" in n for n in src.notes)


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda a: "{not json", "not valid JSON"),
        (lambda a: {"images": {"a": 1}}, "'images' must be a list"),
        (lambda a: {**a, "images": [{k: v for k, v in a["images"][0].items() if k != "seed"}]}, "lacks key 'seed'"),
        (lambda a: {**a, "images": [{**a["images"][0], "class": 7}]}, "says class 22, the entry says 7"),
        (lambda a: {**a, "images": [{**a["images"][0], "shift": "heavy_snow"}]}, "lies in folder 'painting_style'"),
        (lambda a: {**a, "images": [a["images"][0], a["images"][0]]}, "a second image"),
        (lambda a: {**a, "images": [{**a["images"][0], "scale": 0.7}]}, "not among the declared scales"),
        (lambda a: {**a, "images": [{**a["images"][0], "image": "painting_style/bald eagle/x.jpg"}]},
         "must start with the ImageNet class index"),
        (lambda a: {**a, "images": [{**a["images"][0], "image": a["images"][0]["image"].replace("seed_", "seed_9")}]},
         "not found"),
    ],
)
def test_cns_malformed_sources_name_file_and_problem(cns, tmp_path, corrupt, message):
    ann = json.loads((cns / "annotations_cns.json").read_text())
    bad = corrupt(ann)
    for p in cns.iterdir():  # same images, new annotations
        if p.is_dir():
            shutil.copytree(p, tmp_path / p.name)
    (tmp_path / "annotations_cns.json").write_text(bad if isinstance(bad, str) else json.dumps(bad))
    with pytest.raises(SourceError) as err:
        open_source(str(tmp_path), IMAGENET)
    assert message in str(err.value) and "annotations_cns.json" in str(err.value)


def test_unknown_layout_and_missing_source(tmp_path):
    (tmp_path / "readme.txt").write_text("nothing here")
    with pytest.raises(SourceError, match="cannot tell what kind of source"):
        open_source(str(tmp_path), IMAGENET)
    with pytest.raises(SourceError, match="source not found"):
        open_source(str(tmp_path / "nope"), IMAGENET)


def test_load_stage_fails_unreadable_image_as_its_trajectory(cns, tmp_path):
    cfg = load_config(TINY_CONFIG)
    src = open_source(str(cns), IMAGENET)
    rows = [dict(r) for r in src.rows[:2]]
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not a jpeg")
    rows[1]["paths"] = [str(broken)] + rows[1]["paths"][1:]
    out = LoadStage(cfg.model_copy(update={"output": cfg.output.model_copy(update={"image_format": "jpg"})}),
                    fill_filter=True)(pa.Table.from_pylist(rows)).to_pylist()
    ok, bad = out
    assert ok["error"] is None and len(ok["images"]) == 3
    assert ok["images"][0] == Path(src.rows[0]["paths"][0]).read_bytes()  # published JPEG bytes kept as they are
    assert math.isnan(ok["clip_text"][0]) and ok["kept"] == [True] * 3 and ok["n_pass"] == [0] * 3
    assert bad["error"].startswith("[load] cannot read image") and str(broken) in bad["error"]
    assert bad["images"] == [] and bad["kept"] == []
    # With the filter next, a trajectory without a scale-0 reference is failed up front.
    rows[0]["scales"], rows[0]["paths"] = [1.0, 2.0], rows[0]["paths"][1:]
    out = LoadStage(cfg)(pa.Table.from_pylist(rows[:1])).to_pylist()
    assert "no scale-0 image" in out[0]["error"]


# --------------------------------------------------------------------------- evaluate
def test_evaluate_published_layout_local(tiny_assets, cns, tmp_path, capsys):
    out = tmp_path / "eval"
    argv = [str(cns), "--config", str(TINY_CONFIG), "--output", str(out), "--runner", "local"]
    assert evaluate_cli(argv) == 0
    samples, preds = read_dir(out, "samples"), read_dir(out, "predictions")
    assert len(samples) == 24 and samples["sample_id"].is_unique
    assert set(samples["class_id"]) == {1, 22}
    labels = samples.set_index("sample_id")["class_id"]
    assert labels["painting_style/022/seed_0034_scale_2000"] == 22 and labels["heavy_snow/001/seed_0003_scale_0000"] == 1
    assert samples.groupby("trajectory_id").size().eq(3).all()
    # filter off: NaN scores, nothing removed
    assert samples["clip_text"].isna().all() and samples["kept"].all() and samples["n_pass"].eq(0).all()
    names = [c.name for c in load_config(TINY_CONFIG).classifiers]
    assert preds.groupby("classifier").size().to_dict() == {n: 24 for n in names}
    merged = preds.merge(samples[["sample_id", "class_id"]], on="sample_id")
    assert (merged["correct"] == (merged["top1"] == merged["class_id"])).all()
    # same layout and report as a build; the effective config describes the source
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["benchmark"]["scales"] == SCALES and config["filter"]["enabled"] is False
    assert config["output"]["image_format"] == "jpg"
    assert (out / "report" / "index.html").is_file() and (out / "manifest").is_dir()
    assert json.loads((out / "source.json").read_text())["kind"] == "cns"
    acc = pd.read_csv(out / "report" / "accuracy.csv")
    assert set(acc["classifier"]) == set(names) and set(acc["scale"]) == set(SCALES)
    assert not (out / "report" / "shift_realisation.csv").exists()  # no filter, no measures
    # resume: everything committed is skipped
    capsys.readouterr()
    assert evaluate_cli(argv) == 0
    assert "8 already done, 0 to evaluate" in capsys.readouterr().out
    # settings that would change existing rows are refused
    from pipeline.output_run import IncompatibleOutput

    with pytest.raises(IncompatibleOutput, match="filter.enabled"):
        evaluate_cli(argv + ["--filter"])


def test_evaluating_with_one_more_classifier_predicts_it_on_every_committed_image(tiny_assets, cns, tmp_path,
                                                                                 capsys, monkeypatch):
    from pipeline.cli import main
    from pipeline.output_run import Running

    out = tmp_path / "eval-more"
    argv = [str(cns), "--config", str(TINY_CONFIG), "--output", str(out), "--runner", "local", "--classifiers"]
    assert evaluate_cli(argv + ["tiny-resnet"]) == 0
    # A run that wrote the config and stopped before adding the classifier (as every second
    # evaluate did): status does not count its images as classified, and names what to run.
    with monkeypatch.context() as m:
        m.setattr(Running, "add_classifiers", lambda self: None)
        assert evaluate_cli(argv + ["tiny-resnet,tiny-vit"]) == 0
    capsys.readouterr()
    assert main(["status", str(out)]) == 3
    shown = capsys.readouterr().out
    assert "classified  0/24 images (0/8 trajectories)" in shown
    assert "lack predictions of tiny-vit, which the config lists; run `cnsbench evaluate" in shown
    # The same command adds it: every kept image gets the new classifier's prediction.
    assert evaluate_cli(argv + ["tiny-resnet,tiny-vit"]) == 0
    assert "adding predictions of tiny-vit to" in capsys.readouterr().out
    samples, preds = read_dir(out, "samples"), read_dir(out, "predictions")
    kept = set(samples.loc[samples["kept"], "sample_id"])
    assert len(kept) == 24
    assert preds.groupby("classifier")["sample_id"].apply(set).to_dict() == {"tiny-resnet": kept, "tiny-vit": kept}
    assert not preds.duplicated(["sample_id", "classifier"]).any()
    listed = [c["name"] for c in json.loads((out / "config.json").read_text())["config"]["classifiers"]]
    assert listed == ["tiny-resnet", "tiny-vit"]
    assert set(pd.read_csv(out / "report" / "accuracy.csv")["classifier"]) == {"tiny-resnet", "tiny-vit"}
    assert main(["status", str(out)]) == 0
    assert "classified  24/24 images (8/8 trajectories)" in capsys.readouterr().out


def test_evaluate_published_layout_with_filter(tiny_assets, cns, tmp_path):
    # In process: evaluate on Ray (one actor pool per classifier group) is
    # test_classify_groups.py's, the filter stage on Ray every Ray build's.
    from pipeline.models.detectors import keep_decision

    out = tmp_path / "eval-filter"
    code = evaluate_cli(
        [str(cns), "--config", str(TINY_CONFIG), "--output", str(out), "--runner", "local", "--filter",
         "--classifiers", "tiny-resnet"]
    )
    assert code == 0
    samples, preds = read_dir(out, "samples"), read_dir(out, "predictions")
    assert len(samples) == 24 and len(preds) == 24 and set(preds["classifier"]) == {"tiny-resnet"}
    cfg = load_config(TINY_CONFIG)
    scores = {c: samples[c].tolist() for c in ("clip_text", "clip_shift_text", "clip_image", "dino_image")}
    assert samples["dino_image"].notna().all() and samples["clip_shift_alignment"].notna().all()
    assert (samples["n_pass"].tolist(), samples["kept"].tolist()) == keep_decision(
        scores, cfg.filter.thresholds, cfg.filter.min_pass
    )
    zero = samples[samples["scale"] == 0]
    assert zero["dino_image"].round(4).eq(1.0).all()
    real = pd.read_csv(out / "report" / "shift_realisation.csv")
    assert set(real["shift"]) == set(SHIFTS) and len(real) == 6
    assert real.loc[real["scale"] == 0, "clip_shift_alignment_delta"].eq(0).all()
    assert "shift_realisation.png" in (out / "report" / "index.html").read_text()


def small_config(tmp_path: Path) -> Path:
    """The tiny config cut to 2 trajectories of 2 scales, 10 steps and two classifiers (fast on CPU)."""
    raw = yaml.safe_load(TINY_CONFIG.read_text())
    raw["benchmark"].update(seeds=[1], shifts=["painting_style"], scales=[0, 2.5])
    raw["generator"]["steps"] = 10
    raw["classifiers"] = raw["classifiers"][:2]
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(raw).replace("../assets/", str(TINY_CONFIG.parent.parent / "assets") + "/"))
    return path


def test_evaluate_build_output_reproduces_its_predictions(tiny_assets, tmp_path):
    from pipeline.cli import main

    cfg_path = small_config(tmp_path)
    built = tmp_path / "built"
    assert main(["build", str(cfg_path), "--output", str(built), "--runner", "local"]) == 0
    assert detect_kind(str(built)) == "webdataset"

    out = tmp_path / "re-eval"
    # no --config: the build output's own config supplies classifiers and filter
    assert evaluate_cli([str(built), "--output", str(out), "--runner", "local", "--filter"]) == 0
    key = ["sample_id", "classifier"]
    a = read_dir(built, "predictions").sort_values(key).reset_index(drop=True)
    b = read_dir(out, "predictions").sort_values(key).reset_index(drop=True)
    assert len(a) == 4 * 2 and a[key].equals(b[key])
    assert a["top1"].tolist() == b["top1"].tolist() and a["correct"].tolist() == b["correct"].tolist()
    assert np.allclose(a["p_true"], b["p_true"], atol=1e-5)
    sa = read_dir(built, "samples").sort_values("sample_id").reset_index(drop=True)
    sb = read_dir(out, "samples").sort_values("sample_id").reset_index(drop=True)
    for col in ("trajectory_id", "class_id", "class_name", "seed", "shift", "scale", "n_pass", "kept"):
        assert sa[col].tolist() == sb[col].tolist(), col
    for col in ("clip_text", "clip_shift_text", "clip_image", "dino_image", "clip_shift_alignment"):
        assert np.allclose(sa[col], sb[col], atol=1e-4), col
    # the build's images are referred to, not copied: the reader gets the build's PNG bytes
    from pipeline.aggregate.images import ImageReader
    from pipeline.io.store import OutputStore
    from pipeline.io.webdataset import iter_tar

    def members(root: Path) -> dict:
        return {k: m["png"] for t in sorted(root.glob("images/*.tar")) for k, m in iter_tar(t.read_bytes(), str(t))}

    assert not list(out.rglob("*.tar")) and json.loads((out / "images.json").read_text())["images"] == str(built)
    assert ImageReader(OutputStore(str(out)), sb).many(list(sb["sample_id"])) == members(built)

    # the tars alone: coordinates and labels from each member's JSON
    bare = tmp_path / "tars"
    bare.mkdir()
    for t in built.glob("images/*.tar"):
        shutil.copy(t, bare / t.name)
    src = open_source(str(bare), IMAGENET)
    ref = open_source(str(built), IMAGENET)
    # (a build output's rows also carry its filter's decisions: `source_filter`, which bare tars lack)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("paths", "source_filter")} for r in rows]  # noqa: E731
    assert src.kind == "webdataset" and strip(src.rows) == strip(ref.rows)
    assert all("source_filter" in r for r in ref.rows) and not any("source_filter" in r for r in src.rows)


def test_class_folders_with_label_map(tiny_assets, tmp_path):
    rng = np.random.default_rng(1)
    root = tmp_path / "folders"
    for folder, n in (("n01443537", 3), ("eagles", 2)):
        for i in range(n):
            random_jpeg(root / folder / f"img_{i}.jpg", rng)
    (root / "eagles" / "notes.txt").write_text("not an image")
    label_map = tmp_path / "map.json"
    label_map.write_text(json.dumps({"n01443537": 1, "eagles": 22, "unused": 5}))
    with pytest.raises(SourceError, match="--label-map"):
        open_source(str(root), IMAGENET)  # 'n01443537' is neither an id prefix nor a class name
    src = open_source(str(root), IMAGENET, label_map=str(label_map))
    assert src.kind == "folders" and len(src.rows) == 5 and src.shifts == ["none"] and src.scales == [0.0]
    assert [r["trajectory_id"] for r in src.rows if r["class_id"] == 22] == ["none/022/seed_0000", "none/022/seed_0001"]

    out = tmp_path / "eval"
    argv = [str(root), "--config", str(TINY_CONFIG), "--output", str(out), "--runner", "local",
            "--label-map", str(label_map), "--classifiers", "tiny-resnet"]
    assert evaluate_cli(argv) == 0
    samples, preds = read_dir(out, "samples"), read_dir(out, "predictions")
    assert sorted(samples["class_id"].tolist()) == [1, 1, 1, 22, 22]
    assert set(samples["class_name"]) == {"goldfish", "bald eagle"} and set(samples["scale"]) == {0.0}
    assert len(preds) == 5 and set(preds["classifier"]) == {"tiny-resnet"}

    bad_map = tmp_path / "bad.json"
    bad_map.write_text(json.dumps({"n01443537": "goldfish"}))
    with pytest.raises(SourceError, match="must be an integer"):
        open_source(str(root), IMAGENET, label_map=str(bad_map))
    bad_map.write_text(json.dumps({"n01443537": 1}))
    with pytest.raises(SourceError, match="'eagles'"):
        open_source(str(root), IMAGENET, label_map=str(bad_map))
    with pytest.raises(ValueError, match="not in the config"):
        evaluate_cli([str(root), "--config", str(TINY_CONFIG), "--output", str(tmp_path / "x"),
                      "--label-map", str(label_map), "--classifiers", "resnet-nope"])
