"""Vision-language models as classifiers: ask each image a question, score the free-text answer.

:class:`VLMClassifier` (kind ``vlm``) loads any transformers image-text-to-text model
(``AutoModelForImageTextToText`` with its ``AutoProcessor`` and chat template: LLaVA,
LLaVA-NeXT, Qwen2-VL, ...) from ``model`` (a local directory or a hub id), in ``dtype``.
It runs in the classify stage's actor pool next to every other classifier, after the
classifier its protocol draws distractors from (:mod:`pipeline.models.vqa_protocols`).

Per image the protocol writes a question, wrapped per ``prompt_template``: ``model``, the
processor's chat template as one user turn of an image and the question's text; ``original``,
LLaVA's ``llava_v1`` conversation as ImageNet-D's ``eval_imagenet_d.py`` builds it
(:func:`llava_v1_prompt`: its system prompt, ``USER: <image>\n{question} ASSISTANT:``).  The
batch is generated together (left padding) in chunks of :data:`GENERATE_CHUNK`.  Sampling
is per image: :class:`SeededSampling` draws each token from the distribution transformers
samples from (temperature, then top-k: :func:`sampling_probs`) with a generator seeded by
the sample id and the step, so an image's answer does not depend on the run, the batch it
falls in, or its neighbours (temperature 0: greedy).  The answer is scored by the
protocol; the classifier's prediction is the class the answer names (-1 when the answer is
excluded), ``p_true`` 1 / 0 (NaN when excluded).  An image the protocol cannot ask (no
released question under ``distractors: questions``) is not generated for: it is excluded
as ``UNASKED`` with a null answer, and the rest of the batch goes on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.config import ClassifierSpec
from pipeline.labels import LabelSpace, label_space
from pipeline.models.vqa_protocols import (
    UNASKED,
    Question,
    Scored,
    build_protocol,
    distractor_classifier,
    sample_seed,
)

GENERATE_CHUNK = 32  # images per generate() call
# LLaVA's conv_llava_v1 (llava/conversation.py), the conversation eval_imagenet_d.py picks for
# "llava-v1.5-*" checkpoints: system prompt, roles, separators sep " " and sep2 "</s>".
LLAVA_V1_SYSTEM = (
    "A chat between a curious human and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the human's questions."
)
LLAVA_V1_ROLES = ("USER", "ASSISTANT")
LLAVA_V1_SEP = " "
IMAGE_TOKEN = "<image>"  # llava.constants.DEFAULT_IMAGE_TOKEN
# Text tokens of a prompt beside the image's, for the generation cache of the memory projection:
# the llava_v1 wrapper and the two-choice question are about 75 LLaMA tokens.
PROMPT_TEXT_TOKENS = 128
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_STEP_PRIME = 1_000_003


def llava_v1_prompt(question: str, image_token: str = IMAGE_TOKEN) -> str:
    """The prompt of ``eval_imagenet_d.py``: ``conv_llava_v1`` with one user turn
    ``DEFAULT_IMAGE_TOKEN + '\\n' + question`` and an empty assistant turn, as ``get_prompt``
    (separator style TWO) writes it: ``system + " " + "USER: " + turn + " " + "ASSISTANT:"``."""
    user, assistant = LLAVA_V1_ROLES
    return f"{LLAVA_V1_SYSTEM}{LLAVA_V1_SEP}{user}: {image_token}\n{question}{LLAVA_V1_SEP}{assistant}:"


def sampling_probs(scores: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """The next-token distribution transformers samples from with ``do_sample=True``: the scores
    divided by the temperature, all but the ``top_k`` highest (ties kept) removed (0: none), softmax."""
    logits = scores.float() / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.softmax(logits, dim=-1)


class SeededSampling:
    """A logits processor that samples each row's next token with that row's own generator.

    It returns scores that are -inf except at the drawn token, so ``generate`` run greedy
    (``do_sample=False``) emits exactly the draws.  Row ``i`` at step ``t`` uses the seed
    ``seeds[i] + t * 1_000_003``: independent of the batch, reproducible across runs.
    Draws follow :func:`sampling_probs` (temperature, then top-k, as transformers' warpers).
    """

    def __init__(self, seeds: Sequence[int], temperature: float, prompt_len: int, top_k: int = 0) -> None:
        self.seeds = [int(s) for s in seeds]
        self.temperature = float(temperature)
        self.prompt_len = prompt_len
        self.top_k = int(top_k)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.prompt_len
        logits = scores.float().cpu()
        if self.temperature <= 0:
            picks = logits.argmax(dim=-1)
        else:
            probs = sampling_probs(logits, self.temperature, self.top_k)
            picks = torch.empty(len(self.seeds), dtype=torch.long)
            for i, seed in enumerate(self.seeds):
                g = torch.Generator().manual_seed((seed + step * _STEP_PRIME) % (2**63))
                picks[i] = torch.multinomial(probs[i], 1, generator=g)[0]
        out = torch.full_like(scores, float("-inf"))
        out[torch.arange(len(picks)), picks.to(scores.device)] = 0.0
        return out


@dataclass
class VLMOutputs:
    """Per image: the classifier-shaped prediction, the answer text and its verdict."""

    top1: list[int]
    top5: list[list[int]]
    p_true: list[float]
    answers: list[str | None]  # None: not asked (UNASKED)
    scored: list[Scored]

    @property
    def excluded(self) -> list[bool]:
        return [s.excluded for s in self.scored]


def released_question(params: str | None) -> dict[str, Any] | None:
    """The release's question stored in an image's ``params`` (``{"question": {...}}``), if any."""
    if not params:
        return None
    return json.loads(params).get("question")


class VLMClassifier:
    """``answer(...)`` instead of ``predict``: see the module docstring."""

    asks = True  # the classify stage runs it after the classifiers, with their rankings

    def __init__(self, spec: ClassifierSpec, device: str, labels: LabelSpace | None = None) -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.spec = spec
        self.device = device
        self.labels = labels or label_space("imagenet")
        self.where = f"classifiers[{spec.name}]"
        self.protocol = build_protocol(dict(spec.protocol or {}))
        self.distractor_source = distractor_classifier(self.protocol.params)
        self.prompt_template = spec.prompt_template or "model"
        dtype = _DTYPES[spec.dtype or "float32"]
        try:
            self.processor = AutoProcessor.from_pretrained(spec.model)
            self.model = AutoModelForImageTextToText.from_pretrained(spec.model, dtype=dtype, **spec.model_kwargs)
        except Exception as err:
            raise RuntimeError(f"{self.where}: could not load the image-text-to-text model {spec.model!r}: {err}") from err
        self.model.to(device).eval()
        self.tokenizer = self.processor.tokenizer
        self.tokenizer.padding_side = "left"  # generation appends on the right
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.names = [self.labels.name(i) for i in range(len(self.labels))]
        self.out_to_label = list(range(len(self.labels)))

    @property
    def name(self) -> str:
        return self.spec.name

    @staticmethod
    def footprint(spec: ClassifierSpec, images: int) -> tuple[int, int, int]:
        """(parameters, activation bytes, cache bytes) for :mod:`pipeline.perf.memory`, at ``images``
        per batch (generated in chunks of at most :data:`GENERATE_CHUNK`): the model built on the
        meta device from its config (no weights read); activations: the largest MLP's input and
        output over the prompt (prefill); the generation cache (keys and values of every layer for
        the prompt and ``max_new_tokens``), in the weights' dtype.  Bytes per value follow
        ``spec.dtype``; the weights' bytes are counted by the caller from the parameters."""
        from transformers import AutoConfig, AutoModelForImageTextToText

        config = AutoConfig.from_pretrained(spec.model)
        with torch.device("meta"):
            model = AutoModelForImageTextToText.from_config(config)
        params = sum(p.numel() for p in model.parameters())
        text = getattr(config, "text_config", config)
        vision = getattr(config, "vision_config", None)
        heads = int(text.num_attention_heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        kv_dim = int(getattr(text, "num_key_value_heads", None) or heads) * head_dim
        image_tokens = (int(vision.image_size) // int(vision.patch_size)) ** 2 if vision is not None else 0
        prompt = image_tokens + PROMPT_TEXT_TOKENS
        batch = max(1, min(images, GENERATE_CHUNK))
        width = torch.tensor([], dtype=_DTYPES[spec.dtype or "float32"]).element_size()
        new_tokens = int(dict(spec.protocol or {}).get("max_new_tokens", 512))
        cache = int(text.num_hidden_layers) * 2 * batch * (prompt + new_tokens) * kv_dim * width
        mlp = int(getattr(text, "intermediate_size", 4 * text.hidden_size))
        prefill = batch * prompt * (int(text.hidden_size) + mlp) * width
        return params, prefill, cache

    def chat_prompt(self, question: Question) -> str:
        """The text the processor receives for one image: the question wrapped per ``prompt_template``
        (``original``: :func:`llava_v1_prompt` with the processor's image token; ``model``: the
        checkpoint's chat template, one user turn of the image, then the question's text)."""
        if self.prompt_template == "original":
            return llava_v1_prompt(question.prompt, getattr(self.processor, "image_token", None) or IMAGE_TOKEN)
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question.prompt}]}]
        return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    @torch.inference_mode()
    def generate(self, images: Sequence[Any], prompts: Sequence[str], seeds: Sequence[int]) -> list[str]:
        """Answer texts, one per (image, chat prompt), generated in batches with per-image seeds."""
        answers: list[str] = []
        for lo in range(0, len(images), GENERATE_CHUNK):
            hi = lo + GENERATE_CHUNK
            batch = self.processor(
                images=[im.convert("RGB") for im in images[lo:hi]], text=list(prompts[lo:hi]),
                return_tensors="pt", padding=True,
            )
            batch = {k: v.to(self.device) for k, v in batch.items()}
            if "pixel_values" in batch and self.model.dtype != torch.float32:
                batch["pixel_values"] = batch["pixel_values"].to(self.model.dtype)
            n_prompt = batch["input_ids"].shape[1]
            out = self.model.generate(
                **batch,
                do_sample=False,
                max_new_tokens=self.protocol.max_new_tokens,
                logits_processor=[
                    SeededSampling(seeds[lo:hi], self.protocol.temperature, n_prompt, self.protocol.top_k)
                ],
                pad_token_id=self.tokenizer.pad_token_id,
            )
            answers.extend(self.tokenizer.batch_decode(out[:, n_prompt:], skip_special_tokens=True))
        return [a.strip() for a in answers]

    def answer(
        self,
        images: Sequence[Any],
        truth: Sequence[int],
        sample_ids: Sequence[str],
        params: Sequence[str | None],
        rankings: dict[str, list[list[int]]],
    ) -> VLMOutputs:
        """Ask, generate and score every image.  ``rankings``: top-5 class ids per image of
        the classifiers already run (the distractor source among them); ``params``: each
        image's family parameters, where a released question is kept."""
        released = [released_question(p) for p in params]  # a release's question wins over a ranking
        ranked = rankings.get(self.distractor_source) if self.distractor_source else None
        if self.distractor_source and ranked is None and any(r is None for r in released):
            raise RuntimeError(
                f"{self.where}: the distractor classifier {self.distractor_source!r} did not run before this one"
            )
        questions = [
            self.protocol.ask(t, self.names, sid, ranked=ranked[i] if ranked else None, released=released[i])
            for i, (t, sid) in enumerate(zip(truth, sample_ids))
        ]
        asked = [i for i, q in enumerate(questions) if q is not None]  # the others: UNASKED, not generated
        seeds = [sample_seed(sample_ids[i], f"{self.name}/") for i in asked]
        texts = self.generate([images[i] for i in asked], [self.chat_prompt(questions[i]) for i in asked],
                              seeds) if asked else []
        answers: list[str | None] = [None] * len(questions)
        for i, text in zip(asked, texts):
            answers[i] = text
        scored = [Scored(UNASKED, -1) if q is None else self.protocol.score(q, a) for q, a in zip(questions, answers)]
        top1 = [s.chosen for s in scored]
        p_true = [float("nan") if s.excluded else float(s.verdict == "TRUE") for s in scored]
        return VLMOutputs(top1, [[c] for c in top1], p_true, answers, scored)


