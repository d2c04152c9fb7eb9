"""Precision per model stage (``resources.<stage>.precision``, ``channels_last``), the memory
projection in each precision, and ``batch_size: auto`` from the projection."""

from __future__ import annotations

import pytest
import torch

from pipeline.output_run import differing_keys
from pipeline.config import config_hash, load_config, resolved_dict
from pipeline.perf import memory
from pipeline.perf.memory import GB, RUNTIME_BYTES, Footprint
from buildproc import FAST_ZERO_SHOT as FAST

from pipeline.runtime.checkout import TINY_CONFIG

MB = 1024**2
pytestmark = pytest.mark.usefixtures("tiny_assets_one_thread")


def tiny(*sets: str):
    return load_config(TINY_CONFIG, sets=[*FAST, *sets])


# --------------------------------------------------------------------------- config
def test_validate_rejects_an_unknown_precision_naming_the_key(capsys):
    from pipeline.cli import main

    assert main(["validate", str(TINY_CONFIG), "--set", "resources.classify.precision=fp8"]) == 2
    err = capsys.readouterr().err
    assert "resources.classify.precision" in err and "'fp8'" in err and "bfloat16" in err
    assert main(["validate", str(TINY_CONFIG), "--set", "resources.classify.precision=bfloat16"]) == 0
    assert "precision: filter float32, classify bfloat16" in capsys.readouterr().out


def test_batch_size_auto_needs_a_memory_to_fit():
    from pipeline.config import ConfigError

    with pytest.raises(ConfigError, match=r"resources\.filter\.batch_size: auto needs a memory"):
        tiny("resources.filter.batch_size=auto")  # the tiny config's stages have num_gpus 0
    with pytest.raises(ConfigError, match=r"resources\.classify\.batch_size.*auto or an integer"):
        tiny("resources.classify.batch_size=0")
    auto = tiny("resources.classify.batch_size=auto", "resources.classify.memory_budget_gb=2")
    assert auto.resources.classify.batch_size == "auto"


def test_a_precision_other_than_float32_is_part_of_the_output():
    base = tiny()
    assert config_hash(tiny("resources.classify.precision=float32")) == config_hash(base)
    assert config_hash(tiny("resources.classify.batch_size=3", "resources.filter.channels_last=true")) == config_hash(base)
    bf16 = tiny("resources.classify.precision=bfloat16")
    assert config_hash(bf16) != config_hash(base) != config_hash(tiny("resources.filter.precision=tf32"))
    # resuming an output in another precision would mix two precisions' shards
    assert differing_keys(resolved_dict(base), resolved_dict(bf16)) == ["resources.classify.precision"]
    assert differing_keys(resolved_dict(base), resolved_dict(tiny("resources.classify.batch_size=3"))) == []


# --------------------------------------------------------------------------- memory
def test_the_projection_counts_the_precision():
    f32 = memory.classifier_footprints(tiny())
    bf16 = memory.classifier_footprints(tiny("resources.classify.precision=bfloat16"))
    tf32 = memory.classifier_footprints(tiny("resources.classify.precision=tf32"))
    assert tf32 == f32
    for a, b in zip(f32, bf16, strict=True):
        assert a.weight_bytes == 4 * a.params and b.weight_bytes == 2 * a.params
        assert b.activation_bytes == a.activation_bytes // 2 > 0
    fil = {p: memory.project_stage_memory(tiny(f"resources.filter.precision={p}"), "cpu")["filter"]
           for p in ("float32", "bfloat16")}
    assert abs((fil["float32"] - RUNTIME_BYTES) - 2 * (fil["bfloat16"] - RUNTIME_BYTES)) <= 1


@pytest.fixture
def hand_sized(monkeypatch):
    """Every classifier: 100 MB of float32 weights, 20 MB of float32 activations per image."""

    def footprint(spec, images):
        return Footprint(spec.name, 25 * MB, 100 * MB, 20 * MB * images)

    monkeypatch.setattr(memory, "classifier_footprint", footprint)


