"""Stage ``vae``: ``AutoencoderKL`` on clean and shifted digits (32 px -> 4x8x8)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from pipeline.demo import world_data as W
from pipeline.demo import world_models as M
from pipeline.demo.train.common import VAE_SETTINGS, Ctx, cosine_lr, quantize, seeded


# --------------------------------------------------------------------------- vae
def stage_vae(ctx: Ctx) -> dict[str, Any]:
    x, y, tr, te = ctx.data
    s = VAE_SETTINGS
    gen = seeded(20)
    v = W.make_variants(x[tr], y[tr], s["copies_per_shift"], seed=21, low=0.0, high=s["max_strength"])
    data = W.to_rgb(quantize(v.images)) * 2 - 1
    vae = M.make_vae()
    opt = torch.optim.AdamW(vae.parameters(), lr=s["lr"], weight_decay=0.0)
    vae.train()
    for step in range(s["steps"]):
        for g in opt.param_groups:
            g["lr"] = s["lr"] * cosine_lr(step, s["steps"], warmup=30, floor=0.05)
        idx = torch.randint(0, len(data), (s["batch"],), generator=gen)
        batch = data[idx]
        post = vae.encode(batch).latent_dist
        rec = vae.decode(post.sample(generator=gen)).sample
        loss = F.mse_loss(rec, batch) + s["kl_weight"] * post.kl().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 300 == 0 or step == s["steps"] - 1:
            ctx.log(f"vae step {step}: loss {float(loss):.5f}")
    vae.eval()
    with torch.no_grad():
        lat = torch.cat([vae.encode(data[i : i + 256]).latent_dist.mean for i in range(0, len(data), 256)])
        scaling = float(1.0 / lat.std())
        test = W.to_rgb(quantize(x[te])) * 2 - 1
        rec = torch.cat([vae.decode(vae.encode(test[i : i + 256]).latent_dist.mean).sample for i in range(0, len(test), 256)])
        test_mse = float(F.mse_loss((rec.clamp(-1, 1) + 1) / 2, (test + 1) / 2))
    vae.register_to_config(scaling_factor=scaling)
    vae.save_pretrained(ctx.work / "vae")
    ctx.log(f"vae: scaling factor {scaling:.4f}, held-out MSE {test_mse:.5f}")
    return {"scaling_factor": scaling, "test_mse": test_mse, "final_loss": float(loss)}


