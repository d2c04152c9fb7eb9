"""Every ``bench/`` script runs at its smallest size, so a refactoring cannot silently break a
measurement: each script's ``main(argv)`` in this process, its JSON checked for the fields
BENCHMARKS.md quotes.  ``bench/chaos.py`` runs in ``tests/test_chaos.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scriptload import load_script

BENCH = Path(__file__).resolve().parents[1] / "bench"
TESTS = Path(__file__).resolve().parent


def _load(name: str):
    # Loaded under a prefixed name: bench/pipeline.py must not shadow the pipeline package.
    return load_script(f"bench/{name}.py", f"bench_{name}")


def _printed(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_every_bench_script_has_a_test():
    # A script (a bench/ file run as __main__) no test module names is a measurement nothing
    # keeps working; helper modules of a script are tested through it.
    texts = "\n".join(p.read_text() for p in TESTS.glob("test_*.py"))
    scripts = [p for p in sorted(BENCH.glob("*.py")) if '__name__ == "__main__"' in p.read_text()]
    untested = [p.name for p in scripts if f"bench/{p.name}" not in texts and f'_load("{p.stem}")' not in texts]
    assert len(scripts) >= 8 and untested == []


def test_bookkeeping(capsys):
    _load("bookkeeping").main(["--classes", "2", "--shifts", "2", "--seeds", "2", "--per-shard", "2", "--json"])
    out = _printed(capsys)
    assert out and all(isinstance(v, (int, float, dict, list, str)) for v in out.values())


def test_corruptions(capsys):
    out = _load("corruptions").main(["--size", "16", "--batch", "1", "--corruptions", "gaussian_noise", "--json"])
    assert "gaussian_noise" in json.dumps(out)


def test_classify_memory(capsys):
    # `plan` runs here (meta-device projections); `measure` needs a GPU.
    _load("classify_memory").plan([str(BENCH.parent / "configs" / "tiny.yaml")])
    text = capsys.readouterr().out  # on a fresh checkout the tiny assets are made first, and say so
    out = json.loads(text[text.index("\n{") + 1 :] if not text.startswith("{") else text)
    assert out["models"] and all(m["weights"] > 0 for m in out["models"])
    assert sorted(i for g in out["groups"] for i in g["members"]) == list(range(len(out["models"])))


def test_latency(capsys):
    out = _load("latency").main(
        ["--size", "tiny", "--device", "cpu", "--dtypes", "float32", "--models", "resnet18", "--batch", "1",
         "--iters", "1", "--unet-images", "1", "--json"]
    )
    unet = out["unet"][0]
    assert unet["unet_params"] > 0 and unet["seconds_per_unet_eval_cfg2"] > 0 and unet["unet_gflop_per_eval_cfg2"] > 0
    assert out["classifiers"][0]["gflop_per_image"] == pytest.approx(3.63, abs=0.01)  # resnet18 at 224 px


def test_slider_ops(capsys):
    # Ops of one tiny UNet forward: the same for 1 and 16 distinct sliders in a batch of 16 rows.
    out = _load("slider_ops").main(["--size", "tiny", "--repeats", "0", "--json"])
    ops = out["ops_by_sliders"]
    assert out["contract_ok"] and set(ops) == {"1", "2", "4", "8", "16"}
    assert len(set(ops.values())) == 1 and ops["1"] > out["ops_bare"] and out["wall_ratio"] > 0


@pytest.mark.slow
def test_generation(capsys):
    out = _load("generation").main(["--shifts", "1", "--steps", "2", "--paths", "hooks", "--json"])
    assert out["paths"]["hooks"]["images_per_s"] > 0


def test_pipeline(capsys, ray_session):
    # The overhead part (three ways of running the same work); the driver-memory part runs
    # the same build in a subprocess (`--memory-seeds` given no sizes skips it here).
    out = _load("pipeline").main(["--shifts", "1", "--seeds", "1", "--steps", "1", "--memory-seeds", "--json"])
    assert out["images"] == 12 and out["full_pipeline_s"] > 0  # tiny.yaml's 2 classes x 1 seed x 1 shift x 6 scales
    assert {"overhead_vs_ray_generation", "overhead"} <= set(out)


def test_scale(capsys, ray_session):
    # The stand-ins carry the palette's 256 px PNGs through the real driver, executor and writer.
    out = _load("scale").main(
        ["--cluster", "none", "--gpus", "1", "--classes", "1", "--seeds", "1", "--shifts", "2", "--classifiers", "3",
         "--compression", "50", "--writers", "1", "--json"]
    )
    assert out["images"] == 12 and out["failed"] == 0 and out["shards"] == 1  # 2 trajectories, 64 per shard
    assert set(out["pool_layout"]) == {"generate", "filter", "classify:0", "write"} and out["classifier_groups"] == [[0, 1, 2]]
    assert 0 < out["efficiency"] <= out["efficiency_without_startup"] <= 1.05 and out["compression"] == 50
    assert out["driver_peak_rss_mb"] > 0 and 0 <= out["cpu_utilisation"] <= 1
    assert out["cpu_model_ms"]["encode"] > 0 and out["cpu_model_ms"]["classifier_preprocess_sum"] > 0


def test_scale_calibration(capsys, ray_session):
    # The compression's calibration: the idle actors' base, then the CPU per image of a small build.
    out = _load("scale").main(
        ["--cluster", "none", "--gpus", "1", "--classes", "1", "--seeds", "2", "--shifts", "2", "--classifiers", "3",
         "--writers", "1", "--calibrate-units", "2", "--calibrate-only", "--calibrate-hold-s", "1"]
    )
    assert out["images"] == 24 and 0 <= out["idle_cpu_utilisation"] <= 1 and out["cpu_s_per_image"] > 0
    assert out["chosen"] >= 1 and out["target"] == 0.5


def test_scale_plan_only(capsys):
    # Half the plan committed, then the real driver's scan, plan and resume diff in a fresh process.
    out = _load("scale").main(["--plan-only", "--classes", "2", "--seeds", "3", "--shifts", "2", "--json"])
    assert out["images"] == 72 and out["trajectories_planned"] == 12 and out["trajectories_done_before"] == 6
    assert out["seconds"] > 0 and out["driver_peak_rss_mb"] > 0


def test_rehearsal_gpu(capsys):
    # `--smoke`: the demo world's toy SD2 at 64 px, one timm and one CLIP classifier, on the
    # CPU; the JSON has every part BENCHMARKS.md quotes and the paper grid's 65 evals.
    assert _load("rehearsal_gpu").main(["--smoke", "--json"]) == 0
    out = _printed(capsys)
    assert out["unet_evals_per_image"] == {"prefix_batch_2": 0.4, "window_batch_8": 64.6}
    assert set(out["generate"]["unet_eval_by_batch"]) == {"2", "8"} and out["generate"]["seconds_per_image"] > 0
    assert [r["model"] for r in out["classify"]["models"]] == ["resnet18", "clip_world"]
    assert all(r["seconds_per_image"] > 0 for r in out["filter"]["models"] + out["classify"]["models"])
    assert out["classify"]["batch"] == 1 and out["zero_shot_head"]["prompts"] == 80
    # filter and classify at every precision; the sampler with sliders and bare, the same steps
    settings = ["float32", "tf32", "bfloat16", "bfloat16+channels_last"]
    assert out["precision"]["settings"] == settings
    assert all(out["precision"][stage][s]["1"] > 0 for stage in ("filter", "classify") for s in settings)
    eager = out["sampler"]["eager"]
    assert eager["sliders"]["images"] == 12 and eager["sliders"]["seconds_per_image"] > 0  # 2 shifts x 6 scales
    assert eager["sliders"]["unet_evals_per_image"] == eager["bare"]["unet_evals_per_image"] > 0
    assert eager["slider_window_factor"] > 0 and "skipped" in out["sampler"]["compiled"]


def test_precision_agreement(capsys):
    # A one-trajectory world built in process, then its filter and classify stages at every setting.
    out = _load("precision_agreement").main(["--smoke", "--json"])
    assert out["images"] == 6 and out["classifiers"] == ["linear", "cnn", "vit", "clip-zs"]
    assert out["float32_equals_build"] == {"kept": True, "top1": True}
    assert set(out["settings"]) == {"float32", "tf32", "bfloat16", "float32+channels_last", "bfloat16+channels_last"}
    f32 = out["settings"]["float32"]
    assert f32["kept_agreement"] == 1.0 and set(f32["top1_agreement"].values()) == {1.0}
    assert out["settings"]["tf32"]["detectors"]["clip_text"]["max_abs_score_diff"] == 0.0  # a CPU has no TF32
    assert all(0 <= v <= 1 for s in out["settings"].values() for v in s["top1_agreement"].values())


@pytest.mark.slow
@pytest.mark.skipif(not (BENCH.parent / "assets" / "world" / "world.json").is_file(), reason="assets/world not trained")
def test_refine(capsys, tmp_path):
    # One class and seed of the world, one round: both builds, four refinements, the truth.
    out = _load("refine").main(["--smoke", "--work", str(tmp_path / "work"), "--json"])
    assert _printed(capsys) == out
    for key in ("agree_interval", "mean_abs_error", "images_ratio", "reuse_share", "recover_before_grid"):
        assert key in out
    assert out["images_dense"] == 3 * 41 and 0 <= out["images_ratio"] < 1
    assert 0 < out["prefix"]["prefix_unet_s"] < out["prefix"]["call_cold_s"] and out["prefix"]["cache_hits"] == 5
    assert out["together"]["same_rows"] is True
    assert out["together"]["points_made"] == sum(r["points_made"] for r in out["runs"])


@pytest.mark.slow
@pytest.mark.skipif(not (BENCH.parent / "assets" / "world" / "world.json").is_file(), reason="assets/world not trained")
def test_refine_together(capsys, tmp_path):
    # Two classifiers together against one after another (`--together`), each `cnsbench refine`
    # a process of its own: one class and seed, one round, no dense build.
    out = _load("refine").main(["--together", "--smoke", "--classifiers", "linear,cnn", "--work",
                                str(tmp_path / "work"), "--json"])
    assert _printed(capsys) == out
    seq, both = out["one_after_another"], out["together"]
    assert [r["classifier"] for r in seq["runs"]] == ["linear", "cnn"] and both["classifier"] == "linear,cnn"
    assert out["same_rows"] is True
    assert both["points_made"] == seq["points_made"] == sum(r["points_made"] for r in seq["runs"])
    # One round: one probe per bisected pair, each classifier alone making its own.
    assert out["points_each_alone"] == sum(r["points_alone"] for r in seq["runs"]) == out["refined_pairs"]
    assert seq["wall_s"] == pytest.approx(sum(r["wall_s"] for r in seq["runs"]))
    assert out["wall_ratio"] == pytest.approx(both["wall_s"] / seq["wall_s"])
    assert all(r["wall_s"] > 0 and r["cpu_s"] > 0 for r in [*seq["runs"], both])


@pytest.mark.slow
@pytest.mark.skipif(not (BENCH.parent / "assets" / "world" / "world.json").is_file(), reason="assets/world not trained")
def test_refine_family(capsys, tmp_path):
    # A family's world build against its dense grid (`--family`), for the cheapest of the
    # three (about 45 s here): one class and seed, two corruptions, one round.
    out = _load("refine").main(["--family", "corruptions", "--smoke", "--work", str(tmp_path / "work"), "--json"])
    assert _printed(capsys) == out
    for key in ("agree_interval", "mean_abs_error", "images_ratio", "subset", "recover_before_grid"):
        assert key in out
    assert out["kind"] == "corruption" and out["dense_scales"] == 161
    assert out["images_dense"] == 2 * 161 and 0 < out["images_refinement"] <= out["failing_pairs"]
    assert out["images_ratio"] == out["images_refinement"] / out["images_dense"]
