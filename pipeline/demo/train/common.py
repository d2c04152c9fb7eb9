"""Shared by the world's training stages: settings, the run context (output, work directory, data, done-markers) and small tensor helpers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from pipeline.demo import world_data as W
from pipeline.io.files import write_text_atomic
from pipeline.io.safejson import dumps as strict_dumps

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
        write_text_atomic(str(self.work / f"{stage}.json"), strict_dumps(record, indent=1))

    @property
    def records(self) -> dict[str, Any]:
        return {s: json.loads((self.work / f"{s}.json").read_text()) for s in STAGES if self.done(s)}


def seeded(seed: int) -> torch.Generator:
    """Seed torch's global generator and return a fresh generator seeded alike (each stage starts from its own seed)."""
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def quantize(x: torch.Tensor) -> torch.Tensor:
    """[0, 1] -> the 8-bit levels a PNG holds (what the pipeline's models see)."""
    return (x.clamp(0, 1) * 255).round() / 255


def cosine_lr(step: int, total: int, warmup: int = 0, floor: float = 0.1) -> float:
    """The learning-rate factor at ``step``: linear warm-up, then a cosine decay to ``floor``."""
    if step < warmup:
        return (step + 1) / warmup
    p = (step - warmup) / max(1, total - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, p)))


def translate(x: torch.Tensor, gen: torch.Generator, max_px: int = 2) -> torch.Tensor:
    """Random integer translations of up to ``max_px`` (zero fill)."""
    n, _, h, w = x.shape
    pad = F.pad(x, (max_px,) * 4)
    dy = torch.randint(0, 2 * max_px + 1, (n,), generator=gen)
    dx = torch.randint(0, 2 * max_px + 1, (n,), generator=gen)
    return torch.stack([pad[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(n)])


def descend(opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    """One optimiser step down ``loss``'s gradient."""
    opt.zero_grad()
    loss.backward()
    opt.step()


def half_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the module's state with its floating-point tensors in float16 (the shipped weights)."""
    return {k: (v.detach().half() if v.is_floating_point() else v.detach()).clone() for k, v in module.state_dict().items()}


