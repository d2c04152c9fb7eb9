"""Out-of-class filter: keep rule, detector scores on tiny local models, the filter stage."""

from __future__ import annotations

import io
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from pipeline.plan import schema
from pipeline.config import FilterSpec, Thresholds
from pipeline.demo.tiny_eval_models import make_tiny_clip, make_tiny_dino, make_tiny_timm_classifier
from pipeline.models.detectors import OOCFilter, keep_decision
from pipeline.models.keep_all import KeepAll

SCALES = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
T = Thresholds(clip_text=30.0, clip_shift_text=35.0, clip_image=0.8, dino_image=0.75)


def scores(ct, cst, ci, di):
    return {"clip_text": ct, "clip_shift_text": cst, "clip_image": ci, "dino_image": di}


# --------------------------------------------------------------------------- keep rule
def test_keep_decision_two_of_four():
    s = scores(
        [31.0, 29.0, 31.0, 29.0],
        [36.0, 34.0, 34.0, 34.0],
        [0.9, 0.9, 0.7, 0.7],
        [0.8, 0.8, 0.7, 0.76],
    )
    n_pass, kept = keep_decision(s, T, 2)
    assert n_pass == [4, 2, 1, 1]
    assert kept == [True, True, False, False]


def test_keep_decision_exactly_at_threshold_fails():
    s = scores([30.0], [35.0], [0.8], [0.75])
    assert keep_decision(s, T, 1) == ([0], [False])
    # The smallest step above each threshold passes: the comparison is strict >.
    s = scores([30.0001], [35.0001], [0.8001], [0.7501])
    assert keep_decision(s, T, 4) == ([4], [True])


def test_keep_decision_min_pass_bounds_and_nan():
    s = scores([0.0, 99.0], [0.0, 99.0], [0.0, 1.0], [math.nan, 1.0])
    assert keep_decision(s, T, 0) == ([0, 4], [True, True])  # min_pass 0 keeps everything
    assert keep_decision(s, T, 4) == ([0, 4], [False, True])  # min_pass 4 needs all four
    assert keep_decision(scores([], [], [], []), T, 2) == ([], [])


def test_keep_decision_rejects_bad_input():
    with pytest.raises(KeyError, match="dino_image"):
        keep_decision({"clip_text": [1.0], "clip_shift_text": [1.0], "clip_image": [1.0]}, T, 2)
    with pytest.raises(ValueError, match="length"):
        keep_decision(scores([1.0], [1.0], [1.0], [1.0, 2.0]), T, 2)


# --------------------------------------------------------------------------- tiny models
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_filter")
    return {"clip": make_tiny_clip(d), "dino": make_tiny_dino(d), "clf": make_tiny_timm_classifier(d, "resnet")}


@pytest.fixture(scope="module")
def ooc(tiny):
    return OOCFilter(FilterSpec(clip=tiny["clip"], dino=tiny["dino"]), "cpu")


def random_images(n: int, seed: int, size: int = 48) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(n)]


def test_scale0_reference_has_cosine_one(ooc):
    images = random_images(len(SCALES), seed=0)
    out = ooc.score_trajectory(images, SCALES, "goldfish", "painting_style")
    assert set(out) == set(schema.SCORE_COLUMNS)
    assert all(len(v) == len(SCALES) for v in out.values())
    assert out["clip_image"][0] == pytest.approx(1.0, abs=1e-5)
    assert out["dino_image"][0] == pytest.approx(1.0, abs=1e-5)
    # Different random images are not identical to the reference.
    assert min(out["dino_image"][1:]) < 0.999
    assert all(0.0 <= v <= 100.0 for v in out["clip_text"] + out["clip_shift_text"])


def test_scale0_need_not_come_first(ooc):
    images = random_images(3, seed=1)
    out = ooc.score_trajectory(images, [1.0, 0.0, 2.0], "goldfish", "snow")
    assert out["clip_image"][1] == pytest.approx(1.0, abs=1e-5)
    assert out["dino_image"][1] == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match="scale-0"):
        ooc.score_trajectory(images, [0.5, 1.0, 2.0], "goldfish", "snow")


def test_prompts_use_shift_words(ooc):
    assert ooc.prompts("bald eagle", "painting_style") == (
        "a photo of a bald eagle",
        "a photo of a bald eagle in painting style",
    )


