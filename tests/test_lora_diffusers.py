"""Round trip through diffusers: a project slider in a plain ``StableDiffusionPipeline``.

A user loads a slider file with ``pipe.load_lora_weights`` and sets its multiplier with
``pipe.set_adapters``; with the slider on at every step that must give the project's
images (``lora_timestep_threshold: 1000``), and the CNS window (off while ``t >
threshold``) reproduced with a step callback must give the project's default build.
Both recipes are the ones in ``docs/lora.md``.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.config import ClassTokens, GeneratorSpec, load_config
from pipeline.labels import label_space
from pipeline.models.lora import random_slider, save_slider_file
from pipeline.models.sampler import SliderSampler

ROOT = Path(__file__).resolve().parent.parent
SCALES = [0.0, 0.5, 1.0, 2.5]
STEPS = 12


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def arr(img) -> np.ndarray:
    return np.asarray(img).astype(np.int16)


def project_sampler(world, slider_store: str, threshold: int) -> SliderSampler:
    spec = GeneratorSpec(
        model=world["model"],
        class_tokens=ClassTokens(kind="ti_folder", path=world["tokens"]),
        slider_store=slider_store,
        resolution=64,
        image_size=64,
        steps=STEPS,
        dtype="float32",
        lora_timestep_threshold=threshold,
    )
    s = SliderSampler(spec, "cpu", torch.float32)
    s.setup([1], label_space())
    return s


@pytest.fixture(scope="module")
def conv_store(tiny_world, tmp_path_factory):
    """A second store: the ``shift_a`` slider of class 1 with the convolution targets too ("c3lier")."""
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel.from_pretrained(tiny_world["model"], subfolder="unet")
    store = tmp_path_factory.mktemp("conv-sliders")
    state = random_slider(unet, targets="attn_conv", seed=11, std=0.15)
    assert any("resnets" in k for k in state) and any("samplers" in k for k in state)
    save_slider_file(state, str(store / "shift_a" / "001.safetensors"))
    return str(store)


def user_pipeline(world, slider_file: str):
    """What a diffusers user writes: the model, the class token, the slider as an adapter."""
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(
        world["model"], dtype=torch.float32, safety_checker=None, requires_safety_checker=False
    )
    pipe.set_progress_bar_config(disable=True)
    pipe.load_textual_inversion(f"{world['tokens']}/1.bin", token="<goldfish-1>")
    pipe.load_lora_weights(slider_file, adapter_name="slider")
    return pipe


def user_image(pipe, seed: int, callback=None):
    out = pipe(
        "a picture of a <goldfish-1>",
        negative_prompt=GeneratorSpec.model_fields["negative_prompt"].default,
        num_inference_steps=STEPS,
        guidance_scale=7.5,
        height=64,
        width=64,
        generator=torch.Generator().manual_seed(seed),
        callback_on_step_end=callback,
    )
    return out.images[0]


def cns_window(scale: float, threshold: int):
    """The step callback of the CNS window (docs/lora.md): after step i, set the slider for step i+1."""

    def callback(pipe, i, t, kwargs):
        timesteps = pipe.scheduler.timesteps
        if i + 1 < len(timesteps):
            on = int(timesteps[i + 1]) <= threshold
            pipe.set_adapters(["slider"], [scale if on else 0.0])
        return kwargs

    return callback


@pytest.mark.parametrize("store", ["attn", "attn_conv"])
def test_set_adapters_equals_project_with_the_slider_always_on(tiny_world, conv_store, store):
    sliders = tiny_world["sliders"] if store == "attn" else conv_store
    sampler = project_sampler(tiny_world, sliders, threshold=1000)
    group = sampler.generate_group(1, 3, ["shift_a"], SCALES)
    assert group.stats["window_start"] == 0  # no step before the window: the slider is always on
    pipe = user_pipeline(tiny_world, f"{sliders}/shift_a/001.safetensors")
    diffs = {}
    for scale in SCALES:
        pipe.set_adapters(["slider"], [scale])
        diffs[scale] = int(np.abs(arr(user_image(pipe, 3)) - arr(group.image("shift_a", scale))).max())
    assert all(d <= 1 for d in diffs.values()), diffs  # within 1/255
    # ... and the slider really moves the image, so equality is not vacuous.
    assert np.abs(arr(group.image("shift_a", 2.5)) - arr(group.image("shift_a", 0.0))).max() > 20


def test_step_callback_window_equals_project_build(tiny_world, conv_store):
    threshold = 750
    sampler = project_sampler(tiny_world, conv_store, threshold=threshold)
    group = sampler.generate_group(1, 5, ["shift_a"], SCALES)
    assert 0 < group.stats["window_start"] < STEPS  # some steps before the window, some inside
    pipe = user_pipeline(tiny_world, f"{conv_store}/shift_a/001.safetensors")
    always_on = {}
    for scale in (1.0, 2.5):
        first = int(pipe.scheduler.config.num_train_timesteps)  # timestep 0 of the run is > threshold
        pipe.set_adapters(["slider"], [0.0 if first > threshold else scale])
        img = user_image(pipe, 5, cns_window(scale, threshold))
        assert np.abs(arr(img) - arr(group.image("shift_a", scale))).max() <= 1, scale
        pipe.set_adapters(["slider"], [scale])
        always_on[scale] = user_image(pipe, 5)
    # The window matters: without it the images differ.
    assert np.abs(arr(always_on[2.5]) - arr(group.image("shift_a", 2.5))).max() > 5


def _world_config(tmp_path: Path) -> Path:
    """``configs/demo.yaml`` with the slider always on, reduced to one class and seed.

    The copy sits in ``tmp/configs/`` next to a link ``tmp/assets`` to the shipped world,
    so its relative paths resolve as in the original.
    """
    import yaml

    raw = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    raw["benchmark"].update(classes=["two"], seeds=[1], shifts=["blur", "rotation"], scales=[0, 1.0, 2.5])
    raw["generator"]["lora_timestep_threshold"] = 1000
    (tmp_path / "configs").mkdir()
    (tmp_path / "assets").symlink_to(ROOT / "assets")
    path = tmp_path / "configs" / "demo_always_on.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow
def test_demo_build_with_threshold_1000_equals_diffusers_set_adapters(tmp_path):
    """The contract on the shipped world: build the demo config (window always on) and
    regenerate its images with nothing but diffusers."""
    from diffusers import StableDiffusionPipeline
    from PIL import Image

    from pipeline.cli import main

    cfg_path = _world_config(tmp_path)
    out = tmp_path / "out"
    assert main(["build", str(cfg_path), "--output", str(out), "--runner", "local"]) == 0
    images = {}
    for tar in sorted((out / "images").glob("*.tar")):
        with tarfile.open(tar) as tf:
            metas = {m.name[: -len(".json")]: m for m in tf.getmembers() if m.name.endswith(".json")}
            for key, m in metas.items():
                meta = json.load(tf.extractfile(m))
                img = Image.open(tf.extractfile(f"{key}.png")).convert("RGB")
                images[(meta["shift"], float(meta["scale"]))] = img
    assert len(images) == 2 * 3

    cfg = load_config(cfg_path)
    gen = cfg.generator
    pipe = StableDiffusionPipeline.from_pretrained(
        gen.model, dtype=torch.float32, safety_checker=None, requires_safety_checker=False
    )
    pipe.set_progress_bar_config(disable=True)
    token_file = Path(gen.class_tokens.path) / "2.bin"
    pipe.load_textual_inversion(str(token_file), token="<two-2>")
    for shift in ("blur", "rotation"):
        pipe.load_lora_weights(f"{gen.slider_store}/{shift}/002.safetensors", adapter_name=shift)
    worst = 0
    for (shift, scale), built in images.items():
        pipe.set_adapters([shift], [scale])
        img = pipe(
            gen.prompt.format(token="<two-2>"),
            negative_prompt=gen.negative_prompt,
            num_inference_steps=gen.steps,
            guidance_scale=gen.guidance_scale,
            height=gen.resolution,
            width=gen.resolution,
            generator=torch.Generator().manual_seed(1),
        ).images[0]
        worst = max(worst, int(np.abs(arr(img) - arr(built)).max()))
    assert worst <= 1, worst
    # Scale 2.5 differs from scale 0 in the build: the sliders act.
    assert np.abs(arr(images[("blur", 2.5)]) - arr(images[("blur", 0.0)])).max() > 20
    shutil.rmtree(out)
