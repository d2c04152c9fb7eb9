"""Stage ``dino``: the DINOv2-architecture ViT trained self-supervised; its k-NN accuracy."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.demo import world_data as W
from pipeline.demo import world_models as M
from pipeline.demo.train.common import DINO_SETTINGS, Ctx, cosine_lr, descend, half_state, quantize, seeded


# --------------------------------------------------------------------------- dino
def _augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Generic views of grey digits [N, 1, H, W]: crop-and-resize, small rotation, contrast, noise."""
    n = len(x)
    scale = 0.8 + 0.3 * torch.rand(n, generator=gen)  # zoom 0.8..1.1
    angle = (torch.rand(n, generator=gen) - 0.5) * (30 * math.pi / 180)  # +-15 degrees
    tx = (torch.rand(n, generator=gen) - 0.5) * 0.25
    ty = (torch.rand(n, generator=gen) - 0.5) * 0.25
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, sin, tx], -1), torch.stack([-sin, cos, ty], -1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    contrast = 0.6 + 0.6 * torch.rand(n, 1, 1, 1, generator=gen)
    out = out * contrast + 0.05 * torch.randn(out.shape, generator=gen)
    return out.clamp(0, 1)


def stage_dino(ctx: Ctx) -> dict[str, Any]:
    x, y, tr, te = ctx.data
    s = DINO_SETTINGS
    gen = seeded(60)
    v = W.make_variants(x[tr], y[tr], 1, seed=61)
    model = M.make_dino()
    dim = M.DINO_KWARGS["embed_dim"]
    head = torch.nn.Sequential(torch.nn.Linear(dim, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=s["lr"], weight_decay=s["weight_decay"])
    norm = lambda t: (W.to_rgb(quantize(t)) - 0.5) / 0.5  # noqa: E731  (TIMM_OVERLAY mean/std)
    model.train()
    for step in range(s["steps"]):
        for g in opt.param_groups:
            g["lr"] = s["lr"] * cosine_lr(step, s["steps"], warmup=50, floor=0.05)
        idx = torch.randint(0, len(v.images), (s["batch"],), generator=gen)
        a, b = _augment(v.images[idx], gen), _augment(v.images[idx], gen)
        z = F.normalize(head(model.forward_features(norm(torch.cat([a, b])))[:, 0]), dim=-1)
        n = len(idx)
        sim = z @ z.T / s["temperature"]
        sim.fill_diagonal_(-1e9)
        target = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
        loss = F.cross_entropy(sim, target)
        descend(opt, loss)
        if step % 200 == 0 or step == s["steps"] - 1:
            ctx.log(f"dino step {step}: loss {float(loss):.4f}")
    model.eval()
    out = ctx.out / "dino"
    out.mkdir(parents=True, exist_ok=True)
    torch.save(half_state(model), out / "dino.pth")
    record = {"final_loss": float(loss), "knn_accuracy": dino_knn(ctx)}
    ctx.log(f"dino: {record}")
    return record


def dino_knn(ctx: Ctx) -> float:
    """1-nearest-neighbour accuracy of the filter's DINO class tokens (held-out vs train digits)."""
    from pipeline.config import DinoModelSpec
    from pipeline.models.detectors import DinoEncoder

    x, y, tr, te = ctx.data
    spec = DinoModelSpec(**M.config_entries(str(ctx.out))["filter"]["dino"])
    enc = DinoEncoder(spec, "cpu")
    ftr = F.normalize(enc.class_tokens(W.to_pil(x[tr])), dim=-1)
    fte = F.normalize(enc.class_tokens(W.to_pil(x[te])), dim=-1)
    pred = y[tr][(fte @ ftr.T).argmax(dim=1)]
    return round(float((pred == y[te]).float().mean()), 4)