def test_auto_batch_is_the_largest_that_fits(hand_sized):
    from pipeline.executors import StageSpec
    from pipeline.stages.classify import ClassifyStage

    # One pool (no memory_budget_gb): half of a 3 GB GPU = 1536 MB for the runtime (1024 MB),
    # the three models' weights and one forward's activations of 6 images (scales) per row.
    share = ["resources.classify.batch_size=auto", "resources.classify.num_gpus=0.5", "resources.device_memory_gb=3"]
    cfg = tiny(*share)
    auto = memory.auto_batch(cfg, "classify")
    # float32: 1024 + 300 + 120 x rows <= 1536 -> 1 row (2 rows: 1564 MB)
    assert (auto.batch, auto.fits, auto.budget_bytes) == (1, True, 1536 * MB)
    assert auto.projected_bytes == RUNTIME_BYTES + 300 * MB + 120 * MB
    assert StageSpec(ClassifyStage).resolved(cfg)[1] == 1
    # bfloat16 halves both: 1024 + 150 + 60 x rows <= 1536 -> 6 rows
    assert memory.stage_batch_size(tiny(*share, "resources.classify.precision=bfloat16"), "classify") == 6
    # classifier groups (memory_budget_gb 1.5): each model alone fits, 1024 + 100 + 120 x rows -> 3 rows
    grouped = tiny("resources.classify.batch_size=auto", "resources.classify.memory_budget_gb=1.5")
    assert memory.stage_batch_size(grouped, "classify") == 3
    assert memory.classify_images_per_forward(grouped) == 18
    # a large budget stops at the rows whose images fill one forward (64 // 6 = 10)
    big = memory.auto_batch(tiny("resources.classify.batch_size=auto", "resources.classify.memory_budget_gb=100"),
                            "classify")
    assert (big.batch, big.cap) == (10, 10) and "at most 10" in big.line()
    # not even one row: batch 1, and validate says so
    small = memory.auto_batch(tiny("resources.classify.batch_size=auto", "resources.classify.memory_budget_gb=1.1"),
                              "classify")
    assert (small.batch, small.fits) == (1, False) and "over the budget 1.10 GB" in small.line()


def test_validate_prints_the_auto_batch(capsys):
    from pipeline.cli import main

    sets = ["resources.filter.batch_size=auto", "resources.filter.memory_budget_gb=100"]
    assert main(["validate", str(TINY_CONFIG), *[a for s in sets for a in ("--set", s)]]) == 0
    out = capsys.readouterr().out
    assert "filter batch_size auto: 42 rows" in out and "resources.filter.memory_budget_gb" in out  # 256 // 6 images


# --------------------------------------------------------------------------- the stages
def rows(n: int = 2):
    """GENERATED rows of ``n`` trajectories of two images (scale 0 and 1), random pixels."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)

    def png() -> bytes:
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buf, format="PNG")
        return buf.getvalue()

    return [dict(trajectory_id=f"snow/{c:03d}/seed_1", class_id=c, shift="snow", scales=[0.0, 1.0],
                 sample_ids=[f"s{c}_0", f"s{c}_1"], images=[png(), png()], error=None) for c in (1, 22)[:n]]


def test_classify_stage_runs_its_models_in_the_precision():
    from pipeline.stages.classify import ClassifyStage

    def run(*sets):
        stage = ClassifyStage(tiny(*sets), device="cpu")
        stage.ensure_setup()
        return stage, stage.process(rows())

    _, f32 = run()
    stage, bf16 = run("resources.classify.precision=bfloat16", "resources.classify.channels_last=true")
    for clf in stage.classifiers:
        assert {p.dtype for p in clf.model.parameters()} == {torch.bfloat16}, clf.name
    conv = next(m for m in stage.classifiers[0].model.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert [len(r["pred_top1"]) for r in bf16] == [2, 2]
    p = [v for r in bf16 for image in r["pred_p_true"] for v in image]
    assert all(isinstance(v, float) and 0 <= v <= 1 for v in p)
    # off CUDA, tf32 is float32: the same numbers
    _, tf32 = run("resources.classify.precision=tf32")
    assert [r["pred_p_true"] for r in tf32] == [r["pred_p_true"] for r in f32]


def test_filter_stage_runs_its_encoders_in_the_precision():
    from pipeline.stages.filter import FilterStage

    stage = FilterStage(tiny("filter.enabled=true", "resources.filter.precision=bfloat16"), device="cpu")
    stage.ensure_setup()
    assert {p.dtype for p in stage.filter.clip.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in stage.filter.dino.model.parameters()} == {torch.bfloat16}
    out = stage.process(rows(1))[0]
    assert len(out["kept"]) == 2 and all(isinstance(s, float) for s in out["clip_text"] + out["dino_image"])
    assert out["clip_image"][0] == pytest.approx(1.0, abs=1e-2)  # scale 0 against itself


def test_tf32_switch_is_restored():
    from pipeline.models.precision import ModelPrecision, tf32_switched

    ns = torch.backends.cuda.matmul
    if not hasattr(ns, "fp32_precision"):
        pytest.skip("torch < 2.9 has the legacy switches only")
    before = ns.fp32_precision
    with tf32_switched(True):
        assert ns.fp32_precision == "tf32" and torch.backends.cudnn.conv.fp32_precision == "tf32"
    assert ns.fp32_precision == before
    with tf32_switched(False):
        assert ns.fp32_precision == "ieee"
    assert ns.fp32_precision == before
    assert ModelPrecision("tf32").effective("cpu") == "float32" and ModelPrecision("tf32").effective("cuda:0") == "tf32"
    with pytest.raises(ValueError, match="precision must be one of"):
        ModelPrecision("fp8")
