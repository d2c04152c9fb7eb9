"""Stage ``clip``: an open_clip CLIP trained contrastively on digits and captions; its zero-shot accuracy."""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.demo import world_data as W
from pipeline.demo import world_models as M
from pipeline.demo.train.classifiers import pipeline_classifiers
from pipeline.demo.train.common import CLIP_SETTINGS, Ctx, cosine_lr, descend, half_state, quantize, seeded

# --------------------------------------------------------------------------- clip
OPENAI_MEAN = torch.tensor((0.48145466, 0.4578275, 0.40821073)).view(1, 3, 1, 1)
OPENAI_STD = torch.tensor((0.26862954, 0.26130258, 0.27577711)).view(1, 3, 1, 1)


def stage_clip(ctx: Ctx) -> dict[str, Any]:
    import open_clip

    x, y, tr, te = ctx.data
    s = CLIP_SETTINGS
    gen = seeded(50)
    v = W.make_variants(x[tr], y[tr], s["copies_per_shift"], seed=51)
    imgs = (W.to_rgb(quantize(v.images)) - OPENAI_MEAN) / OPENAI_STD
    tokenizer = open_clip.get_tokenizer("ViT-B-32")  # the shared BPE tokenizer, context 77
    # Caption table: per (class, shift state) the clean and the shift templates.
    table: dict[tuple[int, int, int], int] = {}
    texts: list[str] = []

    def text_id(c: int, state: int, t: int) -> int:
        key = (c, state, t)
        if key not in table:
            shift = None if state < 0 else W.SHIFTS[state]
            table[key] = len(texts)
            texts.append(W.clip_caption(W.DIGIT_NAMES[c], shift, t))
        return table[key]

    for c in range(10):
        for t in range(len(W.CLIP_CLEAN_TEMPLATES)):
            text_id(c, -1, t)
        for st in range(len(W.SHIFTS)):
            for t in range(len(W.CLIP_SHIFT_TEMPLATES)):
                text_id(c, st, t)
    tok = tokenizer(texts)
    model = M.make_clip()
    opt = torch.optim.AdamW(model.parameters(), lr=s["lr"], weight_decay=s["weight_decay"])
    model.train()
    for step in range(s["steps"]):
        for g in opt.param_groups:
            g["lr"] = s["lr"] * cosine_lr(step, s["steps"], warmup=50, floor=0.05)
        idx = torch.randint(0, len(imgs), (s["batch"],), generator=gen)
        labels, shifts = v.labels[idx], v.shift[idx]
        use_class = (torch.rand(len(idx), generator=gen) < s["class_caption_share"]) | (shifts < 0)
        caps = []
        for j in range(len(idx)):
            c, st = int(labels[j]), int(shifts[j])
            if use_class[j]:
                caps.append(text_id(c, -1, int(torch.randint(0, len(W.CLIP_CLEAN_TEMPLATES), (1,), generator=gen))))
            else:
                caps.append(text_id(c, st, int(torch.randint(0, len(W.CLIP_SHIFT_TEMPLATES), (1,), generator=gen))))
        caps_t = torch.tensor(caps)
        # Texts in the batch: its distinct captions; an image's positives are all texts equal
        # to its caption's (class, shift) meaning -- templates of one meaning are one text class.
        uniq, inv = torch.unique(caps_t, return_inverse=True)
        meaning = torch.tensor([_meaning(table, int(u)) for u in uniq])
        img_f = F.normalize(model.encode_image(imgs[idx]), dim=-1)
        txt_f = F.normalize(model.encode_text(tok[uniq]), dim=-1)
        logits = model.logit_scale.exp().clamp(max=100) * img_f @ txt_f.T  # [B, U]
        pos = (meaning.unsqueeze(0) == meaning[inv].unsqueeze(1)).float()
        loss_i = -(F.log_softmax(logits, dim=1) * pos / pos.sum(1, keepdim=True)).sum(1).mean()
        # text -> image: for each distinct text, its positives are the images of its meaning.
        pos_t = pos.T
        has = pos_t.sum(1) > 0
        loss_t = -(F.log_softmax(logits.T[has], dim=1) * pos_t[has] / pos_t[has].sum(1, keepdim=True)).sum(1).mean()
        loss = (loss_i + loss_t) / 2
        descend(opt, loss)
        if step % 200 == 0 or step == s["steps"] - 1:
            ctx.log(f"clip step {step}: loss {float(loss):.4f}, logit scale {float(model.logit_scale.exp()):.1f}")
    model.eval()
    out = ctx.out / "clip"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{M.CLIP_NAME}.json").write_text(json.dumps(M.CLIP_CFG, indent=2))
    torch.save(half_state(model), out / f"{M.CLIP_NAME}.pt")
    record = {"final_loss": float(loss), "logit_scale": float(model.logit_scale.exp())}
    record["zero_shot_accuracy"] = clip_zero_shot(ctx)
    ctx.log(f"clip: {record}")
    return record


def _meaning(table: dict[tuple[int, int, int], int], text_index: int) -> int:
    for (c, st, _), i in table.items():
        if i == text_index:
            return c * 10 + (st + 1)
    raise KeyError(text_index)


def clip_zero_shot(ctx: Ctx) -> dict[str, float]:
    """Zero-shot accuracy of the world CLIP (through the pipeline's classifier kind) on held-out digits."""
    x, y, tr, te = ctx.data
    clf = pipeline_classifiers(ctx, ("clip-zs",))["clip-zs"]
    out = {}
    for shift in (None,) + W.SHIFTS:
        for strength in ((0.0,) if shift is None else (0.5, 1.0)):
            imgs = W.apply_shift(x[te], shift, strength)
            pred = clf.predict(W.to_pil(quantize(imgs))).argmax(dim=1)
            out[f"{shift or 'clean'}@{strength}"] = round(float((pred == y[te]).float().mean()), 4)
    return out


