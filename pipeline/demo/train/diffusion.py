"""Stage ``diffusion``: UNet and text encoder trained jointly (v-prediction, captions, EMA), saved as a diffusers pipeline; sampling helpers."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.demo import world_data as W
from pipeline.demo import world_models as M
from pipeline.demo.train.classifiers import evaluate_classifiers
from pipeline.demo.train.common import (
    DIFFUSION_SETTINGS,
    GENERATION,
    Ctx,
    cosine_lr,
    quantize,
    seeded,
)


# --------------------------------------------------------------------------- diffusion
def _tokenizer(ctx: Ctx):
    from transformers import CLIPTokenizer

    from pipeline.demo.tiny_sd import write_clip_tokenizer

    path = ctx.work / "tokenizer"
    if not (path / "tokenizer_config.json").is_file():
        write_clip_tokenizer(path)
    return CLIPTokenizer.from_pretrained(path)


def _tokenize(tokenizer, texts: list[str]) -> torch.Tensor:
    return tokenizer(texts, padding="max_length", max_length=tokenizer.model_max_length, truncation=True,
                     return_tensors="pt").input_ids


class CaptionBank:
    """Pre-tokenised diffusion captions per (class, shift state, template) plus the empty caption."""

    def __init__(self, tokenizer, names: list[str]) -> None:
        self.n_states = 1 + len(W.SHIFTS)
        self.n_templates = max(len(W.CLEAN_TEMPLATES), len(W.SHIFT_TEMPLATES))
        texts = []
        for name in names:
            for state in range(self.n_states):
                shift = None if state == 0 else W.SHIFTS[state - 1]
                for t in range(self.n_templates):
                    texts.append(W.caption(name, shift, t))
        texts.append("")
        self.texts = texts
        self.ids = _tokenize(tokenizer, texts)
        self.empty = len(texts) - 1

    def index(self, labels: torch.Tensor, shift: torch.Tensor, gen: torch.Generator, uncond_prob: float) -> torch.Tensor:
        n = len(labels)
        t = torch.randint(0, self.n_templates, (n,), generator=gen)
        idx = (labels * self.n_states + (shift + 1)) * self.n_templates + t
        drop = torch.rand(n, generator=gen) < uncond_prob
        return torch.where(drop, torch.full_like(idx, self.empty), idx)


def encode_latents(vae, images01: torch.Tensor) -> torch.Tensor:
    """The VAE's scaled latent means of [0, 1] images (quantised to 8 bits first), 256 at a time."""
    data = W.to_rgb(quantize(images01)) * 2 - 1
    with torch.no_grad():
        lat = torch.cat([vae.encode(data[i : i + 256]).latent_dist.mean for i in range(0, len(data), 256)])
    return lat * vae.config.scaling_factor


def diffusion_batch(sched, latents: torch.Tensor, gen: torch.Generator):
    """(noisy latents, timesteps, v-prediction target) of one training batch."""
    noise = torch.randn(latents.shape, generator=gen)
    t = torch.randint(0, sched.config.num_train_timesteps, (len(latents),), generator=gen)
    noisy = sched.add_noise(latents, noise, t)
    target = sched.get_velocity(latents, noise, t)
    return noisy, t, target


def stage_diffusion(ctx: Ctx) -> dict[str, Any]:
    from diffusers import AutoencoderKL, DDIMScheduler

    from pipeline.demo.tiny_sd import SD2_SCHEDULER

    x, y, tr, te = ctx.data
    s = DIFFUSION_SETTINGS
    gen = seeded(30)
    tokenizer = _tokenizer(ctx)
    vae = AutoencoderKL.from_pretrained(ctx.work / "vae").eval()
    v = W.make_variants(x[tr], y[tr], s["copies_per_shift"], seed=31)
    latents = encode_latents(vae, v.images)
    clean = torch.nonzero(v.shift < 0).flatten()
    shifted = torch.nonzero(v.shift >= 0).flatten()
    bank = CaptionBank(tokenizer, list(W.DIGIT_NAMES))
    sched = DDIMScheduler(**SD2_SCHEDULER)

    unet = M.make_unet()
    text = M.make_text_encoder(tokenizer)
    ema = {k: p.detach().clone() for k, p in list(unet.named_parameters()) + [("text." + k, p) for k, p in text.named_parameters()]}
    params = [{"params": list(unet.parameters()), "lr": s["lr"]}, {"params": list(text.parameters()), "lr": s["text_lr"]}]
    opt = torch.optim.AdamW(params, weight_decay=0.01)
    base_lrs = [s["lr"], s["text_lr"]]
    unet.train()
    text.train()
    losses = []
    for step in range(s["steps"]):
        f = cosine_lr(step, s["steps"], warmup=s["warmup"], floor=0.1)
        for g, lr in zip(opt.param_groups, base_lrs):
            g["lr"] = lr * f
        n_clean = int(round(s["batch"] * s["clean_share"]))
        idx = torch.cat([
            clean[torch.randint(0, len(clean), (n_clean,), generator=gen)],
            shifted[torch.randint(0, len(shifted), (s["batch"] - n_clean,), generator=gen)],
        ])
        cap = bank.index(v.labels[idx], v.shift[idx], gen, s["uncond_prob"])
        noisy, t, target = diffusion_batch(sched, latents[idx], gen)
        hidden = text(bank.ids[cap])[0]
        pred = unet(noisy, t, encoder_hidden_states=hidden).sample
        loss = F.mse_loss(pred, target)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
        opt.step()
        decay = min(s["ema"], (1 + step) / (10 + step))
        with torch.no_grad():
            for k, p in list(unet.named_parameters()) + [("text." + k, p) for k, p in text.named_parameters()]:
                ema[k].mul_(decay).add_(p.detach(), alpha=1 - decay)
        losses.append(float(loss))
        if step % 250 == 0 or step == s["steps"] - 1:
            ctx.log(f"diffusion step {step}: loss {sum(losses[-50:]) / len(losses[-50:]):.4f}")
    with torch.no_grad():
        for k, p in unet.named_parameters():
            p.copy_(ema[k])
        for k, p in text.named_parameters():
            p.copy_(ema["text." + k])
    unet.eval()
    text.eval()
    save_sd(ctx, unet, vae, text, tokenizer)
    record = {"loss_first_50": sum(losses[:50]) / 50, "loss_last_50": sum(losses[-50:]) / 50}
    ctx.log(f"diffusion: {record}")
    return record