def classify_all(
    classifiers: Sequence[Any],
    images: Sequence[Any],
    truth: Sequence[int],
    sample_ids: Sequence[str],
    params: Sequence[str | None],
    earlier: dict[str, list[list[int]]] | None = None,
    shifted: Sequence[bool] | None = None,
) -> list[tuple[list, list, list, list, list]]:
    """Every classifier over ``images``: per classifier (in the given order) the per-image
    top-1, top-5, p(true), answer text and exclusion (the last two None but for vlms).

    Ranking classifiers run first, vlms after them with their top-5 rankings (and those of
    ``earlier``: classifiers of an earlier group, already run) to draw distractors from.
    ``shifted`` (per image: scale > 0) goes to the ranking classifiers' ``predict``.
    """
    from pipeline.models.classifiers import topk_predictions

    n = len(images)
    rankings = dict(earlier or {})
    results: dict[str, tuple[list, list, list, list, list]] = {}
    for clf in sorted(classifiers, key=lambda c: bool(getattr(c, "asks", False))):  # stable: config order kept
        if getattr(clf, "asks", False):
            out = clf.answer(images, truth, sample_ids, params, rankings)
            results[clf.name] = (out.top1, out.top5, out.p_true, out.answers, out.excluded)
        else:
            logits = clf.predict(images) if shifted is None else clf.predict(images, shifted)
            top1, top5, p_true = topk_predictions(logits, clf.out_to_label, truth)
            rankings[clf.name] = top5
            results[clf.name] = (top1, top5, p_true, [None] * n, [None] * n)
    return [results[c.name] for c in classifiers]
