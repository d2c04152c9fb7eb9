"""Slider training: the objective learns, the slider moves the UNet the right way, files resume.

All on the tiny random SD2-shaped model (``tiny_sd``/``tiny_world``), at 64 px with
``max_denoise_steps=5``; iterations are few, so the learning rate in these tests is
larger than the reference 2e-4 to make the trend clear within 30 steps.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from pipeline.config import BuildConfig, ClassTokens, SliderTrainingSpec
from pipeline.labels import label_space
from pipeline.models import diffusion
from pipeline.models.lora import (
    SliderBank,
    load_slider_file,
    lora_key,
    random_slider,
    save_slider_file,
    target_modules,
)
from pipeline.train import sliders
from pipeline.train.run import train_sliders

SHIFT = "heavy_snow"
SPEC = SliderTrainingSpec(iterations=30, max_denoise_steps=5, learning_rate=1e-2, dtype="float32", seed=0)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def loaded(tiny_world):
    p = diffusion.load_pipeline(tiny_world["model"], torch.float32, "cpu")
    tokens = diffusion.install_class_tokens(
        p, ClassTokens(kind="ti_folder", path=tiny_world["tokens"]), [1, 22], label_space()
    )
    return p, tokens


@pytest.fixture(scope="module")
def pipe(loaded):
    return loaded[0]


@pytest.fixture(scope="module")
def token(loaded) -> str:
    """The class token of goldfish (class 1): ``<goldfish-1>``."""
    return loaded[1][1]


@pytest.fixture(scope="module")
def trained(pipe, token):
    state, losses = sliders.train_slider(pipe, token, SHIFT, SPEC, "cpu", seed=7, resolution=64)
    return state, losses


def test_loss_falls(trained):
    _, losses = trained
    assert len(losses) == SPEC.iterations and all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < np.mean(losses[:5])


def test_state_layout_and_roundtrip(trained, pipe, tmp_path):
    state, _ = trained
    expected = {lora_key(p) for p in target_modules(pipe.unet, SPEC.targets, SPEC.method)}
    assert {k.rsplit(".", 2)[0] if k.endswith(".weight") else k.rsplit(".", 1)[0] for k in state} == expected
    for key in expected:
        down, up = state[f"{key}.lora_down.weight"], state[f"{key}.lora_up.weight"]
        assert down.shape[0] == SPEC.rank and up.shape[1] == SPEC.rank and float(state[f"{key}.alpha"]) == SPEC.alpha
        assert up.abs().sum() > 0  # lora_up starts at zero: non-zero means it was trained
    # noxattn: no cross-attention (attn2) layer is adapted.
    assert not any("attn2" in k for k in state)
    for suffix in (".safetensors", ".pt"):
        path = str(tmp_path / f"s{suffix}")
        save_slider_file(state, path)
        reloaded = load_slider_file(path)
        assert reloaded.keys() == state.keys() and all(torch.equal(reloaded[k], state[k]) for k in state)
        bank = SliderBank(pipe.unet)
        bank.add("x", reloaded)  # the bank accepts it (and would reject foreign keys)
        bank.detach()


def test_deterministic_and_only_lora_gets_gradients(trained, pipe, token):
    """Same seed -> the same loss sequence; the frozen UNet collects no gradients."""
    _, losses = trained
    spec3 = SPEC.model_copy(update={"iterations": 3})
    _, again = sliders.train_slider(pipe, token, SHIFT, spec3, "cpu", seed=7, resolution=64)
    assert again == losses[:3]
    assert all(p.grad is None and not p.requires_grad for p in pipe.unet.parameters())
    assert all(not m._forward_hooks for m in pipe.unet.modules())  # training detached its hooks


def test_gradients_reach_lora_through_slider_bank(pipe):
    """The bank keeps the trainable Parameters by reference, so backward fills their .grad."""
    gen = torch.Generator().manual_seed(0)
    params = sliders.init_slider_params(pipe.unet, SPEC, gen, "cpu", torch.float32)
    with torch.no_grad():  # a non-zero up, so that down receives gradient too (up = 0 blocks it)
        for key, p in params.items():
            if "lora_up" in key:
                p.normal_(std=0.1, generator=gen)
    alphas = {k.replace(".lora_down.weight", ".alpha"): torch.tensor(1.0) for k in params if "lora_down" in k}
    bank = SliderBank(pipe.unet)
    try:
        bank.add("t", {**params, **alphas})
        bank.route_uniform("t", 1.0, 1)
        x = torch.randn(1, 4, 8, 8, generator=gen)
        emb = pipe.encode_prompt("a picture", "cpu", 1, False)[0]
        pipe.unet(x, torch.tensor(500), encoder_hidden_states=emb).sample.square().mean().backward()
    finally:
        bank.detach()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params.values())


def _eps(pipe, x, t, emb):
    return pipe.unet(x, torch.tensor(t), encoder_hidden_states=emb).sample


def test_slider_moves_prediction_toward_positive_prompt(trained, pipe, token):
    """Hand-checkable proxy of "the slider adds the shift".

    The objective asks eps_on(neutral) = eps_off(neutral) + eta * (eps_off(positive) -
    eps_off(unconditional)), so the change the slider makes to the neutral prediction,
    eps_on(neutral) - eps_off(neutral), should point along eps_off(positive) -
    eps_off(uncond).  Measured as a cosine on held-out noise (a seed training never drew)
    and held-out timesteps (training with 5 steps only sees t in {800, 600, 400, 200});
    the control is a random slider of the same layout, which has no reason to align (on
    this tiny model it measures about -0.3; the trained one about 0.9).
    """
    state, _ = trained
    neutral = pipe.encode_prompt(token, "cpu", 1, False)[0]
    positive = pipe.encode_prompt(sliders.positive_prompt(SPEC, token, SHIFT), "cpu", 1, False)[0]
    bank = SliderBank(pipe.unet)
    bank.add("trained", state)
    bank.add("random", random_slider(pipe.unet, rank=SPEC.rank, seed=3, std=0.05))
    gen = torch.Generator().manual_seed(12345)
    cos = {"trained": [], "random": []}
    try:
        with torch.no_grad():
            for t in (900, 700, 500, 300, 100):
                x = torch.randn(1, 4, 8, 8, generator=gen)
                bank.clear_route()
                off_neutral = _eps(pipe, x, t, neutral)
                direction = _eps(pipe, x, t, positive) - off_neutral  # unconditional == neutral prompt
                for name in cos:
                    bank.route_uniform(name, 1.0, 1)
                    change = _eps(pipe, x, t, neutral) - off_neutral
                    bank.clear_route()
                    cos[name].append(F.cosine_similarity(change.flatten(), direction.flatten(), dim=0).item())
    finally:
        bank.detach()
    trained_cos, random_cos = np.mean(cos["trained"]), np.mean(cos["random"])
    assert min(cos["trained"]) > 0.3, cos
    assert trained_cos > random_cos + 0.3, cos


# --------------------------------------------------------------------------- store-level runs
def _config(tiny_world, tmp_path, shifts=("heavy_snow", "cartoon_style"), iterations=2) -> BuildConfig:
    return BuildConfig.model_validate(
        {
            "benchmark": {"classes": [1], "seeds": [1], "shifts": list(shifts)},
            "generator": {
                "model": tiny_world["model"],
                "class_tokens": {"kind": "ti_folder", "path": tiny_world["tokens"]},
                "resolution": 64,
                "image_size": 64,
                "dtype": "float32",
            },
            "classifiers": [{"name": "r", "model": "resnet18"}],
            # num_gpus stays at its default of 1: on a CPU machine the Ray runner must cope.
            "slider_training": {"iterations": iterations, "max_denoise_steps": 3, "dtype": "float32"},
            "protocol": "custom",  # the toy UNet trains at its own 64 px, batch 1, attention only
        }
    )


def _run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    from pipeline.cli.train_sliders import register

    register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


def test_train_sliders_local_writes_files_and_resumes(tiny_world, pipe, tmp_path, capsys):
    cfg = _config(tiny_world, tmp_path)
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    store = tmp_path / "store"
    argv = ["train-sliders", str(cfg_file), "--output", str(store), "--runner", "local", "--iterations", "2"]
    assert _run_cli(argv) == 0
    out = capsys.readouterr().out
    assert "[train-sliders] 1/2 heavy_snow/001_goldfish: final loss" in out
    assert "[train-sliders] 2/2 cartoon_style/001_goldfish: final loss" in out

    mtimes = {}
    for shift in ("heavy_snow", "cartoon_style"):
        path = store / shift / "001.safetensors"
        meta = json.loads((store / shift / "001.json").read_text())
        assert meta["class_id"] == 1 and meta["class_name"] == "goldfish" and meta["shift"] == shift
        assert (meta["rank"], meta["alpha"], meta["targets"], meta["method"]) == (4, 1.0, "attn", "noxattn")
        assert meta["iterations"] == 2 and np.isfinite(meta["final_loss"])
        assert meta["base_model"] == tiny_world["model"] and meta["base_model_hash"].startswith("sha256:")
        assert meta["hash_of"] == "unet config + weights"
        assert meta["positive_prompt"] == f"<goldfish-1>, in {shift.replace('_', ' ')}" and meta["created"]
        bank = SliderBank(pipe.unet)
        bank.add(shift, load_slider_file(str(path)))
        bank.detach()
        mtimes[path] = os.stat(path).st_mtime_ns
    # Distinct (class, shift) -> distinct seeds and sliders.
    a, b = (load_slider_file(str(store / s / "001.safetensors")) for s in ("heavy_snow", "cartoon_style"))
    assert any(not torch.equal(a[k], b[k]) for k in a)

    lines: list[str] = []
    summary = train_sliders(cfg, str(store), runner="local", echo=lines.append)
    assert not summary.trained and len(summary.skipped) == 2 and not summary.failed
    assert all("skipped" in line for line in lines) and len(lines) == 2
    assert all(os.stat(p).st_mtime_ns == m for p, m in mtimes.items())

    # A slider whose metadata JSON (the done-marker) is missing is trained again.
    (store / "cartoon_style" / "001.json").unlink()
    lines.clear()
    summary = train_sliders(cfg, str(store), runner="local", echo=lines.append)
    assert [r["job"]["shift"] for r in summary.trained] == ["cartoon_style"] and len(summary.skipped) == 1
    assert (store / "cartoon_style" / "001.json").is_file()


@pytest.mark.slow
def test_train_sliders_on_ray(tiny_world, tmp_path, ray_session):
    cfg = _config(tiny_world, tmp_path, shifts=("heavy_snow",), iterations=2)
    store = tmp_path / "ray-store"
    lines: list[str] = []
    summary = train_sliders(cfg, str(store), runner="ray", echo=lines.append)
    assert not summary.failed, summary.failed
    assert len(summary.trained) == 1
    assert any(line.startswith("[train-sliders] 1/1 heavy_snow/001_goldfish: final loss") for line in lines)
    meta = json.loads((store / "heavy_snow" / "001.json").read_text())
    assert meta["device"] == "cpu" and meta["iterations"] == 2
    # Same seed and code in a Ray worker as in-process: the same slider.
    local_store = tmp_path / "local-store"
    train_sliders(cfg, str(local_store), runner="local", echo=lambda _: None)
    a = load_slider_file(str(store / "heavy_snow" / "001.safetensors"))
    b = load_slider_file(str(local_store / "heavy_snow" / "001.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_gpu_requests_on_a_cpu_only_local_ray_fall_back_to_the_cpu(monkeypatch):
    """A local Ray with no GPU (one the user started with ray.init(num_cpus=...)) cannot meet a
    GPU request: pools run on the CPU instead of pending forever; a cluster address keeps it."""
    import ray

    from pipeline.executors.ray_data import cpu_only_local_cluster

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    assert cpu_only_local_cluster(None) is True
    assert cpu_only_local_cluster("ray://head:10001") is False
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0, "GPU": 1.0})
    assert cpu_only_local_cluster(None) is False


def test_bad_slider_pattern_is_reported(tiny_world, tmp_path):
    cfg = _config(tiny_world, tmp_path)
    cfg.generator.slider_pattern = "{shift}/{class_id:03d}.npz"
    with pytest.raises(ValueError, match=r"generator.slider_pattern .*\.npz"):
        train_sliders(cfg, str(tmp_path / "s"), runner="local", echo=lambda _: None)


def test_missing_class_tokens_are_reported_before_training(tiny_world, tmp_path):
    cfg = _config(tiny_world, tmp_path)
    cfg.generator.class_tokens = ClassTokens(kind="ti_folder", path=str(tmp_path / "no-tokens"))
    with pytest.raises(FileNotFoundError, match=r"generator.class_tokens: .*no-tokens/1.bin"):
        train_sliders(cfg, str(tmp_path / "s"), runner="local", echo=lambda _: None)


def test_failing_pairs_are_reported_and_leave_no_files(tiny_world, tmp_path):
    tokens = tmp_path / "bad-tokens"
    tokens.mkdir()
    (tokens / "1.bin").write_bytes(b"not a torch file")
    cfg = _config(tiny_world, tmp_path)
    cfg.generator.class_tokens = ClassTokens(kind="ti_folder", path=str(tokens))
    store = tmp_path / "s"
    lines: list[str] = []
    summary = train_sliders(cfg, str(store), runner="local", echo=lines.append)
    assert not summary.trained and sorted(summary.failed) == ["cartoon_style/001_goldfish", "heavy_snow/001_goldfish"]
    assert all("FAILED" in line for line in lines) and len(lines) == 2
    assert not store.exists() or not any(store.rglob("*.json"))


def test_bad_positive_prompt_is_reported_up_front(tiny_world, tmp_path):
    """A placeholder the prompt cannot fill is refused when the config is validated, before any training."""
    raw = _config(tiny_world, tmp_path).model_dump(mode="json")
    raw["slider_training"]["positive_prompt"] = "{token} in {shift}"
    with pytest.raises(ValueError, match=r"positive_prompt[\s\S]*unknown field \{shift\}; allowed: \{shift_words\}, \{token\}"):
        BuildConfig.model_validate(raw)
