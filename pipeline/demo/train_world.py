"""Train the miniature world from scratch: ``python -m pipeline.demo.train_world --output assets/world``.

Measured runtime on the development machine (2 shared CPU cores, torch 2.14 CPU, one
thread per process, ``--jobs 2``): **16 min 33 s wall** from scratch (18 min CPU), of
which the diffusion model takes 7 min, sliders (30 of them) 4 min, the VAE 2-4 min, CLIP
2-3 min (in the side process), textual inversion, DINO and the classifiers about 1 min
each.  Other jobs on the same cores stretch the wall time (during development, stages
run under a load average of ~10 took about 3x their CPU time); ``world.json`` records
each stage's wall and CPU seconds.  The
output is 16.3 MB (fp16 weights where the loader upcasts).

What it trains (all seeded; data from :mod:`pipeline.demo.world_data`, architectures from
:mod:`pipeline.demo.world_models`), in this order, each stage resumable:

``classifiers``  a linear model (TorchScript), a small ResNet and a small ViT (timm), on
                 the clean train digits;
``vae``          ``AutoencoderKL`` on clean and shifted digits (32 px -> 4x8x8);
``diffusion``    ``UNet2DConditionModel`` + ``CLIPTextModel`` jointly, v-prediction on the
                 VAE latents, captions ``a picture of a {digit}`` / ``{digit}, in {shift
                 words}`` (shifted images at random strengths), 10% caption dropout for
                 classifier-free guidance, EMA weights; saved as a diffusers
                 ``StableDiffusionPipeline`` directory ``sd/`` (fp16 weights);
``tokens``       textual inversion: the model frozen, one new embedding per class for the
                 token ``<{digit}-{i}>`` (initialised from the digit's word), saved as
                 ``tokens/{i}.bin`` (the Dataset-Interfaces layout);
``clip``         an open_clip CLIP trained contrastively on digits and captions (class names
                 with and without shift words), ``clip/world-clip.{json,pt}``;
``dino``         the DINOv2-architecture ViT trained self-supervised (SimCLR-style
                 augmentation invariance: two random crops/rotations/contrast/noise views
                 of a digit, NT-Xent on a projection of the class token), ``dino/dino.pth``;
``sliders``      one LoRA concept slider per (digit, shift) with the project's slider
                 trainer (:func:`pipeline.train.sliders.train_sliders`, text-slider
                 objective), ``sliders/{shift}/{i:03d}.safetensors``;
``calibrate``    the four filter thresholds, from held-out digits: a common quantile of the
                 detectors' out-of-class scores such that the 2-of-4 rule removes 90% of
                 out-of-class calibration pairs (the reference's thresholds remove 90% of
                 human-labelled OOC samples); out-of-class = another digit, or a blend in
                 which another digit dominates, scored against a digit's prompts and
                 image; ``filter_thresholds.json``;
``evaluate``     held-out checks: classifier accuracy on generated digits (class words and
                 class tokens) and on slider images of all 10 digits at scale 0 and 2.5.

``world.json`` records held-out numbers (classifier accuracies, VAE error, accuracy of
generated digits, CLIP zero-shot accuracy, slider losses, calibration), sizes and stage
times.  Intermediate files live in ``{output}/_work`` until the end, so an interrupted run
resumes at the first unfinished stage.  Threads: one by default (``--threads``); on a
shared 2-core machine more threads mostly spin.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from pipeline.demo import world_data as W
from pipeline.demo import world_models as M

STAGES = ("classifiers", "vae", "diffusion", "tokens", "clip", "dino", "sliders", "calibrate", "evaluate")
# With --jobs 2 these run in a second process alongside the generator's chain.
SIDE_STAGES = ("classifiers", "clip", "dino")
VERSION = "1"

# --------------------------------------------------------------------------- settings
CLASSIFIER_SETTINGS = {
    "linear": dict(steps=400, lr=5e-3, weight_decay=1e-4),
    "cnn": dict(epochs=12, batch=64, lr=3e-3, weight_decay=5e-4),
    "vit": dict(epochs=30, batch=64, lr=1e-3, weight_decay=5e-2),
}
VAE_SETTINGS = dict(steps=600, batch=32, lr=2e-3, kl_weight=1e-6, copies_per_shift=2, max_strength=1.6)
DIFFUSION_SETTINGS = dict(
    steps=1500, batch=64, lr=1e-3, text_lr=1e-3, warmup=100, ema=0.998, copies_per_shift=2,
    clean_share=0.4, uncond_prob=0.1,
)
TOKEN_SETTINGS = dict(steps=300, batch=64, lr=5e-3)
CLIP_SETTINGS = dict(steps=500, batch=128, lr=1e-3, weight_decay=0.1, copies_per_shift=2, class_caption_share=0.2)
DINO_SETTINGS = dict(steps=500, batch=128, lr=1e-3, weight_decay=0.05, temperature=0.2)
# Slider training (the slider_training section of configs/demo.yaml mirrors it).
SLIDER_SETTINGS = dict(
    rank=4, alpha=1.0, targets="attn", method="noxattn", iterations=100, learning_rate=3e-3, eta=4.0,
    mode="enhance", max_denoise_steps=10, seed=0, dtype="float32",
)
GENERATION = dict(steps=50, guidance_scale=4.0, negative_prompt="", lora_timestep_threshold=750)
CALIBRATION = dict(ooc_removed=0.90, strengths=(0.0, 0.25, 0.5, 0.75, 1.0), per_class=12, blend_low=0.5, blend_high=0.9)


# --------------------------------------------------------------------------- context
class Ctx:
    """Output and work directories, the data, the log and per-stage records."""

    def __init__(self, out: Path, threads: int, echo: Callable[[str], None] = print) -> None:
        self.out = out
        self.work = out / "_work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.threads = threads
        self.echo = echo
        self._data: tuple | None = None

    def log(self, msg: str) -> None:
        self.echo(f"[train-world] {msg}")

    @property
    def data(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(images, labels, train indices, test indices)."""
        if self._data is None:
            x, y = W.load_digits_tensor()
            tr, te = W.split(y)
            self._data = (x, y, tr, te)
        return self._data

    def done(self, stage: str) -> bool:
        return (self.work / f"{stage}.json").is_file()

    def mark(self, stage: str, record: dict[str, Any]) -> None:
        """Store a finished stage's record; the file is the stage's done-marker."""
        tmp = self.work / f"{stage}.json.tmp"
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, self.work / f"{stage}.json")

    @property
    def records(self) -> dict[str, Any]:
        return {s: json.loads((self.work / f"{s}.json").read_text()) for s in STAGES if self.done(s)}


