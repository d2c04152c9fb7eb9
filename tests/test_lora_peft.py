"""Slider training on peft: the exported layout, old and new sliders side by side, peft's mixed batches.

The oracle for the layout is written here from the original trainer's rules (CNS-Bench
``trainscripts/textsliders/lora.py``): walk the UNet's modules; a module whose class is a
target (``Attention``; for "c3lier" also ``ResnetBlock2D``, ``Downsample2D``,
``Upsample2D``, ``DownBlock2D``, ``UpBlock2D``) contributes each Linear/Conv2d inside it;
``noxattn`` skips a module whose name contains ``attn2`` or ``time_embed``; the key is
``lora_unet_`` + the module path with ``.`` -> ``_``; down ``[r, in(, kh, kw)]``, up
``[out, r(, 1, 1)]``, alpha a scalar.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from pipeline.config import ClassTokens, SliderTrainingSpec, load_config
from pipeline.labels import label_space
from pipeline.models import diffusion
from pipeline.models.lora import SliderBank, load_slider_file, random_slider, save_slider_file
from pipeline.models.peft_lora import PeftSlider
from pipeline.train import sliders

ROOT = Path(__file__).resolve().parent.parent
WORLD_SLIDER = ROOT / "assets" / "world" / "sliders" / "blur" / "002.safetensors"
ATTN = ["Attention"]
CONV = ["ResnetBlock2D", "Downsample2D", "Upsample2D", "DownBlock2D", "UpBlock2D"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def published_layout(unet: nn.Module, classes: list[str], rank: int) -> dict[str, tuple]:
    """Key -> shape (``alpha`` -> ``()``) of a published slider, from the original's rules."""
    out: dict[str, tuple] = {}
    for name, module in unet.named_modules():
        if "attn2" in name or "time_embed" in name or module.__class__.__name__ not in classes:
            continue
        for child_name, child in module.named_modules():
            if child.__class__.__name__ not in ("Linear", "Conv2d"):
                continue
            key = f"lora_unet_{name}.{child_name}".replace(".", "_")
            if isinstance(child, nn.Linear):
                out[f"{key}.lora_down.weight"] = (rank, child.in_features)
                out[f"{key}.lora_up.weight"] = (child.out_features, rank)
            else:
                out[f"{key}.lora_down.weight"] = (rank, child.in_channels, *child.kernel_size)
                out[f"{key}.lora_up.weight"] = (child.out_channels, rank, 1, 1)
            out[f"{key}.alpha"] = ()
    return out


def layout(state: dict[str, torch.Tensor]) -> dict[str, tuple]:
    return {k: tuple(v.shape) for k, v in state.items()}


@pytest.fixture(scope="module")
def tiny_pipe(tiny_world):
    pipe = diffusion.load_pipeline(tiny_world["model"], torch.float32, "cpu")
    tokens = diffusion.install_class_tokens(
        pipe, ClassTokens(kind="ti_folder", path=tiny_world["tokens"]), [1], label_space()
    )
    return pipe, tokens[1]


@pytest.mark.parametrize("targets,classes", [("attn", ATTN), ("attn_conv", ATTN + CONV)])
def test_trained_slider_has_the_published_layout(tiny_pipe, targets, classes):
    pipe, token = tiny_pipe
    spec = SliderTrainingSpec(
        targets=targets, rank=4, alpha=1.0, iterations=2, max_denoise_steps=2, learning_rate=1e-2, dtype="float32"
    )
    state, losses = sliders.train_slider(pipe, token, "heavy_snow", spec, "cpu", seed=1, resolution=32)
    expected = published_layout(pipe.unet, classes, rank=4)
    assert layout(state) == expected
    assert all(float(state[k]) == 1.0 for k in expected if k.endswith(".alpha"))
    assert all(v.dtype == torch.float32 for v in state.values()) and len(losses) == 2
    if targets == "attn_conv":  # the convolutions are there: 3x3 resnet convs, 1x1 up
        conv = "lora_unet_down_blocks_0_resnets_0_conv1"
        assert state[f"{conv}.lora_down.weight"].shape[2:] == (3, 3)
        assert any("time_emb_proj" in k for k in state) and any("downsamplers" in k for k in state)
    # Training went through peft and left the UNet as it was: no peft layer, no hook.
    from peft.tuners.tuners_utils import BaseTunerLayer

    assert not any(isinstance(m, BaseTunerLayer) for m in pipe.unet.modules())
    assert not hasattr(pipe.unet, "peft_config")
    assert all(not m._forward_hooks for m in pipe.unet.modules())


