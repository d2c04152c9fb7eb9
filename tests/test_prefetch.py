"""Know before you run: hub artefacts cached or not, `cnsbench prefetch`, projected memory per stage actor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.assets import hub

from pipeline.perf import memory
from pipeline.runtime.checkout import TINY_CONFIG
from pipeline.cli import main
from pipeline.config import load_config, parse_config

ZOO = {
    "benchmark": {"classes": [2], "seeds": [1], "shifts": ["heavy_snow"]},
    "generator": {"model": "stabilityai/stable-diffusion-2"},
    "classifiers": [
        {"name": "r18", "model": "resnet18.a1_in1k"},
        {"name": "clip", "kind": "open_clip_zeroshot", "model": "RN50", "checkpoint": "openai"},
        {"name": "dino", "kind": "torch_hub", "model": "facebookresearch/dinov2:dinov2_vits14_lc"},
    ],
}


@pytest.fixture()
def hf_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face hub cache and torch hub directory for this test."""
    import huggingface_hub.constants
    import torch.hub

    cache = tmp_path / "hf"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    before = torch.hub.get_dir()
    torch.hub.set_dir(str(tmp_path / "torch"))
    yield cache
    torch.hub.set_dir(before)


def put(cache: Path, repo: str, filename: str) -> None:
    """A file as huggingface_hub stores it: refs/main -> snapshots/<commit>/<filename>."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text("c0ffee")
    path = root / "snapshots" / "c0ffee" / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")


def test_artefacts_of_a_config_and_what_is_cached(hf_cache):
    cfg = parse_config(ZOO)
    lines = {a.line(): a.cached for a in hub.hub_artefacts(cfg)}
    assert lines == {
        "generator.model: diffusers stabilityai/stable-diffusion-2": False,
        "filter.clip: open_clip ViT-B-16 pretrained=openai (timm/vit_base_patch16_clip_224.openai)": False,
        "filter.dino: timm timm/vit_large_patch14_reg4_dinov2.lvd142m": False,
        "classifiers[0] (r18): timm timm/resnet18.a1_in1k": False,
        "classifiers[1] (clip): open_clip RN50 pretrained=openai (timm/resnet50_clip.openai)": False,
        "classifiers[2] (dino): torch hub facebookresearch/dinov2:dinov2_vits14_lc": False,
    }
    put(hf_cache, "timm/resnet18.a1_in1k", "model.safetensors")
    put(hf_cache, "timm/resnet50_clip.openai", "open_clip_pytorch_model.bin")
    put(hf_cache, "stabilityai/stable-diffusion-2", "model_index.json")
    for folder in ("unet", "vae"):
        put(hf_cache, "stabilityai/stable-diffusion-2", f"{folder}/diffusion_pytorch_model.safetensors")
    sd2 = {a.where: a.cached for a in hub.hub_artefacts(cfg)}
    assert sd2["generator.model"] is False  # the text encoder's weights are still missing
    put(hf_cache, "stabilityai/stable-diffusion-2", "text_encoder/model.safetensors")
    (Path(hf_cache).parent / "torch" / "facebookresearch_dinov2_main").mkdir(parents=True)
    missing = hub.remote_weights_not_cached(cfg)
    assert missing == [
        "filter.clip: open_clip ViT-B-16 pretrained=openai (timm/vit_base_patch16_clip_224.openai)",
        "filter.dino: timm timm/vit_large_patch14_reg4_dinov2.lvd142m",
    ]


def test_validate_offline_lists_hub_ids_and_exits_2(hf_cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    rc = main(["validate", str(TINY_CONFIG), "--set", "filter.dino.checkpoint=null"])
    out = capsys.readouterr().out
    assert rc == 2
    assert "filter.dino: timm timm/vit_small_patch14_reg4_dinov2.lvd142m" in out
    assert "cnsbench prefetch" in out and "--set=filter.dino.checkpoint=null" in out
    # With a network a build fetches it on first use: reported, not a problem.
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert main(["validate", str(TINY_CONFIG), "--set", "filter.dino.checkpoint=null"]) == 0
    out = capsys.readouterr().out
    assert "fetched on first use" in out
    gb = [line.split()[1] for line in out.splitlines() if line.strip().startswith(("generate ", "classify "))]
    assert "projected memory per actor" in out and len(gb) == 2 and all(float(v) > 0.5 for v in gb)


def test_prefetch_offline_lists_what_it_would_fetch(hf_cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = tmp_path / "zoo.yaml"
    path.write_text(json.dumps(ZOO))
    assert main(["prefetch", str(path)]) == 2
    out = capsys.readouterr().out
    for ref in ("stabilityai/stable-diffusion-2", "timm/resnet18.a1_in1k", "timm/resnet50_clip.openai",
                "facebookresearch/dinov2:dinov2_vits14_lc", "timm/vit_large_patch14_reg4_dinov2.lvd142m"):
        assert ref in out


def test_prefetch_fetches_only_what_is_missing(hf_cache, tmp_path, monkeypatch, capsys):
    fetched = []

    def download(repo: str, names) -> str:
        fetched.append(repo)
        put(hf_cache, repo, list(names)[0])
        return "ok"

    monkeypatch.setattr(hub, "offline", lambda: False)
    monkeypatch.setattr(hub, "_hf_download", download)
    raw = {**ZOO, "generator": {"model": "./sd"}, "filter": {"enabled": False},
           "classifiers": [{"name": "r18", "model": "resnet18.a1_in1k"}, {"name": "r34", "model": "resnet34.a1_in1k"}]}
    path = tmp_path / "zoo.yaml"
    path.write_text(json.dumps(raw))
    put(hf_cache, "timm/resnet34.a1_in1k", "model.safetensors")
    assert main(["prefetch", str(path)]) == 0
    assert fetched == ["timm/resnet18.a1_in1k"]
    assert "fetched 1 of 1" in capsys.readouterr().out
    assert main(["prefetch", str(path)]) == 0 and fetched == ["timm/resnet18.a1_in1k"]
    assert "0 to fetch" in capsys.readouterr().out


def test_stage_memory_of_the_tiny_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    memory._classifier_footprint.cache_clear()
    cfg = load_config(TINY_CONFIG)
    projected = memory.project_stage_memory(cfg, "cpu")
    assert set(projected) == {"generate", "filter", "classify", "write"}
    assert all(isinstance(v, int) and v > memory.RUNTIME_BYTES for k, v in projected.items() if k != "write")
    # No model library: the writer's runtime, plus twice one shard's images at raw RGB size
    # (2 trajectories per shard x 6 scales, 64 px).
    assert projected["write"] == 200 * 1024**2 + 2 * (2 * 6) * 64 * 64 * 3 < memory.RUNTIME_BYTES
    footprints = memory.classifier_footprints(cfg)
    assert projected["classify"] == memory.group_bytes(footprints)
    split = load_config(TINY_CONFIG, sets=["resources.classify.memory_budget_gb=0.1"])
    assert memory.project_stage_memory(split, "cpu")["classify"] == max(memory.group_bytes([f]) for f in footprints)
    # Footprints are kept on disk: the next process does not build the models again.
    memory._classifier_footprint.cache_clear()
    monkeypatch.setattr(memory, "_measure", lambda *a: pytest.fail("measured again"))
    assert memory.classifier_footprints(cfg) == footprints


def test_a_vlm_from_the_hub_is_an_artefact(hf_cache):
    from pipeline.config import ClassifierSpec

    cfg = parse_config(ZOO)
    vlm = ClassifierSpec.model_construct(name="qa", kind="vlm", model="org/some-vlm")
    cfg = cfg.model_copy(update={"classifiers": [vlm]})
    [artefact] = [a for a in hub.hub_artefacts(cfg) if a.where.startswith("classifiers")]
    assert artefact.line() == "classifiers[0] (qa): transformers org/some-vlm" and not artefact.cached
    put(hf_cache, "org/some-vlm", "config.json")
    put(hf_cache, "org/some-vlm", "model.safetensors.index.json")
    assert [a.cached for a in hub.hub_artefacts(cfg) if a.where.startswith("classifiers")] == [True]
