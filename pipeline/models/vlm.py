"""Vision-language models as classifiers: ask each image a question, score the free-text answer.

:class:`VLMClassifier` (kind ``vlm``) loads any transformers image-text-to-text model
(``AutoModelForImageTextToText`` with its ``AutoProcessor`` and chat template: LLaVA,
LLaVA-NeXT, Qwen2-VL, ...) from ``model`` (a local directory or a hub id), in ``dtype``.
It runs in the classify stage's actor pool next to every other classifier, after the
classifier its protocol draws distractors from (:mod:`pipeline.models.vqa_protocols`).

Per image the protocol writes a question, wrapped per ``prompt_template``: ``model``, the
processor's chat template as one user turn of an image and the question's text; ``original``,
LLaVA's ``llava_v1`` conversation as ImageNet-D's ``eval_imagenet_d.py`` builds it
(:func:`llava_v1_prompt`: its system prompt, ``USER: <image>\n{question} ASSISTANT:``).
``vision_dtype`` keeps a LLaVA-style vision tower in its own dtype (LLaVA-1.5 as its builder loads
it: the CLIP tower in float32, the projector and language model in float16; the tower's features
are cast to the projector's dtype, as ``CLIPVisionTower.forward`` casts them to the images');
``image_aspect_ratio: pad`` pads each image to a square in the image processor's mean colour
before the processor's transform (LLaVA's ``process_images`` with ``image_aspect_ratio: pad``:
:func:`pad_to_square`).  The
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
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.config import ClassifierSpec, VLMSpec
from pipeline.labels import LabelSpace, label_space
from pipeline.models.classifier_kind import AskingClassifier, HubRef, is_hub_id
from pipeline.models.footprint import ModelSize
from pipeline.models.precision import ModelPrecision
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


def pad_to_square(image: Any, fill: tuple[int, ...]) -> Any:
    """``image`` centred on a square of its longer side filled with ``fill`` (LLaVA's ``expand2square``:
    the offset of the shorter side is ``(long - short) // 2``); a square image is returned as it is."""
    from PIL import Image

    width, height = image.size
    if width == height:
        return image
    side = max(width, height)
    square = Image.new(image.mode, (side, side), fill)
    square.paste(image, ((side - width) // 2, (side - height) // 2))
    return square


def mean_colour(processor: Any, where: str) -> tuple[int, ...]:
    """The image processor's mean as 0..255 values, truncated as LLaVA's ``process_images`` does
    (``tuple(int(x * 255) for x in image_processor.image_mean)``)."""
    mean = getattr(getattr(processor, "image_processor", None), "image_mean", None)
    if not mean:
        raise RuntimeError(f"{where}.image_aspect_ratio: 'pad' needs the processor's image_mean; this processor has none")
    return tuple(int(x * 255) for x in mean)


def vision_modules(model: torch.nn.Module) -> tuple[torch.nn.Module | None, torch.nn.Module | None]:
    """(vision tower, multimodal projector) of a LLaVA-style model (``vision_tower``,
    ``multi_modal_projector``, at any depth; the outermost of each), None where absent."""
    found: dict[str, torch.nn.Module] = {}
    for name, module in model.named_modules():
        leaf = name.rpartition(".")[2]
        if leaf in ("vision_tower", "multi_modal_projector") and leaf not in found:
            found[leaf] = module
    return found.get("vision_tower"), found.get("multi_modal_projector")


def keep_vision_dtype(model: torch.nn.Module, dtype: torch.dtype, where: str) -> None:
    """Run ``model``'s vision tower in ``dtype`` (its weights cast) and hand the projector its
    features in the projector's own dtype."""
    tower, projector = vision_modules(model)
    if tower is None or projector is None:
        raise RuntimeError(
            f"{where}.vision_dtype: the model {type(model).__name__} has no vision_tower and multi_modal_projector "
            "(a LLaVA-style model); leave vision_dtype unset"
        )
    tower.to(dtype)
    target = next(projector.parameters()).dtype

    def cast(_module: torch.nn.Module, args: tuple) -> tuple:
        return tuple(a.to(target) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)

    projector.register_forward_pre_hook(cast)


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


class VLMClassifier(AskingClassifier):
    """A classifier that asks: :meth:`answer`, no logits (see the module docstring).  It runs
    after the ranking classifiers, with their rankings."""

    Spec = VLMSpec

    def __init__(self, spec: ClassifierSpec, device: str, labels: LabelSpace | None = None) -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.spec = spec
        self.device = device
        self.labels = labels or label_space("imagenet")
        self.where = f"classifiers[{spec.name}]"
        self.protocol = build_protocol(dict(spec.protocol or {}))
        self.distractor_source = distractor_classifier(self.protocol.params)
        self.prompt_template = spec.prompt_template or "model"
        self.dtype = _DTYPES[spec.dtype or "float32"]  # the language model's (and the pixels', as LLaVA feeds them)
        vision_dtype = _DTYPES[spec.vision_dtype or spec.dtype or "float32"]
        try:
            self.processor = AutoProcessor.from_pretrained(spec.model)
            self.model = AutoModelForImageTextToText.from_pretrained(spec.model, dtype=self.dtype, **spec.model_kwargs)
        except Exception as err:
            raise RuntimeError(f"{self.where}: could not load the image-text-to-text model {spec.model!r}: {err}") from err
        if vision_dtype != self.dtype:
            keep_vision_dtype(self.model, vision_dtype, self.where)
        self.pad_fill = mean_colour(self.processor, self.where) if spec.image_aspect_ratio == "pad" else None
        self.model.to(device).eval()
        self.tokenizer = self.processor.tokenizer
        self.tokenizer.padding_side = "left"  # generation appends on the right
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.names = [self.labels.name(i) for i in range(len(self.labels))]
        self._out_to_label = list(range(len(self.labels)))

    @property
    def out_to_label(self) -> list[int]:
        return self._out_to_label

    def set_precision(self, precision: ModelPrecision) -> None:
        """A vlm runs in its own ``dtype`` / ``vision_dtype``, not the stage's precision."""

    @classmethod
    def hub_refs(cls, spec: ClassifierSpec) -> list[HubRef]:
        """The transformers repository its ``model`` names, unless that is a local folder."""
        return [HubRef("transformers", (spec.model,))] if not os.path.exists(spec.model) and is_hub_id(spec.model) else []

    @classmethod
    def flops_model(cls, spec: ClassifierSpec) -> None:
        """Unknown: a generation's FLOPs depend on its answer's length."""
        return None

    @classmethod
    def footprint(cls, spec: ClassifierSpec, images: int) -> ModelSize:
        """The model's size at ``images`` per batch (generated in chunks of at most
        :data:`GENERATE_CHUNK`): the model built on the meta device from its config (no weights
        read); weights at ``dtype``, the vision tower's at ``vision_dtype``; activations: the
        largest MLP's input and output over the prompt (prefill); the generation cache (keys
        and values of every layer for the prompt and ``max_new_tokens``), in ``dtype``."""
        from transformers import AutoConfig, AutoModelForImageTextToText

        config = AutoConfig.from_pretrained(spec.model)
        with torch.device("meta"):
            model = AutoModelForImageTextToText.from_config(config)
        params = sum(p.numel() for p in model.parameters())
        tower, _ = vision_modules(model)
        tower_params = sum(p.numel() for p in tower.parameters()) if tower is not None else 0
        lm_width = torch.tensor([], dtype=_DTYPES[spec.dtype or "float32"]).element_size()
        vision_width = torch.tensor([], dtype=_DTYPES[spec.vision_dtype or spec.dtype or "float32"]).element_size()
        text = getattr(config, "text_config", config)
        vision = getattr(config, "vision_config", None)
        heads = int(text.num_attention_heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        kv_dim = int(getattr(text, "num_key_value_heads", None) or heads) * head_dim
        image_tokens = (int(vision.image_size) // int(vision.patch_size)) ** 2 if vision is not None else 0
        prompt = image_tokens + PROMPT_TEXT_TOKENS
        batch = max(1, min(images, GENERATE_CHUNK))
        new_tokens = int(dict(spec.protocol or {}).get("max_new_tokens", 512))
        cache = int(text.num_hidden_layers) * 2 * batch * (prompt + new_tokens) * kv_dim * lm_width
        mlp = int(getattr(text, "intermediate_size", 4 * text.hidden_size))
        prefill = batch * prompt * (int(text.hidden_size) + mlp) * lm_width
        weights = (params - tower_params) * lm_width + tower_params * vision_width
        return ModelSize(params, prefill, cache, weight_bytes=weights)

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
                images=self.model_images(images[lo:hi]), text=list(prompts[lo:hi]), return_tensors="pt", padding=True,
            )
            batch = {k: v.to(self.device) for k, v in batch.items()}
            if "pixel_values" in batch and self.dtype != torch.float32:
                # The language model's dtype, as eval_imagenet_d.py hands LLaVA its image tensor
                # (a float32 tower casts it back up: the pixels keep float16's rounding).
                batch["pixel_values"] = batch["pixel_values"].to(self.dtype)
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

    def model_images(self, images: Sequence[Any]) -> list[Any]:
        """The images the processor receives: RGB, padded to a square with ``image_aspect_ratio: pad``."""
        rgb = [im.convert("RGB") for im in images]
        return rgb if self.pad_fill is None else [pad_to_square(im, self.pad_fill) for im in rgb]

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
