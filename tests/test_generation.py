"""Generation semantics: the LoRA window, shared prefix vs the per-image reference, batching."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.config import ClassTokens, GeneratorSpec
from pipeline.labels import label_space
from pipeline.models.sampler import SliderSampler

SCALES = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]


def make_sampler(world, **kw) -> SliderSampler:
    spec = GeneratorSpec(
        model=world["model"],
        class_tokens=ClassTokens(kind="ti_folder", path=world["tokens"]),
        slider_store=world["sliders"],
        resolution=64,
        image_size=64,
        dtype="float32",
        **kw,
    )
    s = SliderSampler(spec, "cpu", torch.float32)
    s.setup(world["classes"], label_space())
    return s


@pytest.fixture(scope="module")
def sampler(tiny_world):
    return make_sampler(tiny_world, branch_batch_size=16)


def arr(img) -> np.ndarray:
    return np.asarray(img).astype(np.int16)


def test_class_tokens_loaded_by_textual_inversion(sampler):
    assert sampler.tokens == {1: "<goldfish-1>", 22: "<bald eagle-22>"}
    ids = sampler.pipe.tokenizer("a picture of a <goldfish-1>").input_ids
    assert sampler.pipe.tokenizer.convert_tokens_to_ids("<goldfish-1>") in ids


def test_lora_window_follows_timestep_threshold(sampler):
    """Reference loop: the slider is off for t > 750 and on (multiplier = scale) for t <= 750."""
    seen = []

    def record(module, args, kwargs):
        t = int(args[1])
        mults = sampler.bank.multipliers  # None: no slider routed
        seen.append((t, 0.0 if mults is None else float(mults[0])))

    handle = sampler.pipe.unet.register_forward_pre_hook(record, with_kwargs=True)
    try:
        sampler.reference_image(1, 3, "shift_a", 1.5)
    finally:
        handle.remove()
    assert len(seen) == 50 and seen[0][0] == 981 and seen[-1][0] == 1
    off = [t for t, m in seen if m == 0.0]
    on = [t for t, m in seen if m == 1.5]
    assert len(off) == 12 and len(on) == 38 and len(off) + len(on) == 50
    assert min(off) > 750 and max(on) <= 750


def test_scale_zero_is_identical_across_shifts(sampler):
    a = sampler.reference_image(1, 3, "shift_a", 0.0)
    b = sampler.reference_image(1, 3, "shift_b", 0.0)
    assert np.array_equal(arr(a), arr(b))
    assert not np.array_equal(arr(a), arr(sampler.reference_image(1, 3, "shift_a", 2.5)))


def test_slider_acts_only_inside_the_window(tiny_world):
    """With the window closed (threshold below every timestep) the slider changes nothing."""
    closed = make_sampler(tiny_world, lora_timestep_threshold=0)
    base = closed.reference_image(22, 5, "shift_a", 0.0)
    shifted = closed.reference_image(22, 5, "shift_a", 2.5)
    assert np.array_equal(arr(base), arr(shifted))


def test_shared_prefix_group_matches_per_image_reference(sampler):
    group = sampler.generate_group(22, 7, ["shift_a", "shift_b"], SCALES)
    # 12 pre-window steps once (x2 for CFG) + 11 branches x 38 window steps x 2
    assert group.unet_evals == 12 * 2 + (1 + 2 * 5) * 38 * 2
    assert group.stats["window_start"] == 12
    for shift, scale in [("shift_a", 0.0), ("shift_a", 1.0), ("shift_a", 2.5), ("shift_b", 0.5), ("shift_b", 2.5)]:
        ref = arr(sampler.reference_image(22, 7, shift, scale))
        got = arr(group.image(shift, scale))
        # Same maths, different batch composition: equal up to float rounding.
        assert np.abs(ref - got).max() <= 2, (shift, scale)
    assert np.abs(arr(group.image("shift_a", 2.5)) - arr(group.image("shift_a", 0.0))).mean() > 2.0


def test_results_do_not_depend_on_batch_composition(tiny_world, sampler):
    one = make_sampler(tiny_world, branch_batch_size=3)
    g1 = one.generate_group(1, 9, ["shift_a", "shift_b"], SCALES)
    g16 = sampler.generate_group(1, 9, ["shift_a", "shift_b"], SCALES)
    g_sub = sampler.generate_group(1, 9, ["shift_b"], SCALES)
    for shift in ("shift_a", "shift_b"):
        for scale in SCALES:
            assert np.abs(arr(g1.image(shift, scale)) - arr(g16.image(shift, scale))).max() <= 2
    for scale in SCALES:
        assert np.abs(arr(g_sub.image("shift_b", scale)) - arr(g16.image("shift_b", scale))).max() <= 2


def test_missing_slider_is_reported(tiny_world, sampler):
    with pytest.raises(FileNotFoundError, match="shift_zzz/001.safetensors"):
        sampler.generate_group(1, 3, ["shift_zzz"], SCALES)


def test_prompt_baseline_generator(tiny_world, sampler):
    """2P: scale 0 is the class prompt (as with sliders), every scale > 0 the shift prompt."""
    from pipeline.models.sampler import PromptSampler

    spec = sampler.spec.model_copy(update={"kind": "prompt", "slider_store": None})
    two_p = PromptSampler(spec, "cpu", torch.float32)
    two_p.setup(tiny_world["classes"], label_space())
    group = two_p.generate_group(1, 4, ["heavy_snow", "painting_style"], SCALES)
    assert group.unet_evals == 3 * 50 * 2  # base + one image per shift, all steps
    assert np.abs(arr(group.image("heavy_snow", 0.0)) - arr(sampler.reference_image(1, 4, None, 0.0))).max() <= 2
    snow = arr(two_p.reference_image(1, 4, "heavy_snow", 2.5))
    for scale in SCALES[1:]:
        assert np.abs(arr(group.image("heavy_snow", scale)) - snow).max() <= 2
    assert np.abs(snow - arr(group.image("painting_style", 1.0))).mean() > 0.5


def test_samplers_are_siblings_and_the_prompt_one_hooks_nothing(tiny_world, sampler):
    """Slider and prompt samplers share one text-to-image base; only the slider one hooks the UNet."""
    from pipeline.models.sampler import PromptSampler, SliderSampler, TextToImageSampler, get_sampler

    assert issubclass(PromptSampler, TextToImageSampler) and not issubclass(PromptSampler, SliderSampler)
    hooked = sum(len(m._forward_hooks) for m in sampler.pipe.unet.modules())
    assert hooked > 0  # the slider bank, one hook per target layer
    spec = sampler.spec.model_copy(update={"kind": "prompt", "slider_store": None})
    labels = label_space()
    two_p = get_sampler("prompt", spec, tiny_world["classes"], labels, "cpu", torch.float32)
    assert type(two_p) is PromptSampler and not hasattr(two_p, "bank")
    assert sum(len(m._forward_hooks) for m in two_p.pipe.unet.modules()) == 0
    assert get_sampler("prompt", spec, tiny_world["classes"], labels, "cpu", torch.float32) is two_p  # built once
    with pytest.raises(ValueError, match=r"generator.kind 'corruption' has no text-to-image sampler; choose one of \['prompt', 'slider'\]"):
        get_sampler("corruption", spec, tiny_world["classes"], labels, "cpu", torch.float32)
