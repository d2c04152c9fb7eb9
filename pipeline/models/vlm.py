"""Vision-language models as classifiers: ask each image a question, score the free-text answer.

:class:`VLMClassifier` (kind ``vlm``) loads any transformers image-text-to-text model
(``AutoModelForImageTextToText`` with its ``AutoProcessor`` and chat template: LLaVA,
LLaVA-NeXT, Qwen2-VL, ...) from ``model`` (a local directory or a hub id), in ``dtype``.
It runs in the classify stage's actor pool next to every other classifier, after the
classifier its protocol draws distractors from (:mod:`pipeline.models.vqa_protocols`).

Per image the protocol writes a question; the prompt goes through the processor's chat
template as one user turn of an image and the question's text; the batch is generated
together (left padding) in chunks of :data:`GENERATE_CHUNK`.  Sampling is per image:
:class:`SeededSampling` draws each token from the tempered distribution with a generator
seeded by the sample id and the step, so an image's answer does not depend on the run,
the batch it falls in, or its neighbours (temperature 0: greedy).  The answer is scored
by the protocol; the classifier's prediction is the class the answer names (-1 when the
answer is excluded), ``p_true`` 1 / 0 (NaN when excluded).
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
    Question,
    Scored,
    build_protocol,
    distractor_classifier,
    sample_seed,
)

GENERATE_CHUNK = 32  # images per generate() call
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_STEP_PRIME = 1_000_003


class SeededSampling:
    """A logits processor that samples each row's next token with that row's own generator.

    It returns scores that are -inf except at the drawn token, so ``generate`` run greedy
    (``do_sample=False``) emits exactly the draws.  Row ``i`` at step ``t`` uses the seed
    ``seeds[i] + t * 1_000_003``: independent of the batch, reproducible across runs.
    """

    def __init__(self, seeds: Sequence[int], temperature: float, prompt_len: int) -> None:
        self.seeds = [int(s) for s in seeds]
        self.temperature = float(temperature)
        self.prompt_len = prompt_len

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.prompt_len
        logits = scores.float().cpu()
        if self.temperature <= 0:
            picks = logits.argmax(dim=-1)
        else:
            probs = torch.softmax(logits / self.temperature, dim=-1)
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
    answers: list[str]
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
    def footprint(spec: ClassifierSpec, images: int) -> tuple[int, int]:
        """(parameters, activation bytes) for :mod:`pipeline.perf.memory`: the model built on the meta
        device from its config (no weights read); activations not estimated (0)."""
        from transformers import AutoConfig, AutoModelForImageTextToText

        with torch.device("meta"):
            model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(spec.model))
        return sum(p.numel() for p in model.parameters()), 0

    def chat_prompt(self, question: Question) -> str:
        """The question as the model's chat template writes one user turn (image, then text)."""
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
                logits_processor=[SeededSampling(seeds[lo:hi], self.protocol.temperature, n_prompt)],
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
        seeds = [sample_seed(sid, f"{self.name}/") for sid in sample_ids]
        answers = self.generate(images, [self.chat_prompt(q) for q in questions], seeds)
        scored = [self.protocol.score(q, a) for q, a in zip(questions, answers)]
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