def save_sd(ctx: Ctx, unet, vae, text, tokenizer) -> Path:
    """Write the diffusers directory ``sd/`` with fp16 weights (loading upcasts to the build's dtype)."""
    import copy

    from diffusers import DDIMScheduler, StableDiffusionPipeline

    from pipeline.demo.tiny_sd import SD2_SCHEDULER

    pipe = StableDiffusionPipeline(
        unet=copy.deepcopy(unet).half(),
        vae=copy.deepcopy(vae).half(),
        text_encoder=copy.deepcopy(text).half(),
        tokenizer=tokenizer,
        scheduler=DDIMScheduler(**SD2_SCHEDULER),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    out = ctx.out / "sd"
    if out.exists():
        shutil.rmtree(out)
    pipe.save_pretrained(out, safe_serialization=True)
    return out


def load_sd(ctx: Ctx):
    from pipeline.models.diffusion import load_pipeline

    return load_pipeline(str(ctx.out / "sd"), torch.float32, "cpu")


@torch.no_grad()
def sample_digits(pipe, prompts: list[str], seeds: list[int], guidance: float | None = None) -> torch.Tensor:
    """[N, 1, 32, 32] grey samples (DDIM, the world's generation settings), one seed per image."""
    images = []
    for lo in range(0, len(prompts), 32):
        ps, ss = prompts[lo : lo + 32], seeds[lo : lo + 32]
        gens = [torch.Generator().manual_seed(sd) for sd in ss]
        out = pipe(
            ps, negative_prompt=[GENERATION["negative_prompt"]] * len(ps), num_inference_steps=GENERATION["steps"],
            guidance_scale=GENERATION["guidance_scale"] if guidance is None else guidance,
            height=M.RESOLUTION, width=M.RESOLUTION, generator=gens, output_type="pt",
        )
        images.append(out.images.float().mean(dim=1, keepdim=True))
    return quantize(torch.cat(images))


def generated_accuracy(ctx: Ctx, use_tokens: bool, per_class: int = 6) -> dict[str, float]:
    """Accuracy of the trained classifiers on generated digits (prompt ``a picture of a {name or token}``)."""
    pipe = load_sd(ctx)
    names = list(W.DIGIT_NAMES)
    if use_tokens:
        from pipeline.config import ClassTokens
        from pipeline.labels import label_space
        from pipeline.models.diffusion import install_class_tokens

        toks = install_class_tokens(pipe, ClassTokens(kind="ti_folder", path=str(ctx.out / "tokens")),
                                    list(range(10)), label_space(names))
        names = [toks[i] for i in range(10)]
    prompts = [f"a picture of a {names[c]}" for c in range(10) for _ in range(per_class)]
    seeds = [1000 + i for i in range(len(prompts))]
    imgs = sample_digits(pipe, prompts, seeds)
    labels = [c for c in range(10) for _ in range(per_class)]
    tag = "tokens" if use_tokens else "words"
    save_grid(imgs, per_class, ctx.work / f"samples_{tag}.png")
    return evaluate_classifiers(ctx, W.to_pil(imgs), labels)


def save_grid(imgs: torch.Tensor, cols: int, path: Path) -> None:
    from PIL import Image

    n = len(imgs)
    rows = (n + cols - 1) // cols
    grid = torch.zeros(rows * M.RESOLUTION, cols * M.RESOLUTION)
    for i in range(n):
        r, c = divmod(i, cols)
        grid[r * M.RESOLUTION : (r + 1) * M.RESOLUTION, c * M.RESOLUTION : (c + 1) * M.RESOLUTION] = imgs[i, 0]
    Image.fromarray((grid * 255).round().byte().numpy()).save(path)