def test_batch_is_one_forward_per_encoder_and_matches_single(ooc):
    trajs = [
        (random_images(len(SCALES), seed=2), SCALES, "goldfish", "snow"),
        (random_images(len(SCALES), seed=3), SCALES, "tench", "painting_style"),
    ]
    calls = {"clip": 0, "dino": 0}
    clip_model, dino_model = ooc.clip.model, ooc.dino.model
    orig_clip, orig_dino = clip_model.encode_image, dino_model.forward_features

    def count_clip(x, *a, **k):
        calls["clip"] += 1
        return orig_clip(x, *a, **k)

    def count_dino(x, *a, **k):
        calls["dino"] += 1
        return orig_dino(x, *a, **k)

    clip_model.encode_image, dino_model.forward_features = count_clip, count_dino
    try:
        batched = ooc.score_trajectories(trajs)
    finally:
        del clip_model.encode_image, dino_model.forward_features
    assert calls == {"clip": 1, "dino": 1}
    for traj, got in zip(trajs, batched):
        single = ooc.score_trajectory(*traj)
        for k in schema.SCORE_COLUMNS:
            assert got[k] == pytest.approx(single[k], abs=1e-4)


def test_softmax_cls_changes_dino_scores(tiny):
    images = random_images(len(SCALES), seed=4)
    plain = OOCFilter(FilterSpec(clip=tiny["clip"], dino={**tiny["dino"], "softmax_cls": False}), "cpu")
    soft = OOCFilter(FilterSpec(clip=tiny["clip"], dino=tiny["dino"]), "cpu")
    a = plain.score_trajectory(images, SCALES, "goldfish", "snow")["dino_image"]
    b = soft.score_trajectory(images, SCALES, "goldfish", "snow")["dino_image"]
    assert a[0] == pytest.approx(1.0, abs=1e-5) and b[0] == pytest.approx(1.0, abs=1e-5)
    assert a[1:] != pytest.approx(b[1:], abs=1e-4)


def test_missing_weights_name_path_and_key(tiny, tmp_path):
    missing = str(tmp_path / "nope" / "clip.pt")
    with pytest.raises(FileNotFoundError) as err:
        OOCFilter(FilterSpec(clip={**tiny["clip"], "pretrained": missing}, dino=tiny["dino"]), "cpu")
    assert missing in str(err.value) and "filter.clip.pretrained" in str(err.value)

    missing = str(tmp_path / "dino.pth")
    with pytest.raises(FileNotFoundError) as err:
        OOCFilter(FilterSpec(clip=tiny["clip"], dino={**tiny["dino"], "checkpoint": missing}), "cpu")
    assert missing in str(err.value) and "filter.dino.checkpoint" in str(err.value)

    with pytest.raises(ValueError, match="known tags"):
        OOCFilter(FilterSpec(clip={**tiny["clip"], "pretrained": "opnai"}, dino=tiny["dino"]), "cpu")


def test_keep_all_filter():
    out = KeepAll(FilterSpec(), "cpu").evaluate([(random_images(3, seed=5), [0.0, 1.0, 2.0], "goldfish", "snow")])
    assert out[0]["kept"] == [True] * 3 and out[0]["n_pass"] == [0] * 3
    assert all(math.isnan(v) for k in schema.SCORE_COLUMNS for v in out[0][k])


# --------------------------------------------------------------------------- stage
def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def generated_batch(n_ok: int = 2, failed: bool = True) -> pa.Table:
    rows = []
    for t in range(n_ok):
        cid, cname, shift = [(1, "goldfish", "snow"), (0, "tench", "painting_style")][t % 2]
        rows.append(
            dict(
                trajectory_id=f"{shift}/{cid:03d}/seed_{t}", unit_id=f"u{t}", class_id=cid, class_name=cname,
                seed=t, shift=shift, scales=SCALES, sample_ids=[f"s{t}_{i}" for i in range(len(SCALES))],
                images=[png(im) for im in random_images(len(SCALES), seed=10 + t, size=32)],
                unet_evals=1.0, gen_seconds=0.1, error=None,
            )
        )
    if failed:
        rows.append(
            dict(
                trajectory_id="snow/002/seed_9", unit_id="u9", class_id=2, class_name="great white shark", seed=9,
                shift="snow", scales=[], sample_ids=[], images=[], unet_evals=0.0, gen_seconds=0.0,
                error="RuntimeError: CUDA out of memory",
            )
        )
    return pa.Table.from_pylist(rows, schema=schema.GENERATED)