def test_peft_slider_exports_what_it_holds_and_removes_cleanly(tiny_pipe):
    pipe, _ = tiny_pipe
    unet = pipe.unet
    before = {k: v.clone() for k, v in unet.state_dict().items()}
    types = [type(m) for m in unet.modules()]
    state = random_slider(unet, targets="attn_conv", seed=5, std=0.1)
    slider = PeftSlider(unet, rank=4, alpha=1.0, targets="attn_conv")
    try:
        slider.load_published(state)
        assert slider.state_dict().keys() == state.keys()
        assert all(torch.equal(slider.state_dict()[k], state[k]) for k in state)
        with pytest.raises(ValueError, match="shape"):
            slider.load_published({**state, next(iter(state)): torch.zeros(1)})
    finally:
        slider.remove()
    assert [type(m) for m in unet.modules()] == types
    assert all(torch.equal(v, before[k]) for k, v in unet.state_dict().items())


def test_peft_adapter_computes_the_slider_formula(tiny_pipe):
    """peft's forward (LoRA on) equals the project's hooks at multiplier 1, conv layers included."""
    pipe, _ = tiny_pipe
    unet = pipe.unet
    state = random_slider(unet, targets="attn_conv", seed=6, std=0.1)
    gen = torch.Generator().manual_seed(0)
    x, emb = torch.randn(2, 4, 8, 8, generator=gen), torch.randn(2, 77, 32, generator=gen)
    bank = SliderBank(unet)
    try:
        bank.add("s", state)
        bank.route_uniform("s", 1.0, 2)
        with torch.no_grad():
            hooks = unet(x, 400, encoder_hidden_states=emb).sample
    finally:
        bank.detach()
    slider = PeftSlider(unet, targets="attn_conv")
    try:
        slider.load_published(state)
        slider.enable(True)
        with torch.no_grad():
            peft_out = unet(x, 400, encoder_hidden_states=emb).sample
            slider.enable(False)
            off = unet(x, 400, encoder_hidden_states=emb).sample
    finally:
        slider.remove()
    assert torch.allclose(hooks, peft_out, atol=1e-5)
    assert (hooks - off).abs().max() > 1e-2


# --------------------------------------------------------------------------- old and new sliders
@pytest.fixture(scope="module")
def world():
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    pipe = diffusion.load_pipeline(cfg.generator.model, torch.float32, "cpu")
    tokens = diffusion.install_class_tokens(pipe, cfg.generator.class_tokens, [2], cfg.benchmark.label_space)
    return cfg, pipe, tokens[2]


def test_slider_trained_before_and_after_peft_load_the_same_way(world, tmp_path):
    """``assets/world/sliders`` were trained before training moved onto peft; a slider
    trained now with the same settings has the same keys, shapes and alpha, and both load
    into the project's bank and into diffusers (``load_lora_weights``), where each gives
    the same UNet output through either."""
    cfg, pipe, token = world
    old = load_slider_file(str(WORLD_SLIDER))
    spec = cfg.slider_training.model_copy(update={"iterations": 2})
    new, _ = sliders.train_slider(pipe, token, "blur", spec, "cpu", seed=3, resolution=cfg.generator.resolution)
    assert layout(new) == layout(old) == published_layout(pipe.unet, ATTN, rank=spec.rank)
    assert all(float(new[k]) == float(old[k]) == spec.alpha for k in old if k.endswith(".alpha"))

    from diffusers import StableDiffusionPipeline

    user = StableDiffusionPipeline.from_pretrained(
        cfg.generator.model, dtype=torch.float32, safety_checker=None, requires_safety_checker=False
    )
    gen = torch.Generator().manual_seed(0)
    x, emb = torch.randn(1, 4, 4, 4, generator=gen), torch.randn(1, 77, 32, generator=gen)
    for name, state in (("before", old), ("after", new)):
        path = tmp_path / f"{name}.pt"  # the .pt form of the layout loads too
        save_slider_file(state, str(path))
        bank = SliderBank(pipe.unet)
        try:
            bank.add(name, load_slider_file(str(path)))
            bank.route_uniform(name, 2.0, 1)
            with torch.no_grad():
                ours = pipe.unet(x, 300, encoder_hidden_states=emb).sample
        finally:
            bank.detach()
        user.load_lora_weights(load_slider_file(str(path)), adapter_name=name)
        user.set_adapters([name], [2.0])
        with torch.no_grad():
            theirs = user.unet(x, 300, encoder_hidden_states=emb).sample
        adapted = {n for n, m in user.unet.named_modules() if hasattr(m, "lora_A") and name in m.lora_A}
        slider_layers = {k[: -len(".alpha")] for k in state if k.endswith(".alpha")}
        assert {f"lora_unet_{n}".replace(".", "_") for n in adapted} == slider_layers
        assert torch.allclose(ours, theirs, atol=1e-5), name
        user.delete_adapters([name])


