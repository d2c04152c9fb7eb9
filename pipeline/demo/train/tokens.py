"""Stage ``tokens``: textual inversion, one embedding per digit in the Dataset-Interfaces layout."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from pipeline.demo import world_data as W
from pipeline.demo.train.common import TOKEN_SETTINGS, Ctx, seeded
from pipeline.demo.train.diffusion import CaptionBank, diffusion_batch, encode_latents, load_sd


# --------------------------------------------------------------------------- textual inversion
def stage_tokens(ctx: Ctx) -> dict[str, Any]:
    from diffusers import DDIMScheduler

    from pipeline.models.diffusion import ti_token

    x, y, tr, te = ctx.data
    s = TOKEN_SETTINGS
    gen = seeded(40)
    pipe = load_sd(ctx)
    tokenizer, text, unet = pipe.tokenizer, pipe.text_encoder, pipe.unet
    for m in (text, unet, pipe.vae):
        m.requires_grad_(False)
        m.eval()
    tokens = [ti_token(i, n) for i, n in enumerate(W.DIGIT_NAMES)]
    # As diffusers' load_textual_inversion does: new tokens, a resized embedding matrix.
    tokenizer.add_tokens(tokens)
    text.resize_token_embeddings(len(tokenizer))
    emb = text.get_input_embeddings()
    new_ids = tokenizer.convert_tokens_to_ids(tokens)
    init_ids = [tokenizer(n, add_special_tokens=False).input_ids[0] for n in W.DIGIT_NAMES]
    with torch.no_grad():
        emb.weight[new_ids] = emb.weight[init_ids].clone()
    init = emb.weight[init_ids].detach().clone()
    # Only the embedding matrix gets gradients, and only the new rows are updated: the
    # other rows' gradients are zeroed, so Adam leaves them exactly as they are.
    emb.weight.requires_grad_(True)
    frozen = torch.ones(len(tokenizer), 1)
    frozen[new_ids] = 0
    bank = CaptionBank(tokenizer, tokens)
    v = W.make_variants(x[tr], y[tr], 1, seed=41)
    latents = encode_latents(pipe.vae, v.images)
    sched = DDIMScheduler.from_config(pipe.scheduler.config)
    opt = torch.optim.Adam([emb.weight], lr=s["lr"])
    losses = []
    for step in range(s["steps"]):
        idx = torch.randint(0, len(latents), (s["batch"],), generator=gen)
        cap = bank.index(v.labels[idx], v.shift[idx], gen, 0.0)
        hidden = text(bank.ids[cap])[0]
        noisy, t, target = diffusion_batch(sched, latents[idx], gen)
        loss = F.mse_loss(unet(noisy, t, encoder_hidden_states=hidden).sample, target)
        opt.zero_grad()
        loss.backward()
        emb.weight.grad.mul_(1 - frozen)
        opt.step()
        losses.append(float(loss))
    learned = emb.weight[new_ids].detach()
    out = ctx.out / "tokens"
    out.mkdir(parents=True, exist_ok=True)
    for i, tok in enumerate(tokens):
        torch.save({tok: learned[i].detach().clone().float()}, out / f"{i}.bin")
    record = {"loss_first_20": sum(losses[:20]) / 20, "loss_last_20": sum(losses[-20:]) / 20,
              "moved_from_init": float((learned - init).norm(dim=1).mean()), "init_norm": float(init.norm(dim=1).mean())}
    ctx.log(f"tokens: {record}")
    return record


