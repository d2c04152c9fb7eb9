"""Classifier groups under a memory budget: packing, and predictions identical whatever the grouping."""

from __future__ import annotations

import argparse
import io
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from PIL import Image

from pipeline.plan import schema
from buildproc import FAST_ZERO_SHOT as FAST

from pipeline.runtime.checkout import TINY_CONFIG
from pipeline.config import load_config
from pipeline.perf.memory import GB, RUNTIME_BYTES, Footprint, classifier_footprints, classifier_groups, group_bytes, pack
from pipeline.stages.classify import ClassifyStage, classify_specs

MB = 1024**2
pytestmark = pytest.mark.usefixtures("tiny_assets_one_thread")


def fp(name: str, weights_mb: int, act_mb: int = 0) -> Footprint:
    return Footprint(name, weights_mb * MB // 4, weights_mb * MB, act_mb * MB)


def test_pack_fits_the_budget_largest_first():
    sizes = [fp("a", 300), fp("b", 2000, 100), fp("c", 900), fp("d", 100, 400), fp("e", 5000)]
    budget = RUNTIME_BYTES + 2200 * MB
    groups = pack(sizes, budget)
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3, 4]
    assert groups == [[0, 2, 3], [1], [4]]  # b (2.1 GB) first, then c, a, d fill a second group; e alone
    for g in groups:
        assert g == sorted(g)
        if len(g) > 1:
            assert group_bytes([sizes[i] for i in g]) <= budget
    # activations count once per group (the models run one after the other)
    assert group_bytes([sizes[0], sizes[3]]) == RUNTIME_BYTES + 400 * MB + 400 * MB
    assert pack(sizes, 100 * GB) == [[0, 1, 2, 3, 4]]


@pytest.fixture(scope="module")
def whole():
    """The tiny config's classifiers in one stage, and what it makes of a batch."""
    stage = ClassifyStage(load_config(TINY_CONFIG, sets=FAST), device="cpu")
    return stage, stage(filtered_rows())


def test_footprints_of_the_tiny_classifiers_are_their_parameters(whole):
    stage, _ = whole
    for f, clf in zip(classifier_footprints(stage.config), stage.classifiers, strict=True):
        assert f.params == sum(p.numel() for p in clf.model.parameters()), f.name
        assert f.weight_bytes == 4 * f.params and f.activation_bytes > 0 and not f.note


def test_budget_groups_and_the_chain():
    cfg = load_config(TINY_CONFIG)
    assert classifier_groups(cfg) == [[0, 1, 2]] and len(classify_specs(cfg)) == 1
    tight = load_config(TINY_CONFIG, sets=["resources.classify.memory_budget_gb=0.1"])  # below any actor
    assert classifier_groups(tight) == [[0], [1], [2]]
    specs = classify_specs(tight)
    assert [s.kwargs for s in specs] == [
        {"classifiers": [0], "done": []},
        {"classifiers": [1], "done": [0]},
        {"classifiers": [2], "done": [0, 1]},
    ]
    roomy = load_config(TINY_CONFIG, sets=["resources.classify.memory_budget_gb=4"])
    assert classifier_groups(roomy) == [[0, 1, 2]]


def png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def filtered_rows() -> pa.Table:
    scales = [0.0, 1.0]
    rows = [
        dict(trajectory_id=f"snow/{c:03d}/seed_1", unit_id=f"u{c}", class_id=c, class_name="x", seed=1, shift="snow",
             scales=scales, sample_ids=[f"s{c}_{i}" for i in range(2)], images=[png(10 * c + i) for i in range(2)],
             unet_evals=1.0, gen_seconds=0.1, error=None, clip_text=[30.0] * 2, clip_shift_text=[30.0] * 2,
             clip_image=[1.0] * 2, dino_image=[1.0] * 2, n_pass=[2] * 2, kept=[True] * 2)
        for c in (1, 22)
    ]
    rows.append(dict(trajectory_id="snow/002/seed_9", unit_id="u9", class_id=2, class_name="y", seed=9, shift="snow",
                     scales=[], sample_ids=[], images=[], unet_evals=0.0, gen_seconds=0.0, error="boom", clip_text=[],
                     clip_shift_text=[], clip_image=[], dino_image=[], n_pass=[], kept=[]))
    return pa.Table.from_pylist(rows, schema=schema.FILTERED)


@pytest.mark.parametrize("groups", [[[0], [1], [2]], [[1], [0, 2]]])
def test_stages_per_group_give_the_one_stage_columns(groups, whole):
    cfg = load_config(TINY_CONFIG, sets=FAST)
    out, done = filtered_rows(), []
    for g in groups:
        out = ClassifyStage(cfg, device="cpu", classifiers=g, done=done)(out)
        done += g
    assert out.schema.equals(schema.CLASSIFIED)
    assert out.to_pylist() == whole[1].to_pylist()
    assert len(out.column("pred_top1")[0].as_py()[0]) == 3


def test_overlapping_groups_are_refused():
    with pytest.raises(ValueError, match="disjoint"):
        ClassifyStage(load_config(TINY_CONFIG), device="cpu", classifiers=[0, 1], done=[1])


