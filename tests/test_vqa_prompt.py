"""ImageNet-D's VQA as the original runs it (issue 43, item 8), on a tiny random LLaVA built here.

``LLaVA/llava/serve/eval_imagenet_d.py`` of chenshuang-zhang/imagenet_d wraps the question in
LLaVA's ``llava_v1`` conversation (``conv_llava_v1``: the system prompt, roles USER /
ASSISTANT, separators " " and "</s>"; ``DEFAULT_IMAGE_TOKEN + '\\n' + question`` as the user
turn), loads the weights in float16 and samples with temperature 0.2, transformers'
default top-k 50 and at most 512 new tokens.  Also here: explicit distractor sources, an
image without a question excluded alone, whole-word matching of the ``open`` protocol and
the memory projection of a vlm.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from pipeline.config import ClassifierSpec, VLMSpec
from pipeline.labels import label_space
from pipeline.models.vqa_protocols import (
    IMAGENET_D_PROMPT,
    NEITHER,
    TRUE,
    UNASKED,
    ProtocolError,
    build_protocol,
    resolve_protocol,
)

NAMES = ["banana", "lemon", "pen", "laptop (open)", "chair", "bench"]
# The prompt eval_imagenet_d.py builds for a banana whose distractor is "lemon", byte for byte:
# conv_llava_v1.system + sep " " + "USER" + ": " + "<image>\n" + question + sep " " + "ASSISTANT" + ":".
ORIGINAL = (
    "A chat between a curious human and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the human's questions. "
    "USER: <image>\nWhat is the main object in this image? Choose from the following list: banana, lemon. "
    "ASSISTANT:"
)
QUESTION = {"file": "background", "gt_category": "banana", "top1_pred_cate": "lemon", "top2_pred_cate": "banana"}


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory):
    from pipeline.demo.tiny_vlm import build_tiny_llava

    return str(build_tiny_llava(tmp_path_factory.mktemp("llava") / "m", [ORIGINAL, *NAMES], seed=5))


def _spec(path: str, protocol: dict | None = None, **entry) -> VLMSpec:
    return VLMSpec(name="llava", kind="vlm", model=path,
                          protocol={"kind": "two_choice", "distractors": "questions", **(protocol or {})}, **entry)


def _images(n: int) -> list[Image.Image]:
    rng = np.random.default_rng(1)
    return [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(n)]


class _Spy:
    """Wraps the processor: records the text each call receives."""

    def __init__(self, processor) -> None:
        self.processor, self.texts = processor, []

    def __call__(self, *args, **kwargs):
        self.texts += list(kwargs["text"])
        return self.processor(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.processor, name)


def _released(q: dict = QUESTION) -> str:
    return json.dumps({"question": q})


# --------------------------------------------------------------------------- the prompt
def test_the_original_prompt_reaches_the_model_byte_for_byte(tiny_llava, monkeypatch):
    from pipeline.models.vlm import VLMClassifier

    clf = VLMClassifier(_spec(tiny_llava, {"max_new_tokens": 2}, prompt_template="original"), "cpu",
                        label_space(NAMES))
    spy = _Spy(clf.processor)
    monkeypatch.setattr(clf, "processor", spy)
    seen = []
    real = clf.model.generate
    monkeypatch.setattr(clf.model, "generate", lambda **kw: seen.append(kw) or real(**kw))
    clf.answer(_images(1), [0], ["background/002/seed_0000_scale_0000"], [_released()], {})
    assert spy.texts == [ORIGINAL]
    # The processor puts the image's tokens where "<image>" is: after "user :", before the question.
    ids = seen[0]["input_ids"][0].tolist()
    tok = clf.tokenizer
    image_id = tok.convert_tokens_to_ids("<image>")
    first = ids.index(image_id)
    n_image = sum(i == image_id for i in ids)
    assert n_image == (32 // 4) ** 2  # one token per patch of the tiny CLIP tower
    assert tok.convert_ids_to_tokens(ids[first - 2:first]) == ["user", ":"]
    assert tok.convert_ids_to_tokens(ids[first + n_image:first + n_image + 3]) == ["what", "is", "the"]
    assert ids[-2:] == tok.convert_tokens_to_ids(["assistant", ":"])


def test_the_checkpoint_template_when_asked(tiny_llava):
    from pipeline.models.vlm import VLMClassifier

    clf = VLMClassifier(_spec(tiny_llava, prompt_template="model"), "cpu", label_space(NAMES))
    q = clf.protocol.ask(0, NAMES, "s", released=QUESTION)
    assert clf.chat_prompt(q) == ORIGINAL[ORIGINAL.index("USER: "):]  # the tiny LLaVA's own template: no system prompt


def test_prompt_template_defaults_and_checks():
    plain = VLMSpec(name="v", kind="vlm", model="x", protocol={"kind": "open"})
    assert (plain.prompt_template, plain.dtype) == ("model", "float32")  # outside ImageNet-D's protocol
    with pytest.raises(ValueError, match="prompt_template"):
        VLMSpec(name="v", kind="vlm", model="x", protocol={"kind": "open"}, prompt_template="llava")
    with pytest.raises(ValueError, match="prompt_template"):
        ClassifierSpec(name="v", kind="timm", model="x", prompt_template="original")


def _apply(entry: dict, given: set[str]):
    from pipeline.sources.imagenet_d import PROTOCOL
    from pipeline.sources.release_protocol import apply

    spec = ClassifierSpec.model_validate(entry)
    return apply(PROTOCOL, [spec.model_dump(mode="json")], {spec.name: given}, own=lambda e: None)


def test_imagenet_d_protocol_gives_a_vlm_the_originals_wrapper_precision_and_sampling():
    entry = {"name": "llava", "kind": "vlm", "model": "x", "protocol": {"kind": "two_choice", "distractors": "questions"}}
    (out,), analysis, warnings = _apply(entry, {"name", "kind", "model", "protocol"})
    assert out["prompt_template"] == "original" and out["dtype"] == "float16"
    p = out["protocol"]
    assert (p["temperature"], p["top_k"], p["max_new_tokens"], p["prompt"]) == (0.2, 50, 512, IMAGENET_D_PROMPT)
    assert not warnings and analysis["classifiers"]["llava"]["dtype"] == "float16"

    # Set otherwise by the entry: kept, and flagged as not comparable with the published numbers.
    entry = {**entry, "dtype": "bfloat16", "prompt_template": "model",
             "protocol": {"kind": "two_choice", "distractors": "questions", "temperature": 0.0}}
    (out,), analysis, warnings = _apply(entry, {"name", "kind", "model", "protocol", "dtype", "prompt_template"})
    assert out["dtype"] == "bfloat16" and out["prompt_template"] == "model"
    said = " ".join(warnings)
    assert "dtype 'bfloat16' instead of 'float16'" in said and "prompt_template 'model'" in said
    assert "protocol.temperature 0.0 instead of 0.2" in said and "not comparable" in said
    assert set(analysis["overridden"]) == {"llava"}


# --------------------------------------------------------------------------- sampling
def test_sampling_is_temperature_then_top_k_as_transformers():
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

    from pipeline.models.vlm import sampling_probs

    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 300, generator=g) * 3
    ids = torch.zeros(3, 4, dtype=torch.long)
    warped = TopKLogitsWarper(50)(ids, TemperatureLogitsWarper(0.2)(ids, scores.clone()))
    assert torch.allclose(sampling_probs(scores, 0.2, 50), torch.softmax(warped, dim=-1), atol=1e-6)
    assert torch.allclose(sampling_probs(scores, 1.0, 0), torch.softmax(scores, dim=-1), atol=1e-6)  # 0: no top-k


def test_draws_stay_within_the_top_k():
    from pipeline.models.vlm import SeededSampling

    scores = -torch.arange(1000, dtype=torch.float32).repeat(1, 1) * 1e-3  # nearly flat: most mass beyond 50
    seen = set()
    for seed in range(200):
        out = SeededSampling([seed], temperature=1.0, prompt_len=0, top_k=50)(torch.zeros(1, 0, dtype=torch.long), scores)
        seen.add(int(out.argmax()))
    assert max(seen) < 50 and len(seen) > 20
    wide = {int(SeededSampling([s], 1.0, 0, top_k=0)(torch.zeros(1, 0, dtype=torch.long), scores).argmax())
            for s in range(200)}
    assert max(wide) >= 50


def test_generate_gets_the_originals_sampling_and_float16_weights(tiny_llava, monkeypatch):
    from pipeline.models.vlm import SeededSampling, VLMClassifier

    clf = VLMClassifier(_spec(tiny_llava, prompt_template="original", dtype="float16"), "cpu", label_space(NAMES))
    assert clf.model.dtype == torch.float16
    seen = []
    monkeypatch.setattr(clf.model, "generate", lambda **kw: seen.append(kw) or torch.cat(
        [kw["input_ids"], torch.full((1, 1), clf.tokenizer.eos_token_id)], dim=1))
    clf.answer(_images(1), [0], ["s"], [_released()], {})
    kw = seen[0]
    assert kw["max_new_tokens"] == 512 and kw["pixel_values"].dtype == torch.float16
    (sampler,) = [p for p in kw["logits_processor"] if isinstance(p, SeededSampling)]
    assert (sampler.temperature, sampler.top_k) == (0.2, 50)


def test_float16_generation_runs_and_is_reproducible(tiny_llava):
    from pipeline.models.vlm import VLMClassifier

    clf = VLMClassifier(_spec(tiny_llava, {"max_new_tokens": 3, "temperature": 1.0}, prompt_template="original",
                              dtype="float16"), "cpu", label_space(NAMES))
    a = clf.answer(_images(2), [0, 0], ["s1", "s2"], [_released()] * 2, {})
    b = clf.answer(_images(2), [0, 0], ["s1", "s2"], [_released()] * 2, {})
    assert a.answers == b.answers and all(isinstance(x, str) for x in a.answers)


# --------------------------------------------------------------------------- distractors
@pytest.mark.parametrize(
    "given, resolved",
    [("questions", "questions"), ("classifier:clip", "classifier:clip"), ("random", "random"),
     ("clip", "classifier:clip"), ("labels", "random")],
)
def test_distractor_source_is_explicit(given, resolved):
    assert resolve_protocol({"kind": "two_choice", "distractors": given})["distractors"] == resolved


@pytest.mark.parametrize(
    "raw", [{"kind": "two_choice", "distractors": "classifier:"}, {"kind": "two_choice", "distractors": "classifier:a b"},
            {"kind": "multiple_choice", "distractors": "questions"}, {"kind": "two_choice", "distractors": 3}],
)
def test_bad_distractor_sources_name_the_key(raw):
    with pytest.raises(ProtocolError, match=r"protocol\.distractors"):
        resolve_protocol(raw)


def test_random_distractor_is_seeded_and_never_the_truth():
    p = build_protocol(resolve_protocol({"kind": "two_choice", "distractors": "random"}))
    qs = [p.ask(2, NAMES, f"s{i}") for i in range(30)]
    assert all(q.options[0] == 2 and q.options[1] != 2 for q in qs)
    assert len({q.options[1] for q in qs}) > 1 and qs[0] == p.ask(2, NAMES, "s0")


def test_a_named_classifier_ignores_a_released_question():
    p = build_protocol(resolve_protocol({"kind": "two_choice", "distractors": "classifier:clip"}))
    q = p.ask(0, NAMES, "s", ranked=[0, 4], released=QUESTION)
    assert q.option_names == ("banana", "chair")  # the ranking, not the file's "lemon"


def test_an_image_without_a_question_is_excluded_and_the_batch_goes_on(tiny_llava, monkeypatch):
    from pipeline.models.vlm import VLMClassifier

    clf = VLMClassifier(_spec(tiny_llava, {"max_new_tokens": 2}), "cpu", label_space(NAMES))
    asked = []
    monkeypatch.setattr(VLMClassifier, "generate", lambda self, images, prompts, seeds: asked.extend(prompts) or
                        ["a banana" for _ in prompts])
    out = clf.answer(_images(3), [0, 0, 0], ["a", "b", "c"], [_released(), None, _released()], {})
    assert len(asked) == 2  # the image without a question is not asked
    assert [s.verdict for s in out.scored] == [TRUE, UNASKED, TRUE]
    assert out.excluded == [False, True, False] and out.answers == ["a banana", None, "a banana"]
    assert out.top1 == [0, -1, 0] and math.isnan(out.p_true[1])


def test_no_question_at_all_runs_nothing(tiny_llava, monkeypatch):
    from pipeline.models.vlm import VLMClassifier

    clf = VLMClassifier(_spec(tiny_llava), "cpu", label_space(NAMES))
    monkeypatch.setattr(VLMClassifier, "generate", lambda *a: pytest.fail("nothing to ask"))
    out = clf.answer(_images(2), [0, 1], ["a", "b"], [None, None], {})
    assert out.excluded == [True, True]


def _release_tree(root):
    from test_imagenet_d_questions import make_tree

    return make_tree(root)


@pytest.mark.parametrize(
    "distractors, questions, message",
    [("classifier:tiny-resnet", True, "the release's questions"), ("questions", False, "no questions")],
)
def test_distractors_must_fit_the_source(tmp_path, capsys, tiny_llava, distractors, questions, message):
    """A classifier named while the release's questions are present is refused, and so is
    ``questions`` on a source without any: exit 2 before anything runs."""
    import shutil

    import yaml

    from pipeline import cli
    from test_imagenet_d_questions import tiny_config

    root = _release_tree(tmp_path / "r")
    if not questions:
        shutil.rmtree(root / "questions")
    cfg = tiny_config(tmp_path)
    raw = yaml.safe_load(cfg.read_text())
    raw["classifiers"].append({"name": "llava", "kind": "vlm", "model": tiny_llava,
                               "protocol": {"kind": "two_choice", "distractors": distractors}})
    cfg.write_text(yaml.safe_dump(raw))
    rc = cli.main(["evaluate", str(root), "--config", str(cfg), "--output", str(tmp_path / "o"), "--runner", "local"])
    err = capsys.readouterr().err
    assert rc == 2 and "classifiers[llava].protocol.distractors" in err and message in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- open: whole words
@pytest.mark.parametrize(
    "answer, chosen",
    [("An open laptop.", 3), ("A pen.", 2), ("Two pens on a desk.", 2), ("penguin", -1), ("It is a Banana!", 0),
     ("bananas", 0), ("an opener", -1)],
)
def test_open_matches_whole_words(answer, chosen):
    p = build_protocol(resolve_protocol({"kind": "open"}))
    q = p.ask(3, NAMES, "s")
    s = p.score(q, answer)
    assert s.chosen == chosen and (s.verdict == NEITHER) == (chosen == -1)


# --------------------------------------------------------------------------- memory
def test_memory_projection_counts_dtype_and_the_generation_cache(tiny_llava, tmp_path, monkeypatch):
    from transformers import AutoConfig

    from pipeline.models.vlm import GENERATE_CHUNK, PROMPT_TEXT_TOKENS
    from pipeline.perf import memory

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # measured, not read from a cache
    memory._classifier_footprint.cache_clear()
    cfg = AutoConfig.from_pretrained(tiny_llava)
    t, v = cfg.text_config, cfg.vision_config
    kv_dim = t.num_key_value_heads * (t.hidden_size // t.num_attention_heads)
    prompt = (v.image_size // v.patch_size) ** 2 + PROMPT_TEXT_TOKENS
    images = 40
    batch = min(images, GENERATE_CHUNK)
    f32 = memory.classifier_footprint(_spec(tiny_llava, {"max_new_tokens": 512}, dtype="float32"), images)
    f16 = memory.classifier_footprint(_spec(tiny_llava, {"max_new_tokens": 512}, dtype="float16"), images)
    assert f32.params == f16.params > 0 and not f16.note
    assert f16.weight_bytes == 2 * f16.params and f32.weight_bytes == 4 * f32.params
    kv16 = t.num_hidden_layers * 2 * batch * (prompt + 512) * kv_dim * 2
    assert f16.activation_bytes >= kv16 and f32.activation_bytes >= 2 * kv16
    short = memory.classifier_footprint(_spec(tiny_llava, {"max_new_tokens": 8}, dtype="float16"), images)
    grow = f16.activation_bytes - short.activation_bytes
    assert grow == t.num_hidden_layers * 2 * batch * (512 - 8) * kv_dim * 2  # the cache grows with the token limit


def test_memory_projection_counts_the_vision_tower_in_its_own_dtype(tiny_llava, tmp_path, monkeypatch):
    """ImageNet-D's protocol: the CLIP tower's weights at 4 bytes, the rest at 2; the stage's precision changes neither."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from pipeline.models.vlm import vision_modules
    from pipeline.perf import memory

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    memory._classifier_footprint.cache_clear()
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(tiny_llava))
    tower = sum(p.numel() for p in vision_modules(model)[0].parameters())
    total = sum(p.numel() for p in model.parameters())
    assert 0 < tower < total
    mixed = memory.classifier_footprint(_spec(tiny_llava, dtype="float16", vision_dtype="float32"), 4)
    f16 = memory.classifier_footprint(_spec(tiny_llava, dtype="float16"), 4)
    assert mixed.weight_bytes == 2 * (total - tower) + 4 * tower and f16.weight_bytes == 2 * total
    assert mixed.activation_bytes == f16.activation_bytes  # the prefill and the cache are the language model's
    assert memory.in_precision(mixed, "bfloat16") == mixed
