"""pipeline.perf.gpus: gpus.json's measured utilisations written from GPU runs of bench/latency.py and bench/rehearsal_gpu.py."""

from __future__ import annotations

import json
import shutil

import pytest

from pipeline.perf import gpus
from pipeline.perf.data import DATA

PEAK = 989.4  # the h100's dense BF16 TFLOP/s in gpus.json


def _run(device: str = "NVIDIA H100 80GB HBM3") -> dict:
    return {
        "device": device, "torch": "2.14.1", "resolution": 768, "dtype": "bfloat16",
        "classify": {"batch": 8, "seconds_per_image": 0.06, "models": [
            {"model": "a", "achieved_tflops": 30.0, "seconds_per_image": 0.05},
            {"model": "b", "achieved_tflops": 20.0, "seconds_per_image": 0.01}]},
        "filter": {"batch": 8, "seconds_per_image": 0.025, "models": [
            {"model": "clip", "achieved_tflops": 40.0, "seconds_per_image": 0.025}]},
        "precision": {"classify": {"float32": {"8": 0.06}, "bfloat16": {"8": 0.01, "1": 0.03}},
                      "filter": {"float32": {"8": 0.025}, "bfloat16": {"8": 0.005}}},
        "sampler": {"eager": {"slider_window_factor": 1.2}, "compiled": {"slider_window_factor": 1.08}},
    }


def test_utilisations_are_stage_tflop_over_seconds_and_peak():
    u = gpus.utilisations(_run(), PEAK)
    # classify: 30 x 0.05 + 20 x 0.01 = 1.7 TFLOP per image in 0.06 s
    assert u["classifier"] == round(1.7 / 0.06 / PEAK, 4) == 0.0286
    assert u["classifier_by_precision"] == {"float32": 0.0286, "bfloat16": round(1.7 / 0.01 / PEAK, 4)}
    assert u["filter"] == round(1.0 / 0.025 / PEAK, 4) == 0.0404
    assert u["filter_by_precision"]["bfloat16"] == round(1.0 / 0.005 / PEAK, 4)
    assert (u["slider_window_factor"], u["slider_window_mode"]) == (1.08, "compiled")
    run = _run()
    del run["sampler"]["compiled"]
    assert gpus.utilisations(run, PEAK)["slider_window_factor"] == 1.2


def test_write_keeps_the_datasheets_and_the_unet_figures(tmp_path, capsys):
    target = tmp_path / "gpus.json"
    shutil.copy(DATA / "gpus.json", target)
    before = json.loads(target.read_text())
    result = tmp_path / "rehearsal_gpu.json"
    result.write_text(json.dumps(_run()))
    assert gpus.main(["--rehearsal", str(result), "--gpu", "h100", "--write", "--file", str(target)]) == 0
    after = json.loads(target.read_text())
    assert after["gpus"] == before["gpus"]
    for key in ("unet_by_images_per_forward", "vae_decode", "unet_activation_gib_per_sample"):
        assert after["utilisation"][key] == before["utilisation"][key]
    assert after["utilisation"]["classifier"] == 0.0286
    assert after["utilisation"]["slider_window_factor"] == 1.08
    assert "NVIDIA H100 80GB HBM3" in after["utilisation"]["float32_source"]


@pytest.mark.parametrize("device,gpu,said", [
    ("cpu", "h100", "not a GPU"),
    ("NVIDIA H200", "h100", "which is no H100"),
    ("NVIDIA H100 80GB HBM3", "h999", "unknown GPU"),
])
def test_a_run_not_on_that_gpu_is_refused(tmp_path, capsys, device, gpu, said):
    target = tmp_path / "gpus.json"
    shutil.copy(DATA / "gpus.json", target)
    result = tmp_path / "r.json"
    result.write_text(json.dumps(_run(device)))
    assert gpus.main(["--rehearsal", str(result), "--gpu", gpu, "--write", "--file", str(target)]) == 2
    err = capsys.readouterr().err
    assert said in err and str(result) in err
    assert target.read_text() == (DATA / "gpus.json").read_text()  # nothing written


# bench/latency.py on an NVIDIA H100 80GB HBM3, 2026-11-25, as BENCHMARKS.md records it
# ("Model latencies on an H100: the latency model's calibration"): the figures gpus.json ships.
RECORDED_H100 = {
    "device": "NVIDIA H100 80GB HBM3",
    "unet": [{
        "dtype": "bfloat16", "unet_gflop_per_eval_cfg2": 4298.0, "seconds_per_unet_eval_cfg2": 0.0280,
        "seconds_per_image_eval_by_batch": {"4": 0.0151, "8": 0.0142, "16": 0.0135},
        "vae_gflop_per_decode": 5754.0, "seconds_per_vae_decode": 0.051,
        "activation_memory_gib": {"unet_gib_per_sample": 0.143, "vae_decode": 1.34},
    }],
}


def test_the_recorded_h100_run_gives_back_the_shipped_generation_figures(tmp_path):
    shipped = json.loads((DATA / "gpus.json").read_text())["utilisation"]
    u = gpus.generation_utilisations(RECORDED_H100, PEAK)
    assert set(u["unet_by_images_per_forward"]) == set(shipped["unet_by_images_per_forward"]) == {"1", "4", "8", "16"}
    for n, value in shipped["unet_by_images_per_forward"].items():
        # the recorded seconds are rounded to 3 significant digits: 16 images gives 0.3218 for 0.321
        assert u["unet_by_images_per_forward"][n] == pytest.approx(value, abs=0.0011), n
    assert u["vae_decode"] == pytest.approx(shipped["vae_decode"], abs=0.0005)
    assert u["unet_activation_gib_per_sample"] == shipped["unet_activation_gib_per_sample"]
    assert u["vae_decode_activation_gib_per_image"] == shipped["vae_decode_activation_gib_per_image"]
    # 4,298 GFLOP per image-evaluation in 0.028 s over the H100's 989.4 TFLOP/s
    assert u["unet_by_images_per_forward"]["1"] == round(4298e9 / 0.028 / 989.4e12, 4) == 0.1551


def test_latency_and_rehearsal_together_and_a_latency_run_without_bf16(tmp_path, capsys):
    target = tmp_path / "gpus.json"
    shutil.copy(DATA / "gpus.json", target)
    lat, reh = tmp_path / "latency.json", tmp_path / "rehearsal.json"
    lat.write_text(json.dumps(RECORDED_H100))
    reh.write_text(json.dumps(_run()))
    assert gpus.main(["--gpu", "h100", "--latency", str(lat), "--rehearsal", str(reh), "--write", "--file", str(target)]) == 0
    util = json.loads(target.read_text())["utilisation"]
    assert util["unet_by_images_per_forward"]["16"] == 0.3218 and util["classifier"] == 0.0286
    assert "bench/latency.py on an NVIDIA H100 80GB HBM3" in util["source"]
    fp16 = {**RECORDED_H100, "unet": [{**RECORDED_H100["unet"][0], "dtype": "float16"}]}
    lat.write_text(json.dumps(fp16))
    assert gpus.main(["--gpu", "h100", "--latency", str(lat), "--file", str(target)]) == 2
    assert "bfloat16" in capsys.readouterr().err
