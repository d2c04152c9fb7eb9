"""Out-of-class (OOC) filter: CLIP and DINOv2 detectors and the keep rule.

CNS-Bench removes generated images that no longer show their class.  Four detectors
score every image of a trajectory (shift, class, seed across all scales):

1. ``clip_text``       CLIPScore (100 * max(cos, 0)) to ``"a photo of a {class}"``
2. ``clip_shift_text`` CLIPScore to ``"a photo of a {class} in {shift words}"``
3. ``clip_image``      cosine of CLIP image embeddings to the trajectory's scale-0 image
4. ``dino_image``      cosine of DINOv2 class tokens to the scale-0 image

A detector passes when its score is strictly above its threshold; an image is kept
when at least ``min_pass`` detectors pass (:func:`keep_decision`).

:meth:`OOCFilter.evaluate` also returns ``clip_shift_alignment``, the CLIPScore of each
image to ``"a picture in {shift words}"`` (:data:`SHIFT_ALIGNMENT_PROMPT`).  It is not a
detector and never enters the keep rule: it measures how strongly the shift is realised
(CNS-Bench Fig. 3), computed here because the CLIP image embeddings already exist.

This module also holds the two model loaders shared with
:mod:`pipeline.models.classifiers`: :func:`load_open_clip` and :func:`load_timm`.  Both
accept either a hub tag (real clusters) or a local weights file (offline demo, tests),
and both fail with a message naming the missing path and the config key it came from.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from pipeline.config import ClipModelSpec, DinoModelSpec, FilterSpec, Thresholds
from pipeline.errors import CnsbenchError
from pipeline.plan.schema import REALISATION_COLUMNS, SCORE_COLUMNS
from pipeline.models.filter_base import Filter
from pipeline.models.precision import FLOAT32, ModelPrecision

log = logging.getLogger(__name__)

# Images per encoder forward.  A filter batch (a few trajectories x ~6 scales) fits in
# one forward; the cap only bounds memory when a stage is configured with huge batches.
MAX_FORWARD = 256
_WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt", ".npz")

# Prompt of the shift-realisation measure (the paper's "A picture in snow").  A module
# constant rather than a config key: it does not change any build output but this column,
# and a config key would make every existing output's config differ.
SHIFT_ALIGNMENT_PROMPT = "a picture in {shift_words}"

# (images, scales, class_name, shift) of one trajectory.
Trajectory = tuple[Sequence[Any], Sequence[float], str, str]


# --------------------------------------------------------------------------- loaders
def _looks_like_path(value: str) -> bool:
    return "/" in value or os.sep in value or value.lower().endswith(_WEIGHT_SUFFIXES)


def register_open_clip_config(path: str, model: str, key: str) -> None:
    """Register a JSON open_clip architecture once per process.

    open_clip names a registered config after the file's stem, so ``model`` must equal
    it; ``key`` is the config key the path came from (used in error messages).
    """
    import open_clip

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{key}: open_clip model config file not found: {p}")
    if p.stem != model:
        raise CnsbenchError(
            f"{key}: open_clip registers {p} under the name {p.stem!r}, but the model is {model!r}; "
            f"set the model name to {p.stem!r} or rename the file"
        )
    try:
        wanted = json.loads(p.read_text())
    except json.JSONDecodeError as err:
        raise CnsbenchError(f"{key}: {p} is not valid JSON: {err}") from None
    # add_model_config appends to a process-global path list and rescans all of it, the
    # last file with a given stem winning.  Re-add only when the registered architecture
    # differs from this file, so repeated setups stay cheap and a same-named config from
    # another directory cannot shadow this one.
    if open_clip.get_model_config(model) != wanted:
        open_clip.add_model_config(str(p.resolve()))
    if open_clip.get_model_config(model) is None:
        raise CnsbenchError(f"{key}: {p} is not an open_clip model config (needs embed_dim, vision_cfg, text_cfg)")


def resolve_open_clip_weights(model: str, pretrained: str | None, key: str) -> str | None:
    """Check ``pretrained`` is an open_clip tag for ``model`` or an existing file; return it.

    Raises FileNotFoundError (naming the path and ``key``) for a path that does not exist,
    ValueError for a string that is neither a known tag nor a path.
    """
    from open_clip.pretrained import get_pretrained_cfg, list_pretrained_tags_by_model

    if pretrained is None:
        return None
    if get_pretrained_cfg(model, pretrained):
        return pretrained
    if os.path.isfile(pretrained):
        return pretrained
    if _looks_like_path(pretrained):
        raise FileNotFoundError(f"{key}: weights file not found: {pretrained}")
    tags = list_pretrained_tags_by_model(model)
    raise CnsbenchError(
        f"{key}: {pretrained!r} is neither an open_clip pretrained tag of {model!r} "
        f"(known tags: {', '.join(tags) if tags else 'none'}) nor an existing weights file"
    )


def trained_with_quick_gelu(model: str, pretrained: str | None) -> bool:
    """Whether the tag's weights were trained with QuickGELU (OpenAI's CLIPs).

    open_clip builds ``ViT-B-16`` etc. with exact GELU and, loading the ``openai`` tag from
    the hub, only warns about the mismatch; the model must be built with QuickGELU for
    those weights to compute what they were trained to.
    """
    from open_clip.pretrained import get_pretrained_cfg

    return bool(pretrained and (get_pretrained_cfg(model, pretrained) or {}).get("quick_gelu", False))


def load_open_clip(
    model: str, pretrained: str | None, model_config_file: str | None, device: str, key: str
) -> tuple[torch.nn.Module, Callable[[Any], torch.Tensor], Callable[[list[str]], torch.Tensor]]:
    """Load an open_clip model in eval mode on ``device``.

    Returns ``(model, eval_preprocess, tokenizer)``.  ``key`` is the config prefix used in
    error messages (e.g. ``filter.clip``).
    """
    import open_clip

    if model_config_file:
        register_open_clip_config(model_config_file, model, f"{key}.model_config_file")
    weights = resolve_open_clip_weights(model, pretrained, f"{key}.pretrained")
    if weights is None:
        log.warning("%s: no pretrained weights given, %s keeps its random initialisation", key, model)
    clip, _, preprocess = open_clip.create_model_and_transforms(
        model, pretrained=weights, device=device, force_quick_gelu=trained_with_quick_gelu(model, weights)
    )
    clip.eval()
    return clip, preprocess, open_clip.get_tokenizer(model)


def load_timm(
    name: str,
    checkpoint: str | None,
    model_kwargs: dict[str, Any],
    device: str,
    key: str,
    **forced: Any,
) -> torch.nn.Module:
    """Create a timm model with weights from its hub tag or from a local file, in eval mode.

    ``model_kwargs`` are ``timm.create_model`` overrides; a ``pretrained_cfg_overlay``
    entry there is merged with the checkpoint (it is how a custom model states its input
    size for preprocessing).  ``forced`` kwargs (e.g. ``num_classes=0``) win over
    ``model_kwargs``.  A missing checkpoint raises FileNotFoundError naming it and ``key``.
    """
    import timm

    kwargs = dict(model_kwargs)
    overlay = dict(kwargs.pop("pretrained_cfg_overlay", None) or {})
    kwargs.update(forced)
    if checkpoint:
        if not os.path.isfile(checkpoint):
            raise FileNotFoundError(f"{key}: checkpoint file not found: {checkpoint}")
        overlay["file"] = checkpoint
        # Some tags (augreg ViTs) load their hub .npz through a custom loader; a local
        # timm state_dict (.pth/.safetensors) must take the plain load_state_dict path.
        overlay.setdefault("custom_load", checkpoint.endswith(".npz"))
        # timm silently drops the head when num_classes differs from the pretrained cfg;
        # a local checkpoint is trained for the requested head, so declare it.
        if "num_classes" in kwargs:
            overlay.setdefault("num_classes", kwargs["num_classes"])
    for field in ("input_size", "test_input_size", "mean", "std"):
        if isinstance(overlay.get(field), list):
            overlay[field] = tuple(overlay[field])  # YAML/JSON give lists; timm expects tuples
    # pretrained=True either way: with a file overlay timm loads that file (its own
    # local-file path, including checkpoint filters), otherwise it fetches the tag.
    model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay or None, **kwargs)
    return model.to(device).eval()


def timm_transform(model: torch.nn.Module) -> Callable[[Any], torch.Tensor]:
    """Eval preprocessing from the model's own data config (size, crop, interpolation, mean/std)."""
    from timm.data import create_transform, resolve_data_config

    cfg = resolve_data_config({}, model=model)
    return create_transform(**cfg)