@pytest.mark.slow
@pytest.mark.integration  # trains a slider on the shipped world's model: a minute of CPU
def test_peft_trainer_reproduces_a_shipped_world_slider(tmp_path):
    """Retraining ``blur/002`` with its recorded settings on peft gives the shipped slider
    (trained by the hook-based trainer before): the same final loss and weights."""
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    meta = json.loads(WORLD_SLIDER.with_suffix(".json").read_text())
    job = {j.label: j for j in sliders.plan_slider_jobs(cfg, str(tmp_path))}["blur/002_two"]
    assert job.seed == meta["seed"]
    result = sliders.SliderTrainer(cfg, str(tmp_path), "cpu", 1).train(job)
    assert result["final_loss"] == pytest.approx(meta["final_loss"], rel=1e-4)
    new, old = load_slider_file(job.path), load_slider_file(str(WORLD_SLIDER))
    assert new.keys() == old.keys()
    assert max(float((new[k] - old[k]).abs().max()) for k in old) < 1e-4


# --------------------------------------------------------------------------- mixed batches
def test_peft_mixed_batch_equals_the_per_row_bank(tiny_world):
    """One UNet batch, one (slider, multiplier) per row: peft's ``adapter_names`` path and
    the project's hooks agree, including rows without a slider and a repeated slider."""
    from diffusers import UNet2DConditionModel

    spec = importlib.util.spec_from_file_location("bench_peft_bank", ROOT / "bench" / "peft_bank.py")
    peft_bank = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peft_bank)  # bench/ is not a package the tests import
    PeftMixedBank = peft_bank.PeftMixedBank

    unet = UNet2DConditionModel.from_pretrained(tiny_world["model"], subfolder="unet")
    a = random_slider(unet, targets="attn_conv", seed=1, std=0.1)
    b = random_slider(unet, targets="attn", seed=2, std=0.1)
    rows, mults = ["a", "a", None, "b", "a", "b"], [0.5, 2.5, 0.0, 1.0, 0.0, 2.5]
    gen = torch.Generator().manual_seed(0)
    x, emb = torch.randn(6, 4, 8, 8, generator=gen), torch.randn(6, 77, 32, generator=gen)
    bank = SliderBank(unet)
    try:
        bank.add("a", a), bank.add("b", b)
        bank.route(rows, mults)
        with torch.no_grad():
            hooks = unet(x, 600, encoder_hidden_states=emb).sample
    finally:
        bank.detach()
    mixed = PeftMixedBank(unet)
    mixed.add("a", a), mixed.add("b", b)
    mixed.route(rows, mults)
    with torch.no_grad():
        peft_out = unet(x, 600, encoder_hidden_states=emb).sample
    mixed.clear_route()
    with torch.no_grad():
        off = unet(x, 600, encoder_hidden_states=emb).sample
    assert len(unet.peft_config) == 4  # one adapter per (slider, nonzero multiplier)
    assert torch.allclose(hooks, peft_out, atol=1e-5)
    assert torch.equal(off[2], peft_out[2]) and torch.equal(off[4], peft_out[4])  # rows without a slider
    assert (off[1] - peft_out[1]).abs().max() > 1e-2
