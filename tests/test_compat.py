"""Published artefact layouts load to the same model: same inputs, identical images.

* a slider as ``.pt`` (``torch.save`` of the state dict, as the original sliders code
  writes it) or as ``.safetensors``;
* class tokens as a Dataset-Interfaces ``ti_folder`` (``{i}.bin`` holding a raw tensor,
  or a ``{token: tensor}`` dict) or as the CNS-Bench ``text_encoder_dir``
  (``tokenizer/``, ``text_encoder/``, ``tokens.pt`` with one token per class of the label
  space).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.config import ClassTokens, GeneratorSpec
from pipeline.labels import label_space
from pipeline.models.diffusion import ti_token
from pipeline.models.lora import load_slider_file
from pipeline.models.sampler import SliderSampler

SCALES = [0.0, 1.0, 2.5]
STEPS = 10  # the window (t <= 750) still starts after a few steps: 901, 801 off, then on


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def make_sampler(world, class_tokens: ClassTokens, **kw) -> SliderSampler:
    spec = GeneratorSpec(
        model=world["model"],
        class_tokens=class_tokens,
        slider_store=kw.pop("slider_store", world["sliders"]),
        resolution=64,
        image_size=64,
        dtype="float32",
        steps=STEPS,
        **kw,
    )
    s = SliderSampler(spec, "cpu", torch.float32)
    s.setup(world["classes"], label_space())
    return s


def images(sampler: SliderSampler, class_id: int, seed: int, shift: str) -> dict[float, np.ndarray]:
    group = sampler.generate_group(class_id, seed, [shift], SCALES)
    return {s: np.asarray(group.image(shift, s)) for s in SCALES}


def assert_same(a: dict[float, np.ndarray], b: dict[float, np.ndarray]) -> None:
    for scale in SCALES:
        assert np.array_equal(a[scale], b[scale]), f"scale {scale}: images differ"


@pytest.fixture(scope="module")
def ti_dict_sampler(tiny_world):
    """The conftest world: ti_folder of ``{token: tensor}`` dicts, sliders as safetensors."""
    return make_sampler(tiny_world, ClassTokens(kind="ti_folder", path=tiny_world["tokens"]))


def test_pt_and_safetensors_sliders_give_identical_images(tiny_world, ti_dict_sampler, tmp_path):
    store = tmp_path / "pt-store"
    for shift in tiny_world["shifts"]:
        for c in tiny_world["classes"]:
            state = load_slider_file(f"{tiny_world['sliders']}/{shift}/{c:03d}.safetensors")
            (store / shift).mkdir(parents=True, exist_ok=True)
            torch.save(state, store / shift / f"{c:03d}.pt")
    pt = make_sampler(
        tiny_world,
        ClassTokens(kind="ti_folder", path=tiny_world["tokens"]),
        slider_store=str(store),
        slider_pattern="{shift}/{class_id:03d}.pt",
    )
    a = images(ti_dict_sampler, 22, 4, "shift_b")
    b = images(pt, 22, 4, "shift_b")
    assert_same(a, b)
    # The slider is active (otherwise equality would be vacuous).
    assert not np.array_equal(a[0.0], a[2.5])


def test_ti_folder_raw_tensor_and_dict_files_give_identical_images(tiny_world, ti_dict_sampler, tmp_path):
    raw = tmp_path / "tokens-raw"
    raw.mkdir()
    for c in tiny_world["classes"]:
        state = torch.load(f"{tiny_world['tokens']}/{c}.bin", weights_only=True)
        (embedding,) = state.values()
        torch.save(embedding.clone(), raw / f"{c}.bin")
    s_raw = make_sampler(tiny_world, ClassTokens(kind="ti_folder", path=str(raw)))
    assert s_raw.tokens == ti_dict_sampler.tokens == {1: "<goldfish-1>", 22: "<bald eagle-22>"}
    assert_same(images(ti_dict_sampler, 1, 6, "shift_a"), images(s_raw, 1, 6, "shift_a"))


def test_text_encoder_dir_gives_identical_images(tiny_world, ti_dict_sampler, tmp_path):
    """A CNS-style directory saved from a pipeline into which the tokens were loaded."""
    root = tmp_path / "cns-text-encoder"
    pipe = ti_dict_sampler.pipe
    pipe.tokenizer.save_pretrained(root / "tokenizer")
    pipe.text_encoder.save_pretrained(root / "text_encoder")
    labels = label_space()
    tokens = [ti_token(i, labels.name(i)) for i in range(len(labels))]
    words = [labels.name(i) for i in range(len(labels))]
    torch.save({"initializer_words": words, "tokens": tokens}, root / "tokens.pt")

    s_dir = make_sampler(tiny_world, ClassTokens(kind="text_encoder_dir", path=str(root)))
    assert s_dir.tokens == {1: "<goldfish-1>", 22: "<bald eagle-22>"}
    ids = s_dir.pipe.tokenizer("a picture of a <bald eagle-22>").input_ids
    assert s_dir.pipe.tokenizer.convert_tokens_to_ids("<bald eagle-22>") in ids
    assert_same(images(ti_dict_sampler, 22, 8, "shift_a"), images(s_dir, 22, 8, "shift_a"))


def test_text_encoder_dir_with_wrong_token_count_is_reported(tiny_world, ti_dict_sampler, tmp_path):
    root = tmp_path / "short"
    ti_dict_sampler.pipe.tokenizer.save_pretrained(root / "tokenizer")
    ti_dict_sampler.pipe.text_encoder.save_pretrained(root / "text_encoder")
    torch.save({"initializer_words": ["fish"], "tokens": ["<goldfish-1>"]}, root / "tokens.pt")
    with pytest.raises(ValueError, match=r"tokens.pt: expected 1000 tokens"):
        make_sampler(tiny_world, ClassTokens(kind="text_encoder_dir", path=str(root)))
