"""Cross-attention maps of the text-to-image model to the class token.

While the model generates a (class, seed) image, every cross-attention layer's attention
from each latent position to the prompt tokens is read (the conditional branch of
classifier-free guidance, averaged over heads) and the columns of the class token are
summed.  The per-layer, per-step maps are upsampled to the image size (bilinear), min-max
scaled and averaged over layers and steps (as DAAM and prompt-to-prompt aggregate them);
by default only the second half of the steps and the highest-resolution layers count.
:func:`refine` then sharpens the map with a guided filter (He et al.) that uses the image
as guide, so its edges follow the object's.

The recording wraps each ``attn2`` processor: it computes the attention probabilities
from the layer's own query and key projections on the side and then calls the original
processor, so the generated image is exactly the one the build's sampler makes, and the
map of a (class, seed) is recorded while the build's source generates its scale-0 image.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.errors import CnsbenchError


class _Store:
    def __init__(self) -> None:
        self.enabled = False
        self.rows = slice(0, 1)
        self.columns: list[int] = []
        self.maps: list[Any] = []  # tensors [Q] (latent positions), one per layer and step


class _Recorder:
    """Wraps an attention processor; records cross-attention to the class-token columns."""

    def __init__(self, inner: Any, store: _Store) -> None:
        self.inner = inner
        self.store = store

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, **kwargs):
        if self.store.enabled and encoder_hidden_states is not None:
            self._record(attn, hidden_states, encoder_hidden_states)
        return self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, temb, **kwargs)

    def _record(self, attn, hidden_states, encoder_hidden_states) -> None:
        hs = hidden_states
        if hs.ndim == 4:
            b, c, h, w = hs.shape
            hs = hs.view(b, c, h * w).transpose(1, 2)
        ehs = attn.norm_encoder_hidden_states(encoder_hidden_states) if attn.norm_cross else encoder_hidden_states
        query = attn.head_to_batch_dim(attn.to_q(hs))
        key = attn.head_to_batch_dim(attn.to_k(ehs))
        probs = attn.get_attention_scores(query, key, None)  # [B * heads, Q, K]
        batch = hs.shape[0]
        probs = probs.view(batch, attn.heads, probs.shape[1], probs.shape[2]).float()
        part = probs[self.store.rows].mean(dim=1)[:, :, self.store.columns].sum(dim=-1)  # [rows, Q]
        self.store.maps.append(part.mean(dim=0).cpu())


class AttentionRecorder:
    """Records the class-token attention map of every plain scale-0 generation of a sampler.

    Installed once per process on the (shared) sampler: its ``attn2`` processors are
    wrapped and its ``generate_group`` is wrapped so that a call without shifts (the
    scale-0 image of a (class, seed), as the ``seed`` source makes it) leaves its map in
    :attr:`maps`.  A mask therefore costs no extra generation when the build's source
    has just generated the image; otherwise :meth:`map_for` generates it once.
    Calls with shifts (slider trajectories) are not recorded and run as before.
    """

    def __init__(self, sampler: Any, max_cached: int = 4096, from_step: float = 0.5, finest: bool = True) -> None:
        self.sampler = sampler
        self.from_step = from_step
        self.finest = finest
        self.store = _Store()
        self.maps: dict[tuple[int, int], np.ndarray] = {}
        self.max_cached = max_cached
        unet = sampler.pipe.unet
        unet.set_attn_processor(
            {n: _Recorder(p, self.store) if n.endswith("attn2.processor") else p for n, p in unet.attn_processors.items()}
        )
        original = sampler.generate_group

        def generate_group(class_id, seed, shifts, scales):
            if shifts:
                return original(class_id, seed, shifts, scales)
            self._begin(class_id)
            try:
                result = original(class_id, seed, shifts, scales)
            finally:
                self.store.enabled = False
            image = result.images[(None, 0.0)]
            if len(self.maps) >= self.max_cached:
                self.maps.pop(next(iter(self.maps)))
            self.maps[(class_id, seed)] = aggregate(
                self.store.maps, (image.size[1], image.size[0]), self.sampler.spec.steps, self.from_step, self.finest
            )
            return result

        sampler.generate_group = generate_group

    def _begin(self, class_id: int) -> None:
        s = self.sampler
        prompt = s.spec.prompt.format(token=s.tokens[class_id])
        self.store.columns = token_columns(s.pipe.tokenizer, prompt, s.tokens[class_id])
        self.store.rows = slice(1, 2) if s.do_cfg else slice(0, 1)  # the conditional branch of one image
        self.store.maps = []
        self.store.enabled = True

    def map_for(self, class_id: int, seed: int) -> np.ndarray:
        """The HxW class-token attention map of (class, seed), generating the image if not recorded yet."""
        if (class_id, seed) not in self.maps:
            self.sampler.generate_group(class_id, seed, [], [0.0])
        return self.maps[(class_id, seed)]


def token_columns(tokenizer, prompt: str, phrase: str) -> list[int]:
    """Positions of ``phrase``'s tokens in the tokenized ``prompt`` (with its start token)."""
    ids = tokenizer(prompt).input_ids
    sub = tokenizer(phrase, add_special_tokens=False).input_ids
    for i in range(len(ids) - len(sub) + 1):
        if sub and ids[i : i + len(sub)] == sub:
            return list(range(i, i + len(sub)))
    raise CnsbenchError(f"class token {phrase!r} not found in the tokenized prompt {prompt!r}")


