"""Builds the files ``configs/tiny.yaml`` points at, under ``assets/tiny/`` (not in git).

Everything is random-weight and seeded, made from configs through the same loading code a
real build uses: a diffusers SD2-architecture model directory, textual-inversion class
tokens in the Dataset-Interfaces ``{i}.bin`` layout, one non-zero LoRA slider per
(class, shift) in the published ``lora_unet_*`` layout, a tiny open_clip model and a tiny
DINOv2-architecture ViT for the filter, and three classifiers (two timm, one open_clip
zero-shot).  The curves of such a world are noise; they exercise the machinery.

The commands that take a config (``validate``, ``build``, ``evaluate``, ``train-sliders``,
...) call :func:`ensure_config_assets` after loading it, so a config that points into
``assets/tiny/`` finds its files on a fresh clone; the tests call :func:`ensure_tiny_assets`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from pipeline.runtime.checkout import REPO_ROOT
from pipeline.io.nested import iter_strings

if TYPE_CHECKING:
    from pipeline.config import BuildConfig

TINY_ROOT = REPO_ROOT / "assets" / "tiny"
VERSION = "2"  # bump when the builder changes so stale assets are rebuilt
CLASSES = (1, 22)
SHIFTS = ("painting_style", "heavy_snow")


def ensure_config_assets(cfg: "BuildConfig", echo: Callable[[str], None] = print) -> None:
    """Build the tiny assets when a path of ``cfg`` lies under :data:`TINY_ROOT` (on first use)."""
    root = os.path.normpath(TINY_ROOT)
    paths = (os.path.normpath(s) for s in iter_strings(cfg.model_dump(mode="json")))
    if any(p == root or p.startswith(root + os.sep) for p in paths):
        ensure_tiny_assets(Path(root), echo)


def ensure_tiny_assets(root: Path = TINY_ROOT, echo=print) -> Path:
    """Build the tiny assets into ``root`` unless an up-to-date build is already there.

    Safe to call from several processes at once (parallel test workers, two commands):
    one builds under a lock file beside ``root``, the others wait and find the build.
    """
    stamp = root / "VERSION"
    if stamp.is_file() and stamp.read_text().strip() == VERSION:
        return root
    from filelock import FileLock  # portable (fcntl is POSIX-only)

    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(root.parent / f".{root.name}.lock"):
        if stamp.is_file() and stamp.read_text().strip() == VERSION:
            return root  # built by another process while this one waited
        return _build_tiny_assets(root, stamp, echo)


def _build_tiny_assets(root: Path, stamp: Path, echo) -> Path:
    echo(f"[cnsbench] building the tiny random-weight assets in {root} (once)")
    import torch
    from diffusers import UNet2DConditionModel

    from pipeline.demo import tiny_eval_models as tiny
    from pipeline.demo.tiny_sd import build_sd2
    from pipeline.labels import label_space
    from pipeline.models.diffusion import ti_token
    from pipeline.models.lora import random_slider, save_slider_file

    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    build_sd2(root / "sd2-tiny", size="tiny", seed=0)

    names = label_space("imagenet")
    tokens = root / "tokens"
    tokens.mkdir()
    gen = torch.Generator().manual_seed(1)
    for c in CLASSES:
        torch.save({ti_token(c, names.name(c)): torch.randn(32, generator=gen)}, tokens / f"{c}.bin")

    unet = UNet2DConditionModel.from_pretrained(root / "sd2-tiny", subfolder="unet")
    for i, shift in enumerate(SHIFTS):
        for c in CLASSES:
            state = random_slider(unet, seed=1000 * (i + 1) + c, std=0.3)
            save_slider_file(state, str(root / "sliders" / shift / f"{c:03d}.safetensors"))

    specs = {
        "clip": tiny.make_tiny_clip(root / "clip"),
        "dino": tiny.make_tiny_dino(root / "dino"),
        "resnet": tiny.make_tiny_timm_classifier(root / "classifiers", "resnet"),
        "vit": tiny.make_tiny_timm_classifier(root / "classifiers", "vit"),
        # 224 px: the classifiers of configs/tiny.yaml see the CNS protocol's 224 px crops.
        "clip_zs": tiny.make_tiny_clip_zeroshot(root / "clip-zs", image_size=224),
    }
    (root / "specs.json").write_text(json.dumps(specs, indent=1))
    stamp.write_text(VERSION)
    return root