def _seed(seed: int) -> torch.Generator:
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def _quantize(x: torch.Tensor) -> torch.Tensor:
    """[0, 1] -> the 8-bit levels a PNG holds (what the pipeline's models see)."""
    return (x.clamp(0, 1) * 255).round() / 255


def _cosine_lr(step: int, total: int, warmup: int = 0, floor: float = 0.1) -> float:
    if step < warmup:
        return (step + 1) / warmup
    p = (step - warmup) / max(1, total - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, p)))


def _translate(x: torch.Tensor, gen: torch.Generator, max_px: int = 2) -> torch.Tensor:
    """Random integer translations of up to ``max_px`` (zero fill)."""
    n, _, h, w = x.shape
    pad = F.pad(x, (max_px,) * 4)
    dy = torch.randint(0, 2 * max_px + 1, (n,), generator=gen)
    dx = torch.randint(0, 2 * max_px + 1, (n,), generator=gen)
    return torch.stack([pad[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(n)])


def _half_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: (v.detach().half() if v.is_floating_point() else v.detach()).clone() for k, v in module.state_dict().items()}


# --------------------------------------------------------------------------- classifiers
def stage_classifiers(ctx: Ctx) -> dict[str, Any]:
    x, y, tr, te = ctx.data
    gen = _seed(10)
    xtr = W.to_rgb(_quantize(x[tr]))
    ytr = y[tr]
    norm = lambda t: (t - 0.5) / 0.5  # noqa: E731  (TIMM_OVERLAY mean/std)
    out = ctx.out / "classifiers"
    out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {}

    # Linear: full-batch softmax regression on grey pixels.
    s = CLASSIFIER_SETTINGS["linear"]
    lin = M.LinearDigits()
    opt = torch.optim.Adam(lin.parameters(), lr=s["lr"], weight_decay=s["weight_decay"])
    xin = norm(xtr)
    for _ in range(s["steps"]):
        loss = F.cross_entropy(lin(xin), ytr)
        opt.zero_grad()
        loss.backward()
        opt.step()
    lin.eval()
    pre = {"input_size": [3, M.RESOLUTION, M.RESOLUTION], "mean": [0.5] * 3, "std": [0.5] * 3, "interpolation": "bilinear"}
    torch.jit.save(torch.jit.script(lin), str(out / "linear.torchscript.pt"), _extra_files={"preprocess.json": json.dumps(pre)})
    record["linear_train_loss"] = float(loss.detach())

    # Small ResNet and ViT: minibatch AdamW with +-2 px translations.
    for kind in ("cnn", "vit"):
        s = CLASSIFIER_SETTINGS[kind]
        net = M.make_timm_classifier(kind)
        opt = torch.optim.AdamW(net.parameters(), lr=s["lr"], weight_decay=s["weight_decay"])
        n = len(xtr)
        steps = s["epochs"] * (n // s["batch"])
        step = 0
        net.train()
        for _ in range(s["epochs"]):
            perm = torch.randperm(n, generator=gen)
            for lo in range(0, n - s["batch"] + 1, s["batch"]):
                idx = perm[lo : lo + s["batch"]]
                for g in opt.param_groups:
                    g["lr"] = s["lr"] * _cosine_lr(step, steps, warmup=20, floor=0.02)
                loss = F.cross_entropy(net(norm(_translate(xtr[idx], gen))), ytr[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
        net.eval()
        torch.save(_half_state(net), out / f"{kind}.pth")
        record[f"{kind}_train_loss"] = float(loss)

    # Held-out accuracy through the pipeline's own classifier loaders (PIL in, as in a build).
    record["test_accuracy"] = evaluate_classifiers(ctx, W.to_pil(x[te]), y[te].tolist())
    ctx.log(f"classifiers: held-out accuracy {record['test_accuracy']}")
    return record


def pipeline_classifiers(ctx: Ctx, names: tuple[str, ...] = ("linear", "cnn", "vit")) -> dict[str, Any]:
    from pipeline.config import ClassifierSpec
    from pipeline.labels import label_space
    from pipeline.registry import CLASSIFIERS

    labels = label_space(list(W.DIGIT_NAMES))
    specs = {c["name"]: c for c in M.config_entries(str(ctx.out))["classifiers"]}
    out = {}
    for name in names:
        spec = ClassifierSpec(**specs[name])
        out[name] = CLASSIFIERS.get(spec.kind)(spec, "cpu", labels)
    return out


def evaluate_classifiers(ctx: Ctx, images: list, labels: list[int], names=("linear", "cnn", "vit")) -> dict[str, float]:
    accs = {}
    for name, clf in pipeline_classifiers(ctx, tuple(names)).items():
        pred = clf.predict(images).argmax(dim=1)
        accs[name] = round(float((pred == torch.tensor(labels)).float().mean()), 4)
    return accs


# --------------------------------------------------------------------------- vae
def stage_vae(ctx: Ctx) -> dict[str, Any]:
    x, y, tr, te = ctx.data
    s = VAE_SETTINGS
    gen = _seed(20)
    v = W.make_variants(x[tr], y[tr], s["copies_per_shift"], seed=21, low=0.0, high=s["max_strength"])
    data = W.to_rgb(_quantize(v.images)) * 2 - 1
    vae = M.make_vae()
    opt = torch.optim.AdamW(vae.parameters(), lr=s["lr"], weight_decay=0.0)
    vae.train()
    for step in range(s["steps"]):
        for g in opt.param_groups:
            g["lr"] = s["lr"] * _cosine_lr(step, s["steps"], warmup=30, floor=0.05)
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
        test = W.to_rgb(_quantize(x[te])) * 2 - 1
        rec = torch.cat([vae.decode(vae.encode(test[i : i + 256]).latent_dist.mean).sample for i in range(0, len(test), 256)])
        test_mse = float(F.mse_loss((rec.clamp(-1, 1) + 1) / 2, (test + 1) / 2))
    vae.register_to_config(scaling_factor=scaling)
    vae.save_pretrained(ctx.work / "vae")
    ctx.log(f"vae: scaling factor {scaling:.4f}, held-out MSE {test_mse:.5f}")
    return {"scaling_factor": scaling, "test_mse": test_mse, "final_loss": float(loss)}


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


def _encode_latents(vae, images01: torch.Tensor) -> torch.Tensor:
    data = W.to_rgb(_quantize(images01)) * 2 - 1
    with torch.no_grad():
        lat = torch.cat([vae.encode(data[i : i + 256]).latent_dist.mean for i in range(0, len(data), 256)])
    return lat * vae.config.scaling_factor


def _diffusion_batch(sched, latents: torch.Tensor, gen: torch.Generator):
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
    gen = _seed(30)
    tokenizer = _tokenizer(ctx)
    vae = AutoencoderKL.from_pretrained(ctx.work / "vae").eval()
    v = W.make_variants(x[tr], y[tr], s["copies_per_shift"], seed=31)
    latents = _encode_latents(vae, v.images)
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
        f = _cosine_lr(step, s["steps"], warmup=s["warmup"], floor=0.1)
        for g, lr in zip(opt.param_groups, base_lrs):
            g["lr"] = lr * f
        n_clean = int(round(s["batch"] * s["clean_share"]))
        idx = torch.cat([
            clean[torch.randint(0, len(clean), (n_clean,), generator=gen)],
            shifted[torch.randint(0, len(shifted), (s["batch"] - n_clean,), generator=gen)],
        ])
        cap = bank.index(v.labels[idx], v.shift[idx], gen, s["uncond_prob"])
        noisy, t, target = _diffusion_batch(sched, latents[idx], gen)
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
    from diffusers import DDIMScheduler, StableDiffusionPipeline

    from pipeline.demo.tiny_sd import SD2_SCHEDULER

    import copy

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
    return _quantize(torch.cat(images))


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


# --------------------------------------------------------------------------- textual inversion
def stage_tokens(ctx: Ctx) -> dict[str, Any]:
    from diffusers import DDIMScheduler

    from pipeline.models.diffusion import ti_token

    x, y, tr, te = ctx.data
    s = TOKEN_SETTINGS
    gen = _seed(40)
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
    latents = _encode_latents(pipe.vae, v.images)
    sched = DDIMScheduler.from_config(pipe.scheduler.config)
    opt = torch.optim.Adam([emb.weight], lr=s["lr"])
    losses = []
    for step in range(s["steps"]):
        idx = torch.randint(0, len(latents), (s["batch"],), generator=gen)
        cap = bank.index(v.labels[idx], v.shift[idx], gen, 0.0)
        hidden = text(bank.ids[cap])[0]
        noisy, t, target = _diffusion_batch(sched, latents[idx], gen)
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


# --------------------------------------------------------------------------- clip
OPENAI_MEAN = torch.tensor((0.48145466, 0.4578275, 0.40821073)).view(1, 3, 1, 1)
OPENAI_STD = torch.tensor((0.26862954, 0.26130258, 0.27577711)).view(1, 3, 1, 1)


def stage_clip(ctx: Ctx) -> dict[str, Any]:
    import open_clip

    x, y, tr, te = ctx.data
    s = CLIP_SETTINGS
    gen = _seed(50)
    v = W.make_variants(x[tr], y[tr], s["copies_per_shift"], seed=51)
    imgs = (W.to_rgb(_quantize(v.images)) - OPENAI_MEAN) / OPENAI_STD
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
            g["lr"] = s["lr"] * _cosine_lr(step, s["steps"], warmup=50, floor=0.05)
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
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 200 == 0 or step == s["steps"] - 1:
            ctx.log(f"clip step {step}: loss {float(loss):.4f}, logit scale {float(model.logit_scale.exp()):.1f}")
    model.eval()
    out = ctx.out / "clip"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{M.CLIP_NAME}.json").write_text(json.dumps(M.CLIP_CFG, indent=2))
    torch.save(_half_state(model), out / f"{M.CLIP_NAME}.pt")
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
            pred = clf.predict(W.to_pil(_quantize(imgs))).argmax(dim=1)
            out[f"{shift or 'clean'}@{strength}"] = round(float((pred == y[te]).float().mean()), 4)
    return out


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
    gen = _seed(60)
    v = W.make_variants(x[tr], y[tr], 1, seed=61)
    model = M.make_dino()
    dim = M.DINO_KWARGS["embed_dim"]
    head = torch.nn.Sequential(torch.nn.Linear(dim, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=s["lr"], weight_decay=s["weight_decay"])
    norm = lambda t: (W.to_rgb(_quantize(t)) - 0.5) / 0.5  # noqa: E731  (TIMM_OVERLAY mean/std)
    model.train()
    for step in range(s["steps"]):
        for g in opt.param_groups:
            g["lr"] = s["lr"] * _cosine_lr(step, s["steps"], warmup=50, floor=0.05)
        idx = torch.randint(0, len(v.images), (s["batch"],), generator=gen)
        a, b = _augment(v.images[idx], gen), _augment(v.images[idx], gen)
        z = F.normalize(head(model.forward_features(norm(torch.cat([a, b])))[:, 0]), dim=-1)
        n = len(idx)
        sim = z @ z.T / s["temperature"]
        sim.fill_diagonal_(-1e9)
        target = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
        loss = F.cross_entropy(sim, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 200 == 0 or step == s["steps"] - 1:
            ctx.log(f"dino step {step}: loss {float(loss):.4f}")
    model.eval()
    out = ctx.out / "dino"
    out.mkdir(parents=True, exist_ok=True)
    torch.save(_half_state(model), out / "dino.pth")
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


# --------------------------------------------------------------------------- sliders
def slider_config(ctx: Ctx, classes: list[int] | None = None):
    """A BuildConfig over the world's classes and shifts whose generator points at ``ctx.out``."""
    from pipeline.config import BuildConfig

    entries = M.config_entries(str(ctx.out))
    return BuildConfig.model_validate({
        "benchmark": {"name": "world-sliders", "labels": list(W.DIGIT_NAMES), "classes": classes or list(range(10)),
                      "seeds": [0], "shifts": list(W.SHIFTS)},
        "generator": {**entries["generator"], "resolution": M.RESOLUTION, "image_size": M.RESOLUTION,
                      "dtype": "float32", **{k: GENERATION[k] for k in ("steps", "guidance_scale", "negative_prompt",
                                                                        "lora_timestep_threshold")}},
        "classifiers": entries["classifiers"][:1],
        "slider_training": SLIDER_SETTINGS,
    })


def stage_sliders(ctx: Ctx) -> dict[str, Any]:
    from pipeline.train.sliders import train_sliders

    _seed(70)
    cfg = slider_config(ctx)
    summary = train_sliders(cfg, str(ctx.out / "sliders"), runner="local", echo=ctx.log)
    if summary.failed:
        raise RuntimeError(f"slider training failed for {sorted(summary.failed)}: {list(summary.failed.values())[0]}")
    losses = {}
    for path in sorted((ctx.out / "sliders").glob("*/*.json")):
        meta = json.loads(path.read_text())
        losses[f"{meta['shift']}/{meta['class_id']}"] = round(meta["mean_loss_last_10"], 6)
    return {"n_sliders": len(losses), "mean_loss_last_10": losses, "seconds": summary.seconds}


# --------------------------------------------------------------------------- calibration
def filter_spec(ctx: Ctx, thresholds: dict[str, float] | None = None):
    from pipeline.config import FilterSpec

    entries = M.config_entries(str(ctx.out))["filter"]
    return FilterSpec.model_validate({**entries, **({"thresholds": thresholds} if thresholds else {})})


def stage_calibrate(ctx: Ctx) -> dict[str, Any]:
    import numpy as np

    from pipeline.models.detectors import OOCFilter, keep_decision
    from pipeline.schema import SCORE_COLUMNS

    x, y, tr, te = ctx.data
    c = CALIBRATION
    gen = _seed(80)
    flt = OOCFilter(filter_spec(ctx), "cpu")
    # Held-out references: `per_class` test digits per class.
    refs = torch.cat([te[y[te] == k][: c["per_class"]] for k in range(10)])
    strengths = list(c["strengths"])
    in_scores = {s: {k: [] for k in SCORE_COLUMNS} for s in strengths}
    ooc_scores: dict[str, list[float]] = {k: [] for k in SCORE_COLUMNS}
    items, kinds = [], []
    for i in refs.tolist():
        name = W.DIGIT_NAMES[int(y[i])]
        for shift in W.SHIFTS:
            # In-class trajectory: the digit at rising strengths of the shift.
            imgs = [W.apply_shift(x[i : i + 1], shift, s) for s in strengths]
            items.append((W.to_pil(_quantize(torch.cat(imgs))), strengths, name, shift))
            kinds.append("in")
            # Out-of-class, scored against this digit's class prompts and scale-0 image:
            # another class's held-out digit, and a blend in which another digit dominates
            # (weight 0.5..0.9), both under the shift at a random strength.
            others = te[y[te] != y[i]]
            j = int(others[torch.randint(0, len(others), (1,), generator=gen)])
            s = float(torch.rand(1, generator=gen))
            a = c["blend_low"] + (c["blend_high"] - c["blend_low"]) * float(torch.rand(1, generator=gen))
            other = W.apply_shift(x[j : j + 1], shift, s)
            blend = W.apply_shift((1 - a) * x[i : i + 1] + a * x[j : j + 1], shift, s)
            for img in (other, blend):
                items.append((W.to_pil(_quantize(torch.cat([x[i : i + 1], img]))), [0.0, 1.0], name, shift))
                kinds.append("ooc")
    scored = []
    for lo in range(0, len(items), 64):
        scored += flt.score_trajectories(items[lo : lo + 64])
    for kind, sc in zip(kinds, scored):
        if kind == "in":
            for j, s in enumerate(strengths):
                for k in SCORE_COLUMNS:
                    in_scores[s][k].append(sc[k][j])
        else:
            for k in SCORE_COLUMNS:
                ooc_scores[k].append(sc[k][1])
    ooc = {k: np.array(v) for k, v in ooc_scores.items()}

    def thresholds_at(q: float) -> dict[str, float]:
        return {k: float(np.quantile(ooc[k], q)) for k in SCORE_COLUMNS}

    def removed(th) -> float:
        from pipeline.config import Thresholds

        _, kept = keep_decision({k: list(ooc[k]) for k in SCORE_COLUMNS}, Thresholds(**th), 2)
        return 1 - sum(kept) / len(kept)

    # Smallest common quantile whose 2-of-4 rule removes the target share of OOC pairs.
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        if removed(thresholds_at(mid)) >= c["ooc_removed"]:
            hi = mid
        else:
            lo = mid
    q = hi
    # Rounded up, so the rounded thresholds still remove at least the target share.
    th = {k: math.ceil(v * 1e6) / 1e6 for k, v in thresholds_at(q).items()}
    from pipeline.config import Thresholds

    kept_in = {}
    for s in strengths:
        _, kept = keep_decision(in_scores[s], Thresholds(**th), 2)
        kept_in[str(s)] = round(sum(kept) / len(kept), 4)
    record = {"quantile": round(q, 4), "thresholds": th, "ooc_removed": round(removed(th), 4),
              "in_class_kept_by_strength": kept_in,
              "ooc_score_median": {k: round(float(np.median(ooc[k])), 4) for k in SCORE_COLUMNS},
              "in_class_score_median_at_1": {k: round(float(np.median(in_scores[1.0][k])), 4) for k in SCORE_COLUMNS}}
    (ctx.out / "filter_thresholds.json").write_text(json.dumps(th, indent=1) + "\n")
    ctx.log(f"calibrate: {record}")
    return record


# --------------------------------------------------------------------------- evaluation
def stage_evaluate(ctx: Ctx) -> dict[str, Any]:
    """Held-out checks of the generator: classifier accuracy on generated digits, and on
    slider trajectories of every digit (scale 0 vs 2.5) made by the pipeline's own sampler."""
    from pipeline.config import BenchmarkSpec
    from pipeline.models.sampler import create_sampler

    _seed(90)
    record: dict[str, Any] = {
        "generated_accuracy_class_words": generated_accuracy(ctx, use_tokens=False),
        "generated_accuracy_tokens": generated_accuracy(ctx, use_tokens=True),
    }
    cfg = slider_config(ctx)
    bench = BenchmarkSpec(labels=list(W.DIGIT_NAMES), classes=list(range(10)), seeds=[101, 102],
                          shifts=list(W.SHIFTS), scales=[0.0, 2.5])
    sampler = create_sampler(cfg.generator, bench, "cpu", torch.float32)
    images: dict[str, list] = {"0": []}
    images.update({s: [] for s in W.SHIFTS})
    labels = []
    for c in range(10):
        for seed in bench.seeds:
            group = sampler.generate_group(c, seed, list(W.SHIFTS), [0.0, 2.5])
            images["0"].append(group.image(W.SHIFTS[0], 0.0))
            for shift in W.SHIFTS:
                images[shift].append(group.image(shift, 2.5))
            labels.append(c)
    record["slider_accuracy_scale0"] = evaluate_classifiers(ctx, images["0"], labels)
    record["slider_accuracy_scale2.5"] = {s: evaluate_classifiers(ctx, images[s], labels) for s in W.SHIFTS}
    ctx.log(f"evaluate: {record}")
    return record


# --------------------------------------------------------------------------- driver
STAGE_FUNCS: dict[str, Callable[[Ctx], dict[str, Any]]] = {
    "classifiers": stage_classifiers,
    "vae": stage_vae,
    "diffusion": stage_diffusion,
    "tokens": stage_tokens,
    "clip": stage_clip,
    "dino": stage_dino,
    "sliders": stage_sliders,
    "calibrate": stage_calibrate,
    "evaluate": stage_evaluate,
}


def _sizes(out: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for p in sorted(out.rglob("*")):
        if p.is_file() and "_work" not in p.parts:
            top = p.relative_to(out).parts[0]
            sizes[top] = sizes.get(top, 0) + p.stat().st_size
    return sizes


def _run_stages(ctx: Ctx, stages: tuple[str, ...]) -> None:
    for stage in stages:
        if ctx.done(stage):
            ctx.log(f"{stage}: done earlier, skipped")
            continue
        ctx.log(f"{stage}: training")
        wall, cpu = time.perf_counter(), time.process_time()
        record = STAGE_FUNCS[stage](ctx)
        record["seconds"] = round(time.perf_counter() - wall, 1)
        record["cpu_seconds"] = round(time.process_time() - cpu, 1)
        ctx.mark(stage, record)
        ctx.log(f"{stage}: {record['seconds']} s wall, {record['cpu_seconds']} s CPU")


def train_world(out: str | os.PathLike[str], threads: int = 1, stages: tuple[str, ...] = STAGES, jobs: int = 2,
                keep_work: bool = False, finalize: bool = True, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Train every stage of ``stages`` not yet done into ``out``; returns the ``world.json`` record.

    ``jobs=2`` trains :data:`SIDE_STAGES` in a second process (same seeds, same results)
    while this one trains the generator's chain.  Once every stage is done and
    ``finalize`` is set, ``world.json`` is written and ``_work`` removed (unless ``keep_work``).
    """
    import subprocess

    torch.set_num_threads(threads)
    ctx = Ctx(Path(out), threads, echo)
    wall = time.perf_counter()
    todo = [s for s in STAGES if s in stages]
    side = [s for s in SIDE_STAGES if s in todo and not ctx.done(s)]
    proc = None
    if jobs > 1 and side:
        cmd = [sys.executable, "-m", "pipeline.demo.train_world", "--output", str(ctx.out), "--threads", str(threads),
               "--stages", ",".join(side), "--jobs", "1", "--no-finalize"]
        ctx.log(f"side process for {', '.join(side)}")
        proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        todo = [s for s in todo if s not in side]
    try:
        later = [s for s in todo if s in ("calibrate", "evaluate")]
        _run_stages(ctx, tuple(s for s in todo if s not in later))
        if proc is not None:
            if proc.wait() != 0:
                raise RuntimeError(f"the side process ({', '.join(side)}) failed with exit code {proc.returncode}")
            proc = None
        _run_stages(ctx, tuple(later))
    finally:
        if proc is not None:
            proc.terminate()
    records = ctx.records
    if not finalize or not all(ctx.done(s) for s in STAGES):
        return records
    import diffusers
    import open_clip
    import timm
    import transformers

    world = {
        "version": VERSION,
        "labels": list(W.DIGIT_NAMES),
        "shifts": list(W.SHIFTS),
        "resolution": M.RESOLUTION,
        "settings": {"classifiers": CLASSIFIER_SETTINGS, "vae": VAE_SETTINGS, "diffusion": DIFFUSION_SETTINGS,
                     "tokens": TOKEN_SETTINGS, "clip": CLIP_SETTINGS, "dino": DINO_SETTINGS,
                     "sliders": SLIDER_SETTINGS, "generation": GENERATION,
                     "calibration": {**CALIBRATION, "strengths": list(CALIBRATION["strengths"])}},
        "stages": records,
        "stage_seconds_total": round(sum(r.get("seconds", 0) for r in records.values()), 1),
        "cpu_seconds_total": round(sum(r.get("cpu_seconds", 0) for r in records.values()), 1),
        "last_run_wall_seconds": round(time.perf_counter() - wall, 1),
        "threads": threads,
        "jobs": jobs,
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__,
                     "transformers": transformers.__version__, "timm": timm.__version__,
                     "open_clip": open_clip.__version__},
    }
    if not keep_work:
        shutil.rmtree(ctx.work, ignore_errors=True)
    world["sizes_bytes"] = _sizes(ctx.out)
    world["total_bytes"] = sum(world["sizes_bytes"].values())
    (ctx.out / "world.json").write_text(json.dumps(world, indent=1) + "\n")
    ctx.log(f"done: {world['cpu_seconds_total']} s CPU, {world['last_run_wall_seconds']} s wall (this run), "
            f"{world['total_bytes'] / 1e6:.1f} MB in {ctx.out}")
    return world


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.demo.train_world", description=__doc__.splitlines()[0])
    p.add_argument("--output", default="assets/world", help="directory to write the world into")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process (default 1)")
    p.add_argument("--jobs", type=int, default=2, choices=(1, 2),
                   help="2: train classifiers, CLIP and DINO in a second process meanwhile (default)")
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    p.add_argument("--keep-work", action="store_true", help="keep {output}/_work (intermediate files) at the end")
    p.add_argument("--no-finalize", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--force", action="store_true", help="delete the output directory first and train from scratch")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    out = Path(args.output)
    stages = tuple(s.strip() for s in args.stages.split(",") if s.strip())
    bad = [s for s in stages if s not in STAGES]
    if bad:
        print(f"unknown stages {bad}; choose from {list(STAGES)}", file=sys.stderr)
        return 2
    if args.force and out.exists():
        shutil.rmtree(out)
    if (out / "world.json").is_file() and not (out / "_work").exists():
        print(f"[train-world] {out} already holds a trained world (world.json); --force retrains it")
        return 0
    train_world(out, args.threads, stages, args.jobs, args.keep_work, finalize=not args.no_finalize)
    return 0


if __name__ == "__main__":
    sys.exit(main())