def aggregate(maps: list[Any], size: tuple[int, int], n_steps: int = 1, from_step: float = 0.0, finest: bool = False) -> np.ndarray:
    """Per-layer/step maps [Q] -> one HxW map in [0, 1].

    ``maps`` are in generation order, ``n_steps`` steps of equally many layers.  Maps of
    the first ``from_step`` share of the steps are skipped (early, noisy steps); with
    ``finest`` only the layers of the highest latent resolution count.  Each map is
    upsampled (bilinear) and min-max scaled, the maps are averaged, and the mean is
    min-max scaled again.
    """
    import torch
    import torch.nn.functional as F

    if not maps:
        raise CnsbenchError("no cross-attention maps were recorded (does the UNet have cross-attention layers?)")
    per_step = max(1, len(maps) // max(1, n_steps))
    largest = max(m.numel() for m in maps)
    total = torch.zeros(size, dtype=torch.float32)
    used = 0
    for i, m in enumerate(maps):
        if i // per_step < int(from_step * n_steps) or (finest and m.numel() != largest):
            continue
        side = int(round(m.numel() ** 0.5))
        if side * side != m.numel():
            raise CnsbenchError(f"cross-attention map of {m.numel()} positions is not square")
        up = F.interpolate(m.view(1, 1, side, side).float(), size=size, mode="bilinear", align_corners=False)[0, 0]
        total += (up - up.min()) / (up.max() - up.min() + 1e-12)
        used += 1
    total /= max(used, 1)
    return _minmax(total.numpy())


def _minmax(x: np.ndarray) -> np.ndarray:
    lo, hi = float(x.min()), float(x.max())
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)


def _box(x: np.ndarray, r: int) -> np.ndarray:
    k = 2 * r + 1
    c = np.pad(np.pad(x, r, mode="edge").cumsum(0).cumsum(1), ((1, 0), (1, 0)))
    return (c[k:, k:] - c[:-k, k:] - c[k:, :-k] + c[:-k, :-k]) / (k * k)


def guided_filter(guide: np.ndarray, src: np.ndarray, radius: int, eps: float) -> np.ndarray:
    """He et al.'s guided filter: ``src`` smoothed so that its edges follow ``guide`` (both HxW, 0..1)."""
    mean_i, mean_p = _box(guide, radius), _box(src, radius)
    cov = _box(guide * src, radius) - mean_i * mean_p
    var = _box(guide * guide, radius) - mean_i * mean_i
    a = cov / (var + eps)
    b = mean_p - a * mean_i
    return _box(a, radius) * guide + _box(b, radius)


def refine(amap: np.ndarray, image: Any, radius: int, eps: float) -> np.ndarray:
    """The attention map refined with the image's grey values as guide, min-max scaled."""
    grey = np.asarray(image.convert("L"), dtype=np.float64) / 255.0
    return _minmax(guided_filter(grey, amap.astype(np.float64), radius, eps))


def recorder_for(sampler: Any, from_step: float = 0.5, finest: bool = True) -> AttentionRecorder:
    """The process's recorder of ``sampler`` (installed on first use)."""
    rec = getattr(sampler, "_attention_recorder", None)
    if rec is not None and (rec.from_step, rec.finest) != (from_step, finest):
        rec.maps.clear()  # recorded with other aggregation settings
        rec.from_step, rec.finest = from_step, finest
    if rec is None:
        rec = AttentionRecorder(sampler, from_step=from_step, finest=finest)
        sampler._attention_recorder = rec
    return rec
