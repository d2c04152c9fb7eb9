"""Slider training under the CNS protocol: the original trainer's settings and module set.

The published sliders (``lora_unet_*`` keys) come from the original concept-slider trainer
with network type "c3lier" and training method "noxattn", where the convolution module
list is appended to the attention one in place, so convolutions are trained too.  The
expected key set is built here from the SD2 architecture by that trainer's own rule,
written out independently of :mod:`pipeline.models.lora`.
"""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.config import ClassTokens, parse_config

IMAGENET = {
    "benchmark": {"classes": [1], "seeds": [1], "shifts": ["heavy_snow"]},
    "classifiers": [{"name": "r", "model": "resnet18"}],
}

# The original LoRANetwork.create_modules: parents by class name, children by class name,
# noxattn skipping any *parent* path containing attn2 or time_embed.
_ORIGINAL_PARENTS = ["Attention"] + ["ResnetBlock2D", "Downsample2D", "Upsample2D", "DownBlock2D", "UpBlock2D"]
_ORIGINAL_CHILDREN = ["Linear", "Conv2d", "LoRACompatibleLinear", "LoRACompatibleConv"]


def published_lora_names(unet: torch.nn.Module) -> set[str]:
    names = set()
    for name, module in unet.named_modules():
        if "attn2" in name or "time_embed" in name:
            continue
        if module.__class__.__name__ in _ORIGINAL_PARENTS:
            for child_name, child in module.named_modules():
                if child.__class__.__name__ in _ORIGINAL_CHILDREN:
                    names.add(("lora_unet." + name + "." + child_name).replace(".", "_"))
    return names


def published_file_keys(unet: torch.nn.Module) -> set[str]:
    return {f"{n}.{suffix}" for n in published_lora_names(unet) for suffix in ("lora_down.weight", "lora_up.weight", "alpha")}


def test_cns_slider_training_defaults_are_the_original_trainers():
    st = parse_config(IMAGENET).slider_training
    assert (st.rank, st.alpha, st.targets, st.method) == (4, 1.0, "attn_conv", "noxattn")
    assert (st.iterations, st.learning_rate, st.eta, st.mode) == (400, 2e-4, 4.0, "enhance")
    assert (st.max_denoise_steps, st.resolution, st.batch_size, st.dtype) == (50, 512, 16, "bfloat16")
    assert st.positive_prompt == "{token}, in {shift_words}"


def test_custom_slider_training_keeps_the_previous_defaults_and_explicit_keys_win():
    raw = {**IMAGENET, "protocol": "custom", "generator": {"resolution": 64}}
    st = parse_config(raw).slider_training
    assert (st.targets, st.batch_size, st.resolution) == ("attn", 1, 64)
    st = parse_config({**IMAGENET, "slider_training": {"targets": "attn", "batch_size": 4}}).slider_training
    assert (st.targets, st.batch_size, st.resolution) == ("attn", 4, 512)


@pytest.fixture(scope="module")
def sd2_unet():
    """The real SD2 UNet architecture on the meta device (no weights, no memory)."""
    from diffusers import UNet2DConditionModel

    from pipeline.demo.tiny_sd import ARCH

    with torch.device("meta"):
        return UNet2DConditionModel(**ARCH["full"]["unet"])


def test_trained_module_set_equals_the_published_slider_keys_on_sd2(sd2_unet):
    from pipeline.models.lora import lora_key, target_modules
    from pipeline.train.sliders import init_slider_params

    spec = parse_config(IMAGENET).slider_training
    published = published_lora_names(sd2_unet)
    ours = {lora_key(p) for p in target_modules(sd2_unet, spec.targets, spec.method)}
    assert ours == published
    # What these names cover: self-attention and every conv/linear of the resnets and
    # up/down samplers, but no cross-attention and no transformer projections/feed-forward.
    assert "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q" in ours
    assert "lora_unet_down_blocks_0_resnets_0_conv1" in ours
    assert "lora_unet_down_blocks_0_resnets_0_time_emb_proj" in ours
    assert "lora_unet_down_blocks_0_downsamplers_0_conv" in ours
    assert "lora_unet_up_blocks_0_upsamplers_0_conv" in ours
    assert "lora_unet_mid_block_resnets_1_conv2" in ours
    assert not any("attn2" in k for k in ours)
    assert "lora_unet_down_blocks_0_attentions_0_proj_in" not in ours
    assert "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_ff_net_2" not in ours
    # The attention-only set of `custom` is a strict subset.
    assert {lora_key(p) for p in target_modules(sd2_unet, "attn", "noxattn")} < ours

    # The state dict the trainer starts from has exactly a published file's keys.
    params = init_slider_params(sd2_unet, spec, torch.Generator().manual_seed(0), "cpu", torch.float32)
    alphas = {k.replace(".lora_down.weight", ".alpha") for k in params if k.endswith(".lora_down.weight")}
    assert set(params) | alphas == published_file_keys(sd2_unet)
    conv = params["lora_unet_down_blocks_0_resnets_0_conv1.lora_down.weight"]
    assert conv.shape == (4, 320, 3, 3)  # down conv keeps the 3x3 kernel, rank 4


@pytest.fixture(scope="module")
def tiny_pipe(tiny_world):
    from pipeline.labels import label_space
    from pipeline.models import diffusion

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    p = diffusion.load_pipeline(tiny_world["model"], torch.float32, "cpu")
    tokens = diffusion.install_class_tokens(
        p, ClassTokens(kind="ti_folder", path=tiny_world["tokens"]), [1], label_space()
    )
    yield p, tokens[1]
    torch.set_num_threads(before)


def test_a_trained_cns_slider_has_the_published_keys_and_trains_in_batches(tiny_pipe):
    from pipeline.train.sliders import train_slider

    pipe, token = tiny_pipe
    spec = parse_config(IMAGENET).slider_training.model_copy(
        update={"iterations": 2, "max_denoise_steps": 3, "batch_size": 2, "dtype": "float32", "learning_rate": 1e-2}
    )
    state, losses = train_slider(pipe, token, "heavy_snow", spec, "cpu", seed=3, resolution=64)
    assert set(state) == published_file_keys(pipe.unet)
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
    assert any(float(v.abs().sum()) > 0 for k, v in state.items() if k.endswith("lora_up.weight"))
    # A batch of 2 is not a batch of 1 run twice: the objective sees both latents at once.
    single, _ = train_slider(pipe, token, "heavy_snow", spec.model_copy(update={"batch_size": 1}), "cpu", seed=3, resolution=64)
    key = next(k for k in state if k.endswith("lora_up.weight"))
    assert not torch.equal(state[key], single[key])
