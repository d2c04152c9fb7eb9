"""The rehearsal of configs/cns_bench.yaml (bench/rehearsal.py) at a size that fits the suite.

The full rehearsal (SD2 at 768 px, the whole classifier zoo) belongs to the bench; here the
same path runs with the SD2 blocks at narrow widths (same module names), 128 px, 2 steps,
and one model of each kind: a timm classifier, an open_clip zero-shot classifier, the
filter's CLIP and DINOv2, the published-layout sliders and the ImageNet* text encoder, all
read from a hub cache written in huggingface_hub's own layout, offline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import rehearsal  # noqa: E402
import rehearsal_cache  # noqa: E402
import rehearsal_hub  # noqa: E402

# One model of each kind, the smallest real ones; zero-shot over two classes' names.
SETS = [
    "filter.clip.model=ViT-B-32",
    "filter.dino.model=vit_small_patch14_reg4_dinov2.lvd142m",
    "classifiers=[{name: resnet18, model: resnet18.a1_in1k},"
    " {name: clip_vit_b32, kind: open_clip_zeroshot, model: ViT-B-32, checkpoint: openai, templates: simple,"
    " label_map: {0: 2, 1: 22}},"
    " {name: dinov2_vits14, kind: torch_hub, model: 'facebookresearch/dinov2:dinov2_vits14_lc'}]",
]
PLAN = ["benchmark.classes=[2]", "benchmark.shifts=[cartoon_style, painting_style]"]


def test_hub_layout_resolves_through_refs_main(tmp_path):
    from huggingface_hub import try_to_load_from_cache

    stage = tmp_path / "stage"
    (stage / "sub").mkdir(parents=True)
    (stage / "config.json").write_text('{"a": 1}')
    (stage / "sub" / "model.safetensors").write_bytes(b"weights")
    snap = rehearsal_hub.publish(tmp_path / "cache", "org/name", stage)
    folder = tmp_path / "cache" / "hub" / "models--org--name"
    assert (folder / "refs" / "main").read_text() == snap.name
    assert (snap / "sub" / "model.safetensors").is_symlink()
    # LFS files are named by their SHA-256, the others by their git blob SHA-1.
    import hashlib

    assert Path(os.readlink(snap / "sub" / "model.safetensors")).name == hashlib.sha256(b"weights").hexdigest()
    assert Path(os.readlink(snap / "config.json")).name == hashlib.sha1(b'blob 8\0{"a": 1}').hexdigest()
    hit = try_to_load_from_cache("org/name", "sub/model.safetensors", cache_dir=str(tmp_path / "cache" / "hub"))
    assert Path(hit).read_bytes() == b"weights"
    assert rehearsal_hub.is_published(tmp_path / "cache", "org/name", ["config.json", "sub/model.safetensors"])


def test_slider_names_are_the_original_trainers_on_the_full_sd2_unet():
    import torch
    from diffusers import UNet2DConditionModel

    from pipeline.models.lora import lora_key, target_modules

    with torch.device("meta"):
        full = UNet2DConditionModel(**rehearsal_cache._unet_config("full"))
        small = UNet2DConditionModel(**rehearsal_cache._unet_config("small"))
    names = rehearsal_cache.slider_module_names(full)
    assert len(names) == 150  # c3lier + noxattn on SD2 (docs/lora.md)
    assert rehearsal_cache.slider_module_names(small) == names  # narrow channels, same module names
    # The pipeline's own enumeration (what SliderBank hooks) is the original trainer's.
    assert sorted(lora_key(p) for p in target_modules(full, "attn_conv", "noxattn")) == sorted(names)


def test_openai_clip_weights_load_into_quick_gelu_models():
    from pipeline.models.detectors import trained_with_quick_gelu

    assert trained_with_quick_gelu("ViT-B-16", "openai")
    assert trained_with_quick_gelu("RN50", "openai")
    assert not trained_with_quick_gelu("ViT-B-16", "laion2b_s34b_b88k")
    assert not trained_with_quick_gelu("ViT-B-16", None)


def test_flops_are_counted_on_the_meta_device():
    from pipeline.perf import flops

    assert flops.timm_flops("resnet50.a1_in1k") == pytest.approx(8.18e9, rel=0.01)  # 4.09 GMACs
    assert flops.count_model("resnet50.a1_in1k")["gflop"] == pytest.approx(8.18, rel=0.01)
    small = flops.unet_flops(rehearsal_cache._unet_config("small"), 64)
    assert flops.unet_flops(rehearsal_cache._unet_config("small"), 128) > 3.5 * small
    # The full SD2 UNet at 768 px: the table's figure (pipeline/data/model_flops.json).
    table = json.loads((ROOT / "pipeline" / "data" / "model_flops.json").read_text())
    full = flops.unet_flops(rehearsal_cache._unet_config("full"), 768) / 1e9
    assert full == pytest.approx(table["generators"]["stabilityai/stable-diffusion-2"]["unet_gflop_per_sample"], rel=1e-3)


def test_startup_of_each_stage_is_measured_in_a_fresh_process(tmp_path):
    # bench/rehearsal_startup.py on the tiny config's classifiers (local checkpoints) and the writer:
    # imports, then each model's load, each stage in a fresh process.
    import time

    from pipeline.runtime.checkout import TINY_CONFIG

    out = {}
    for stage in ("classify", "write"):
        job = tmp_path / f"{stage}.json"
        job.write_text(json.dumps({"stage": stage, "config": str(TINY_CONFIG), "sets": [], "started": time.time()}))
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "rehearsal_startup.py"), str(job)],
                              capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[stage] = json.loads(proc.stdout.strip().splitlines()[-1])
    models = out["classify"]["models"]
    assert list(models) == ["tiny-resnet", "tiny-vit", "tiny-clip-zs"]
    assert all(m["load_s"] > 0 and m["weights_bytes"] > 0 for m in models.values())
    assert out["classify"]["imports_s"] > out["write"]["imports_s"] > 0 and out["write"]["models"] == {}


@pytest.mark.slow
def test_rehearsal_runs_the_paper_config_offline_from_a_written_cache(tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "out"
    made = rehearsal_cache.make_cache(str(rehearsal.CONFIG), cache, sets=SETS + PLAN, width="small", log=lambda m: None)
    assert set(made["unavailable"]) == {"dinov2_vits14"}
    sd2 = rehearsal_hub.snapshot_files(cache, rehearsal_cache.SD2)
    assert {"model_index.json", "unet/diffusion_pytorch_model.safetensors", "tokenizer/merges.txt",
            "text_encoder/model.safetensors", "vae/diffusion_pytorch_model.safetensors"} <= set(sd2)
    sliders = sorted((cache / "cns" / "sliders").rglob("*_last.pt"))
    assert [p.name for p in sliders] == [
        "cartoon_style_class_002_alpha1.0_rank4_noxattn_last.pt", "painting_style_class_002_alpha1.0_rank4_noxattn_last.pt"]

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "rehearsal.py"), "run", "--cache", str(cache), "--output", str(out),
         "--resolution", "128", "--runner", "local", "--zero-shot", "--no-project", "--json", *sum((["--set", s] for s in SETS), [])],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["images"] == 4  # 2 shifts x scales 0 and 2.5
    assert result["resolution"] == 128 and result["steps"] == 2
    assert sorted(result["classifiers_ran"]) == ["clip_vit_b32", "resnet18"]
    assert list(result["classifiers_unavailable"]) == ["dinov2_vits14"]
    assert "github.com/facebookresearch/dinov2" in result["classifiers_unavailable"]["dinov2_vits14"]["reason"]
    stages = result["stages"]
    assert stages["generate"]["models_params_m"]["unet"] > 1
    assert stages["classify"]["models_params_m"] == {"resnet18": 11.7, "clip_vit_b32": 151.3}
    assert stages["filter"]["models_params_m"]["vit_small_patch14_reg4_dinov2.lvd142m"] == 22.1