def published(root: Path) -> Path:
    """A small published CNS-Bench layout: 1 shift x 2 classes x 1 seed x 2 scales."""
    images = []
    for cls, name in ((1, "goldfish"), (22, "bald eagle")):
        for scale in (0.0, 2.0):
            rel = f"snow/{cls:03d}_{name}/seed_0001_scale_{round(scale * 1000):04d}.png"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(png(cls + int(scale)))
            images.append({"image": rel, "seed": 1, "scale": scale, "shift": "snow", "class": cls})
    ann = {"info": {"name": "mini"}, "scales": [0.0, 2.0], "classes": ["goldfish", "bald eagle"], "shifts": ["snow"],
           "images": images}
    (root / "annotations_cns.json").write_text(json.dumps(ann))
    return root


def evaluate(source: Path, out: Path, *argv: str) -> Path:
    """``cnsbench evaluate SOURCE --config tiny.yaml`` (one prompt template) into ``out``."""
    from pipeline.cli.evaluate import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    fast = [f"--set={item}" for item in FAST]
    args = parser.parse_args(["evaluate", str(source), "--config", str(TINY_CONFIG), "--output", str(out), *fast, *argv])
    assert args.func(args) == 0
    return out


@pytest.fixture(scope="module")
def one_group(tmp_path_factory) -> tuple[Path, Path]:
    """The published source, and its evaluation by one classify stage holding every classifier."""
    root = tmp_path_factory.mktemp("groups")
    source = published(root / "src")
    return source, evaluate(source, root / "one", "--runner", "local")


def assert_same_predictions(one: Path, other: Path, budget: float = 0.1) -> None:
    files = sorted(p.name for p in (one / "predictions").glob("*.parquet"))
    assert files and files == sorted(p.name for p in (other / "predictions").glob("*.parquet"))
    for name in files:
        a, b = pd.read_parquet(one / "predictions" / name), pd.read_parquet(other / "predictions" / name)
        pd.testing.assert_frame_equal(a, b)
        assert list(dict.fromkeys(a["classifier"])) == ["tiny-resnet", "tiny-vit", "tiny-clip-zs"]
        assert (one / "predictions" / name).read_bytes() == (other / "predictions" / name).read_bytes()
    recorded = json.loads((other / "config.json").read_text())["config"]
    assert recorded["resources"]["classify"]["memory_budget_gb"] == budget


def test_evaluate_one_group_equals_one_classifier_per_group(one_group, tmp_path):
    source, one = one_group
    each = evaluate(source, tmp_path / "each", "--runner", "local", "--set", "resources.classify.memory_budget_gb=0.1")
    assert_same_predictions(one, each)


def two_group_budget() -> float:
    """A budget (GB) that packs the tiny classifiers as [[resnet, vit], [clip]]: it fits the
    first pair exactly, the clip model joins neither."""
    fps = classifier_footprints(load_config(TINY_CONFIG))
    return math.ceil(group_bytes([fps[0], fps[1]]) / GB * 1e4) / 1e4


@pytest.mark.slow
def test_ray_runs_one_actor_pool_per_group(one_group, tmp_path, ray_session):
    # Two groups, so two classify pools, with the filter stage before them (it scores
    # images, it drops none): the predictions do not change, and the samples carry its scores.
    source, one = one_group
    budget = two_group_budget()
    assert classifier_groups(load_config(TINY_CONFIG, sets=[f"resources.classify.memory_budget_gb={budget}"])) == [[0, 1], [2]]
    each = evaluate(source, tmp_path / "ray", "--runner", "ray", "--filter",
                    "--set", f"resources.classify.memory_budget_gb={budget}")
    assert_same_predictions(one, each, budget)
    samples = pd.concat(pd.read_parquet(p) for p in (each / "samples").glob("*.parquet"))
    assert len(samples) == 4 and samples["dino_image"].notna().all() and samples["n_pass"].notna().all()


def test_reclassify_loads_one_group_at_a_time(whole):
    from pipeline.stages.reclassify import ReclassifyStage

    cfg = load_config(TINY_CONFIG, sets=[*FAST, "resources.classify.memory_budget_gb=0.1"])
    stage = ReclassifyStage(cfg, device="cpu")
    stage._classify = {}
    rows, ordered = stage._classified(("tiny-clip-zs", "tiny-resnet"), filtered_rows().to_pylist())
    assert ordered == ["tiny-resnet", "tiny-clip-zs"] and stage._classify == {}  # nothing stays loaded
    for got, full in zip(rows, whole[1].to_pylist(), strict=True):
        for key in ("pred_top1", "pred_top5", "pred_p_true"):
            assert got[key] == [[per_image[0], per_image[2]] for per_image in full[key]]


def test_vlm_groups_run_after_the_rankings_they_draw_from(monkeypatch):
    import pipeline.config.vqa as vqa

    cfg = load_config(TINY_CONFIG, sets=["resources.classify.memory_budget_gb=4"])
    monkeypatch.setattr(vqa, "asks", lambda kind: kind == "open_clip_zeroshot")  # stands in for a vlm
    groups = classifier_groups(cfg)
    assert groups == [[0, 1], [2]]  # everything would fit one group; the asking one is packed apart, last
    specs = classify_specs(cfg)
    assert [s.kwargs for s in specs] == [{"classifiers": [0, 1], "done": []}, {"classifiers": [2], "done": [0, 1]}]