def _batched(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return torch.cat([fn(x[i : i + MAX_FORWARD]) for i in range(0, len(x), MAX_FORWARD)])


# --------------------------------------------------------------------------- encoders
class ClipEncoder:
    """open_clip image/text encoder returning L2-normalised float32 embeddings on CPU."""

    def __init__(self, spec: ClipModelSpec, device: str, key: str = "filter.clip") -> None:
        self.spec = spec
        self.device = device
        self.model, self.preprocess, self.tokenizer = load_open_clip(
            spec.model, spec.pretrained, spec.model_config_file, device, key
        )
        self.precision: ModelPrecision = FLOAT32

    def set_precision(self, precision: ModelPrecision) -> None:
        """Run both towers in ``precision`` (:mod:`pipeline.models.precision`)."""
        self.model = precision.prepare(self.model)
        self.precision = precision

    @torch.inference_mode()
    def encode_images(self, images: Sequence[Any]) -> torch.Tensor:
        """PIL images -> [N, D] unit-norm embeddings."""
        if not images:
            return torch.empty(0, 0)
        x = self.precision.inputs(torch.stack([self.preprocess(im) for im in images]).to(self.device))
        with self.precision.running(self.device):
            emb = _batched(lambda b: self.model.encode_image(b).float(), x)
        return torch.nn.functional.normalize(emb, dim=-1).cpu()

    @torch.inference_mode()
    def encode_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """Strings -> [N, D] unit-norm embeddings."""
        tokens = self.tokenizer(list(texts)).to(self.device)
        with self.precision.running(self.device):
            emb = _batched(lambda b: self.model.encode_text(b).float(), tokens)
        return torch.nn.functional.normalize(emb, dim=-1).cpu()


class DinoEncoder:
    """timm DINOv2 backbone; :meth:`class_tokens` gives the (optionally softmaxed) class token."""

    def __init__(self, spec: DinoModelSpec, device: str, key: str = "filter.dino") -> None:
        self.spec = spec
        self.device = device
        self.model = load_timm(spec.model, spec.checkpoint, spec.model_kwargs, device, f"{key}.checkpoint", num_classes=0)
        # preprocess 'cns': the original's Resize(520)/CenterCrop(518)/Normalize(0.5, 0.2);
        # 'model' (or unset): the backbone's own timm data config.
        from pipeline.config.protocol import CNS_DINO, build_transform, preprocess_of

        p = preprocess_of(spec.preprocess, CNS_DINO)
        self.transform = build_transform(p) if p is not None else timm_transform(self.model)
        self.precision: ModelPrecision = FLOAT32

    def set_precision(self, precision: ModelPrecision) -> None:
        """Run the backbone in ``precision`` (:mod:`pipeline.models.precision`)."""
        self.model = precision.prepare(self.model)
        self.precision = precision

    @torch.inference_mode()
    def class_tokens(self, images: Sequence[Any]) -> torch.Tensor:
        """PIL images -> [N, D] float32 class tokens on CPU (not normalised).

        ``forward_features`` returns the normed token sequence; index 0 is the class token
        (register and patch tokens follow).  With ``softmax_cls`` the token is softmaxed
        over the feature dimension, as the original CNS-Bench filter code does before its
        cosine similarity; the published threshold 0.781161878 was calibrated on that.
        """
        if not images:
            return torch.empty(0, 0)
        x = self.precision.inputs(torch.stack([self.transform(im) for im in images]).to(self.device))
        with self.precision.running(self.device):
            cls = _batched(lambda b: self.model.forward_features(b)[:, 0].float(), x)
        if self.spec.softmax_cls:
            cls = cls.softmax(dim=-1)
        return cls.cpu()


# --------------------------------------------------------------------------- decision
def keep_decision(
    scores: dict[str, list[float]], thresholds: Thresholds, min_pass: int
) -> tuple[list[int], list[bool]]:
    """Per image: ``n_pass`` = detectors with score strictly above their threshold, kept = n_pass >= min_pass.

    ``scores`` maps each of :data:`pipeline.plan.schema.SCORE_COLUMNS` to one score per image;
    a NaN score never passes.
    """
    missing = [k for k in SCORE_COLUMNS if k not in scores]
    if missing:
        raise KeyError(f"keep_decision: scores lack {missing}; expected keys {list(SCORE_COLUMNS)}")
    lengths = {k: len(scores[k]) for k in SCORE_COLUMNS}
    if len(set(lengths.values())) > 1:
        raise CnsbenchError(f"keep_decision: score lists differ in length: {lengths}")
    n = lengths[SCORE_COLUMNS[0]]
    n_pass = [
        sum(1 for k in SCORE_COLUMNS if scores[k][i] > getattr(thresholds, k)) for i in range(n)
    ]
    return n_pass, [p >= min_pass for p in n_pass]


def _scale0_index(scales: Sequence[float]) -> int:
    for i, s in enumerate(scales):
        if s == 0.0:
            return i
    raise CnsbenchError(f"trajectory has no scale-0 reference image (scales {list(scales)})")


# --------------------------------------------------------------------------- filters
class OOCFilter(Filter):
    """The four-detector out-of-class filter (registry key ``ooc4``)."""

    def __init__(self, spec: FilterSpec, device: str) -> None:
        super().__init__(spec, device)
        self.clip = ClipEncoder(spec.clip, device)
        self.dino = DinoEncoder(spec.dino, device)
        self._text_cache: dict[tuple[str, str], torch.Tensor] = {}
        self._shift_text_cache: dict[str, torch.Tensor] = {}  # shift -> [D] alignment prompt embedding

    def set_precision(self, precision: ModelPrecision) -> None:
        """Run both encoders in ``precision`` (``resources.filter``; :mod:`pipeline.models.precision`);
        the scores and the keep rule stay float32."""
        self.clip.set_precision(precision)
        self.dino.set_precision(precision)
        self._text_cache.clear()  # text embeddings of the earlier precision
        self._shift_text_cache.clear()

    def prompts(self, class_name: str, shift: str) -> tuple[str, str]:
        """The class prompt and the class-in-shift prompt for a (class, shift).

        ``{shift_words}`` is the shift's filter text (:func:`pipeline.config.protocol.shift_text`).
        """
        from pipeline.config.protocol import shift_text

        words = shift_text(self.spec, shift)
        return (
            self.spec.class_prompt.format(class_name=class_name, shift_words=words),
            self.spec.shift_prompt.format(class_name=class_name, shift_words=words),
        )

    def _text_embeddings(self, pairs: list[tuple[str, str]]) -> None:
        todo = [p for p in dict.fromkeys(pairs) if p not in self._text_cache]
        if not todo:
            return
        texts = [t for p in todo for t in self.prompts(*p)]
        emb = self.clip.encode_texts(texts)
        for i, p in enumerate(todo):
            self._text_cache[p] = emb[2 * i : 2 * i + 2]

    def _shift_embeddings(self, shifts: list[str]) -> None:
        todo = [s for s in dict.fromkeys(shifts) if s not in self._shift_text_cache]
        if todo:
            texts = [SHIFT_ALIGNMENT_PROMPT.format(shift_words=s.replace("_", " ")) for s in todo]
            for s, emb in zip(todo, self.clip.encode_texts(texts)):
                self._shift_text_cache[s] = emb

    def score_trajectories(
        self, items: Sequence[Trajectory], with_alignment: bool = False
    ) -> list[dict[str, list[float]]]:
        """Scores of several trajectories with one forward per encoder over all their images.

        Each item is ``(images, scales, class_name, shift)``; returns one dict per item with
        the keys of :data:`pipeline.plan.schema.SCORE_COLUMNS`, one float per image, plus
        ``clip_shift_alignment`` (:data:`SHIFT_ALIGNMENT_PROMPT`) when ``with_alignment``.
        """
        extra = REALISATION_COLUMNS if with_alignment else ()
        refs = [_scale0_index(scales) for _, scales, _, _ in items]
        for (images, scales, _, _) in items:
            if len(images) != len(scales):
                raise CnsbenchError(f"trajectory has {len(images)} images but {len(scales)} scales")
        flat = [im for images, _, _, _ in items for im in images]
        if not flat:
            return [{k: [] for k in (*SCORE_COLUMNS, *extra)} for _ in items]
        self._text_embeddings([(c, s) for _, _, c, s in items])
        if with_alignment:
            self._shift_embeddings([s for _, _, _, s in items])
        clip_img = self.clip.encode_images(flat)
        dino_cls = torch.nn.functional.normalize(self.dino.class_tokens(flat), dim=-1)

        out: list[dict[str, list[float]]] = []
        start = 0
        for (images, _, class_name, shift), ref in zip(items, refs):
            sl = slice(start, start + len(images))
            start += len(images)
            ci, di = clip_img[sl], dino_cls[sl]
            text = self._text_cache[(class_name, shift)]  # [2, D]: class prompt, shift prompt
            text_cos = ci @ text.T
            scores = {
                # CLIPScore as in torchmetrics / the reference: 100 * max(cos, 0).
                "clip_text": (100 * text_cos[:, 0].clamp(min=0)).tolist(),
                "clip_shift_text": (100 * text_cos[:, 1].clamp(min=0)).tolist(),
                "clip_image": (ci @ ci[ref]).tolist(),
                "dino_image": (di @ di[ref]).tolist(),
            }
            if with_alignment:
                scores["clip_shift_alignment"] = (100 * (ci @ self._shift_text_cache[shift]).clamp(min=0)).tolist()
            out.append(scores)
        return out

    def score_trajectory(
        self, images: Sequence[Any], scales: Sequence[float], class_name: str, shift: str
    ) -> dict[str, list[float]]:
        """The four scores of each image of one trajectory (see :meth:`score_trajectories`)."""
        return self.score_trajectories([(images, scales, class_name, shift)])[0]

    def evaluate(self, items: Sequence[Trajectory]) -> list[dict[str, list]]:
        """Scores plus ``n_pass``, ``kept`` and ``clip_shift_alignment`` for each trajectory.

        The keep decision uses the four detector scores only."""
        results = []
        for scores in self.score_trajectories(items, with_alignment=True):
            n_pass, kept = keep_decision(scores, self.spec.thresholds, self.spec.min_pass)
            results.append({**scores, "n_pass": n_pass, "kept": kept})
        return results
