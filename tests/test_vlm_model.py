"""The vlm classifier on a tiny random-weight LLaVA built here (config, tokenizer, save_pretrained).

Checks the model path without released weights: the loader is transformers' own
(``AutoProcessor`` / ``AutoModelForImageTextToText.from_pretrained``), the protocol's
prompt reaches the chat template, generation is batched (left padding) and reproducible
per sample id, and answers are parsed by the protocol.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from pipeline.config import VLMSpec
from pipeline.labels import label_space
from pipeline.models.vqa_protocols import IMAGENET_D_PROMPT, Question

DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory):
    from pipeline.demo.tiny_vlm import build_tiny_llava

    return str(build_tiny_llava(tmp_path_factory.mktemp("llava") / "m", [IMAGENET_D_PROMPT, *DIGITS], seed=3))


def _spec(path: str, **protocol) -> VLMSpec:
    return VLMSpec(name="llava", kind="vlm", model=path,
                          protocol={"kind": "two_choice", "distractors": "clip", "max_new_tokens": 4, **protocol})


def _images(n: int) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (32 + 8 * (i % 2), 32, 3), dtype=np.uint8)) for i in range(n)]


@pytest.fixture(scope="module")
def vlm(tiny_llava):
    from pipeline.models.vlm import VLMClassifier

    return VLMClassifier(_spec(tiny_llava, temperature=1.0), "cpu", label_space(DIGITS))


def test_loaded_through_transformers_auto_classes(vlm):
    assert type(vlm.model).__name__ == "LlavaForConditionalGeneration"
    assert vlm.tokenizer.padding_side == "left"


def test_prompt_reaches_the_chat_template(vlm):
    q = vlm.protocol.ask(2, DIGITS, "s1", ranked=[2, 7])
    prompt = vlm.chat_prompt(q)
    assert prompt == (
        "USER: <image>\nWhat is the main object in this image? Choose from the following list: two, seven. ASSISTANT:"
    )
    tokens = vlm.tokenizer.tokenize(prompt)
    assert tokens[-6:] == ["two", ",", "seven", ".", "assistant", ":"]


def test_generation_is_batched_reproducible_and_parsed(vlm, monkeypatch):
    import pipeline.models.vlm as V

    images = _images(5)
    truth = [1, 2, 3, 4, 5]
    sids = [f"shift/c{t}/s0/{t}" for t in truth]
    ranked = {"clip": [[t, (t + 1) % 10] for t in truth]}
    calls = []
    real = vlm.model.generate

    def spy(**kw):
        calls.append(kw["input_ids"].shape)
        assert (kw["attention_mask"][:, -1] == 1).all()  # left padding: every prompt ends at the right
        return real(**kw)

    monkeypatch.setattr(vlm.model, "generate", spy)
    first = vlm.answer(images, truth, sids, [None] * 5, ranked)
    assert len(calls) == 1 and calls[0][0] == 5  # one batched generate call
    again = vlm.answer(images, truth, sids, [None] * 5, ranked)
    assert first.answers == again.answers  # seeded by the sample id
    monkeypatch.setattr(V, "GENERATE_CHUNK", 2)
    chunked = vlm.answer(images, truth, sids, [None] * 5, ranked)
    assert len(calls) == 2 + 3 and chunked.answers == first.answers  # other batches, same answers
    other = vlm.answer(images, truth, [s + "x" for s in sids], [None] * 5, ranked)
    assert other.answers != first.answers  # temperature 1 on random weights: other seeds, other words
    # Parsed by the protocol: each answer's verdict is the rule applied to its text.
    for t, a, s, top1, p in zip(truth, first.answers, first.scored, first.top1, first.p_true):
        names = (DIGITS[t], DIGITS[(t + 1) % 10])
        assert s == vlm.protocol.score(Question("", t, names[0], (t, (t + 1) % 10), names), a)
        assert top1 == s.chosen and (np.isnan(p) if s.excluded else p == float(s.chosen == t))
    assert all(a and "<pad>" not in a and "</s>" not in a for a in first.answers)  # special tokens dropped


def test_answers_follow_the_generated_words(vlm, monkeypatch):
    """Generation replaced by fixed token ids: the decoded words are what the protocol scores."""
    import torch

    tok = vlm.tokenizer

    def fake(**kw):
        words = [["three", "."], ["four", "</s>"], ["seven", "<pad>"], ["two", "six"]]
        ids = torch.tensor([tok.convert_tokens_to_ids(w) for w in words])
        return torch.cat([kw["input_ids"], ids], dim=1)

    monkeypatch.setattr(vlm.model, "generate", fake)
    out = vlm.answer(_images(4), [3, 4, 5, 2], ["a", "b", "c", "d"], [None] * 4,
                     {"clip": [[3, 1], [1, 4], [7, 5], [2, 6]]})
    assert out.answers == ["three.", "four", "seven", "two six"]
    assert [s.verdict for s in out.scored] == ["TRUE", "TRUE", "FALSE", "BOTH"]
    assert out.top1 == [3, 4, 7, -1] and out.excluded == [False, False, False, True]


def test_pool_runs_the_distractor_source_first(vlm):
    from pipeline.models.classifiers import classify_all

    class Ranker:  # a classifier whose top-1 is always class 6
        name, asks, out_to_label = "clip", False, list(range(10))

        def predict(self, images):
            import torch

            logits = torch.zeros(len(images), 10)
            logits[:, 6], logits[:, 1] = 5.0, 4.0
            return logits

    images = _images(3)
    out = classify_all([vlm, Ranker()], images, [6, 2, 3], ["a", "b", "c"], [None] * 3)
    assert [r[0][0] for r in out][1] == 6 and out[1][3] == [None] * 3  # the ranker's columns, config order
    asked = [vlm.protocol.ask(t, DIGITS, s, ranked=[6, 1, 0, 2, 3]) for t, s in zip([6, 2, 3], "abc")]
    assert [q.option_names[1] for q in asked] == ["one", "six", "six"]  # top-2 when the top-1 is right
    assert len(out[0][3]) == 3 and all(isinstance(a, str) for a in out[0][3])


def test_greedy_at_temperature_zero_and_a_released_question(tiny_llava):
    from pipeline.models.vlm import VLMClassifier

    clf = VLMClassifier(_spec(tiny_llava, temperature=0.0, distractors="questions"), "cpu", label_space(DIGITS))
    images = _images(2)
    q = '{"question": {"file": "background", "gt_category": "one", "top1_pred_cate": "one", "top2_pred_cate": "five"}}'
    a = clf.answer(images, [1, 1], ["x", "y"], [q, q], {})
    b = clf.answer(images, [1, 1], ["z", "w"], [q, q], {})
    assert a.answers == b.answers  # greedy: the seed does not matter
    assert clf.chat_prompt(clf.protocol.ask(1, DIGITS, "x", released={
        "gt_category": "one", "top1_pred_cate": "one", "top2_pred_cate": "five"})).endswith("one, five. ASSISTANT:")


def test_bench_vlm_smallest_size(capsys):
    """bench/vlm.py at its smallest size: both paths run and give the same answers."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "vlm.py"
    spec = importlib.util.spec_from_file_location("bench_vlm", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.main(["--images", "3", "--batch", "3", "--hidden", "32", "--layers", "1", "--image-size", "32",
                      "--patch", "8", "--new-tokens", "2", "--json"])
    assert out["batched_images_per_s"] > 0 and out["one_at_a_time_images_per_s"] > 0 and out["speedup"] > 0
    assert out["answers_agree"] == 1.0


# --------------------------------------------------------------------------- LLaVA-1.5 as its builder runs it
def test_vision_tower_float32_with_a_float16_language_model(tiny_llava):
    """ImageNet-D's protocol: dtype float16, vision_dtype float32 (LLaVA's load_pretrained_model
    loads the CLIP tower apart in float32 and leaves it there under device_map "auto")."""
    from pipeline.models.vlm import VLMClassifier, vision_modules

    clf = VLMClassifier(_spec(tiny_llava, temperature=0.0).model_copy(
        update={"dtype": "float16", "vision_dtype": "float32"}), "cpu", label_space(DIGITS))
    tower, projector = vision_modules(clf.model)
    assert {p.dtype for p in tower.parameters()} == {torch.float32}
    assert {p.dtype for p in projector.parameters()} == {torch.float16}
    assert {p.dtype for p in clf.model.get_input_embeddings().parameters()} == {torch.float16}
    lm = clf.model.model.language_model
    assert {p.dtype for p in lm.parameters()} == {torch.float16}
    # The tower's float32 features reach the float16 projector cast to its dtype, and the answer is generated.
    seen = []
    handle = projector.register_forward_hook(lambda m, args, out: seen.append((args[0].dtype, out.dtype)))
    try:
        answers = clf.generate(_images(2), [clf.chat_prompt(clf.protocol.ask(1, DIGITS, "x", ranked=[1, 2]))] * 2, [1, 2])
    finally:
        handle.remove()
    assert seen and set(seen) == {(torch.float16, torch.float16)} and len(answers) == 2


def test_vision_dtype_of_a_model_without_a_vision_tower_is_refused(tiny_llava, monkeypatch):
    from pipeline.models import vlm as vlm_module

    monkeypatch.setattr(vlm_module, "vision_modules", lambda model: (None, None))
    with pytest.raises(RuntimeError, match=r"classifiers\[llava\]\.vision_dtype: .*no vision_tower"):
        vlm_module.VLMClassifier(_spec(tiny_llava).model_copy(update={"dtype": "float16", "vision_dtype": "float32"}),
                                 "cpu", label_space(DIGITS))


def test_pad_to_square_in_the_mean_colour_by_hand():
    """LLaVA's expand2square: a 4 x 2 image (width x height) goes on a 4 x 4 square of the mean
    colour at row (4 - 2) // 2 = 1; a 2 x 3 image at column (3 - 2) // 2 = 0, one column of fill on the right."""
    from pipeline.models.vlm import pad_to_square

    fill = (122, 116, 104)  # int(x * 255) of CLIP's mean 0.48145466, 0.4578275, 0.40821073
    wide = Image.fromarray(np.arange(4 * 2 * 3, dtype=np.uint8).reshape(2, 4, 3))
    out = np.asarray(pad_to_square(wide, fill))
    assert out.shape == (4, 4, 3)
    assert (out[0] == fill).all() and (out[3] == fill).all()
    assert (out[1:3] == np.asarray(wide)).all()
    tall = Image.fromarray(np.full((3, 2, 3), 7, dtype=np.uint8))
    out = np.asarray(pad_to_square(tall, fill))
    assert out.shape == (3, 3, 3) and (out[:, :2] == 7).all() and (out[:, 2] == fill).all()
    square = Image.new("RGB", (5, 5))
    assert pad_to_square(square, fill) is square


def test_padded_image_reaches_the_processor(tiny_llava):
    """image_aspect_ratio pad: the processor receives the square in the processor's mean colour
    (the tiny processor's mean is CLIP's: 122, 116, 104 after LLaVA's int(x * 255))."""
    from pipeline.models.vlm import VLMClassifier

    clf = VLMClassifier(_spec(tiny_llava).model_copy(update={"image_aspect_ratio": "pad"}), "cpu", label_space(DIGITS))
    assert clf.pad_fill == tuple(int(x * 255) for x in clf.processor.image_processor.image_mean) == (122, 116, 104)
    image = Image.fromarray(np.full((16, 32, 3), 200, dtype=np.uint8))  # 32 wide, 16 high
    [square] = clf.model_images([image])
    pixels = np.asarray(square)
    assert square.size == (32, 32)
    assert (pixels[:8] == (122, 116, 104)).all() and (pixels[8:24] == 200).all() and (pixels[24:] == (122, 116, 104)).all()
    plain = VLMClassifier(_spec(tiny_llava), "cpu", label_space(DIGITS))
    assert plain.pad_fill is None and plain.model_images([image])[0].size == (32, 16)
