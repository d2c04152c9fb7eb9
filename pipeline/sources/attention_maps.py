"""Cross-attention maps of the text-to-image model to the class token.

While the model generates a (class, seed) image, every cross-attention layer's attention
from each latent position to the prompt tokens is read (the conditional branch of
classifier-free guidance, averaged over heads) and the columns of the class token are
summed.  The per-layer, per-step maps are upsampled to the image size (bilinear) and
averaged over layers and steps (as DAAM and prompt-to-prompt aggregate them), then
scaled to a maximum of 1.

The recording wraps each ``attn2`` processor: it computes the attention probabilities
from the layer's own query and key projections on the side and then calls the original
processor, so the generated image is exactly the one the build's sampler makes.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class _Store:
    def __init__(self, rows: slice, columns: list[int]) -> None:
        self.rows = rows
        self.columns = columns
        self.maps: list[Any] = []  # tensors [Q] (latent positions), one per layer and step


class _Recorder:
    """Wraps an attention processor; records cross-attention to the class-token columns."""

    def __init__(self, inner: Any, store: _Store) -> None:
        self.inner = inner
        self.store = store

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, **kwargs):
        if encoder_hidden_states is not None:
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


def token_columns(tokenizer, prompt: str, phrase: str) -> list[int]:
    """Positions of ``phrase``'s tokens in the tokenized ``prompt`` (with its start token)."""
    ids = tokenizer(prompt).input_ids
    sub = tokenizer(phrase, add_special_tokens=False).input_ids
    for i in range(len(ids) - len(sub) + 1):
        if sub and ids[i : i + len(sub)] == sub:
            return list(range(i, i + len(sub)))
    raise ValueError(f"class token {phrase!r} not found in the tokenized prompt {prompt!r}")


def aggregate(maps: list[Any], size: tuple[int, int]) -> np.ndarray:
    """Per-layer/step maps [Q] -> one HxW map in [0, 1] (bilinear upsampling, mean, max-scaled)."""
    import torch
    import torch.nn.functional as F

    if not maps:
        raise ValueError("no cross-attention maps were recorded (does the UNet have cross-attention layers?)")
    total = torch.zeros(size, dtype=torch.float32)
    for m in maps:
        side = int(round(m.numel() ** 0.5))
        if side * side != m.numel():
            raise ValueError(f"cross-attention map of {m.numel()} positions is not square")
        up = F.interpolate(m.view(1, 1, side, side), size=size, mode="bilinear", align_corners=False)[0, 0]
        total += up
    total /= len(maps)
    peak = float(total.max())
    return (total / peak).numpy() if peak > 0 else total.numpy()


def class_attention_map(sampler: Any, class_id: int, seed: int) -> tuple[np.ndarray, Any]:
    """(HxW attention map to the class token at the saved image size, the generated image).

    Runs the sampler's own scale-0 generation of (class, seed) with recording processors.
    """
    unet = sampler.pipe.unet
    prompt = sampler.spec.prompt.format(token=sampler.tokens[class_id])
    columns = token_columns(sampler.pipe.tokenizer, prompt, sampler.tokens[class_id])
    rows = slice(1, 2) if sampler.do_cfg else slice(0, 1)  # the conditional branch (batch of one image)
    store = _Store(rows, columns)
    original = unet.attn_processors
    unet.set_attn_processor(
        {name: _Recorder(p, store) if ".attn2." in name or name.endswith("attn2.processor") else p for name, p in original.items()}
    )
    try:
        result = sampler.generate_group(class_id, seed, [], [0.0])
    finally:
        unet.set_attn_processor(original)
    image = result.images[(None, 0.0)]
    return aggregate(store.maps, (image.size[1], image.size[0])), image