def build_config(tiny, **filter_overrides) -> dict:
    return {
        "benchmark": {"classes": [0, 1], "seeds": [0, 1], "shifts": ["snow", "painting_style"]},
        "filter": {"clip": tiny["clip"], "dino": tiny["dino"], **filter_overrides},
        "classifiers": [tiny["clf"]],
    }


def test_filter_stage_round_trip(tiny):
    from pipeline.stages.filter import FilterStage

    stage = FilterStage(build_config(tiny), device="cpu")
    out = stage(generated_batch())
    assert out.schema.equals(schema.FILTERED)
    rows = out.to_pylist()
    assert [r["trajectory_id"] for r in rows] == [r["trajectory_id"] for r in generated_batch().to_pylist()]
    for r in rows[:2]:
        for k in (*schema.SCORE_COLUMNS, "n_pass", "kept"):
            assert len(r[k]) == len(SCALES), k
        assert r["clip_image"][0] == pytest.approx(1.0, abs=1e-5)
        assert r["dino_image"][0] == pytest.approx(1.0, abs=1e-5)
        assert keep_decision({k: r[k] for k in schema.SCORE_COLUMNS}, stage.config.filter.thresholds, 2) == (
            r["n_pass"], r["kept"]
        )
    failed = rows[2]
    assert failed["error"].startswith("RuntimeError")
    assert all(failed[k] == [] for k in (*schema.SCORE_COLUMNS, "n_pass", "kept"))


def test_filter_stage_disabled_keeps_all(tiny):
    from pipeline.stages.filter import FilterStage

    stage = FilterStage(build_config(tiny, enabled=False), device="cpu")
    rows = stage(generated_batch(n_ok=1, failed=False)).to_pylist()
    assert isinstance(stage.filter, KeepAll)
    assert rows[0]["kept"] == [True] * len(SCALES)
    assert all(math.isnan(v) for v in rows[0]["clip_text"])


def test_filter_stage_registry_none(tiny):
    from pipeline.stages.filter import FilterStage

    stage = FilterStage(build_config(tiny, kind="none"), device="cpu")
    stage.ensure_setup()
    assert isinstance(stage.filter, KeepAll)


def test_tiny_models_are_deterministic(tmp_path):
    import torch

    a = make_tiny_clip(tmp_path / "a")
    b = make_tiny_clip(tmp_path / "b")
    sa, sb = torch.load(a["pretrained"]), torch.load(b["pretrained"])
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert os.path.getsize(a["pretrained"]) < 2_000_000
    da, db = make_tiny_dino(tmp_path / "a"), make_tiny_dino(tmp_path / "b")
    sa, sb = torch.load(da["checkpoint"]), torch.load(db["checkpoint"])
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_same_named_clip_configs_do_not_shadow(tmp_path):
    import json as _json

    from pipeline.config import ClipModelSpec
    from pipeline.models.detectors import ClipEncoder

    a = make_tiny_clip(tmp_path / "a", name="tiny-clip-shadow")
    b_dir = tmp_path / "b"
    b_dir.mkdir()
    cfg = _json.loads(open(a["model_config_file"]).read())
    cfg["embed_dim"] = 16  # same stem, different architecture
    (b_dir / "tiny-clip-shadow.json").write_text(_json.dumps(cfg))
    with pytest.raises(RuntimeError):  # a's 32-d weights do not fit b's 16-d architecture
        ClipEncoder(ClipModelSpec(**{**a, "model_config_file": str(b_dir / "tiny-clip-shadow.json")}), "cpu")
    enc = ClipEncoder(ClipModelSpec(**a), "cpu")  # a registered again: its own architecture wins
    assert enc.encode_texts(["a photo"]).shape == (1, 32)


def test_writer_and_disabled_filter_actors_never_import_torch(tmp_path):
    """What a Ray actor of each imports: the writer and a disabled filter no torch (it costs
    an actor about 4 CPU-seconds to start), the enabled filter does."""
    import subprocess
    import sys

    from buildproc import light, tiny_config

    code = f"""
import sys
from pipeline.config import load_config
from pipeline.stages.filter import FilterStage
from pipeline.stages.write import WriteStage
cfg = load_config({str(tiny_config(tmp_path, light))!r})
for stage in (FilterStage(cfg, threads=1), WriteStage(cfg, output={str(tmp_path / "out")!r}, threads=1)):
    stage.ensure_setup()
print("torch" in sys.modules, FilterStage(load_config({str(tiny_config(tmp_path, name="full.yaml"))!r})).uses_torch)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]
