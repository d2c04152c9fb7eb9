"""Tiny random-weight evaluation models written to local files (filter and classifiers).

Each ``make_*`` function builds a real open_clip / timm architecture at a tiny size with
fixed seeds, saves its weights and returns the config dict that loads it back through the
same code path as real weights (``open_clip.add_model_config`` + a weights file; timm's
``pretrained_cfg_overlay=dict(file=...)``).  The models are fast on CPU and each file is
under 2 MB.  Scores they produce are meaningless; they exist so the demo and the tests
exercise loading, preprocessing and batching offline.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from pipeline.errors import CnsbenchError

TINY_CLIP_NAME = "tiny-clip-demo"

# open_clip architecture.  The text tower keeps the real 49408-token BPE vocabulary (the
# tokenizer that ships with open_clip emits those ids); its width is 16 so the token
# embedding, the bulk of the weights, stays ~1.6 MB in float16.
TINY_CLIP_CFG: dict[str, Any] = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 2},
}

TINY_DINO = {
    "model": "vit_small_patch14_reg4_dinov2.lvd142m",
    "model_kwargs": {"img_size": 28, "patch_size": 14, "embed_dim": 32, "depth": 2, "num_heads": 2, "init_values": 1.0},
    "input_size": [3, 28, 28],
}

# Tiny timm classifiers: (model name with a real tag, create_model kwargs, input size).
TINY_CLASSIFIERS: dict[str, tuple[str, dict[str, Any], list[int]]] = {
    "resnet": ("resnet10t.c3_in1k", {"stem_width": 8, "channels": [8, 16, 32, 64]}, [3, 32, 32]),
    "vit": (
        "vit_tiny_patch16_224.augreg_in21k_ft_in1k",
        {"img_size": 32, "embed_dim": 32, "depth": 2, "num_heads": 2},
        [3, 32, 32],
    ),
}


def make_tiny_clip(
    out_dir: str | os.PathLike[str], seed: int = 0, name: str = TINY_CLIP_NAME, vision: dict[str, Any] | None = None
) -> dict[str, str]:
    """Write ``{name}.json`` (open_clip architecture) and ``{name}.pt`` (fp16 state_dict).

    ``vision`` overrides entries of the vision tower's config (e.g. ``image_size``).

    Returns a :class:`pipeline.config.ClipModelSpec`-compatible dict
    ``{"model", "pretrained", "model_config_file"}``; the model name is the JSON's stem,
    which is the name open_clip registers it under.
    """
    import open_clip

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / f"{name}.json"
    weights = out / f"{name}.pt"
    arch = {**TINY_CLIP_CFG, "vision_cfg": {**TINY_CLIP_CFG["vision_cfg"], **(vision or {})}}
    cfg_path.write_text(json.dumps(arch, indent=2))
    # fork_rng: building a demo model must not perturb the caller's random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = open_clip.CLIP(**arch)
        # float16 halves the file; loading copies it into the float32 model.
        state = {k: v.detach().to(torch.float16) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    torch.save(state, weights)
    return {"model": name, "pretrained": str(weights), "model_config_file": str(cfg_path)}


def _timm_tiny(
    out_dir: Path, filename: str, model: str, kwargs: dict[str, Any], input_size: list[int], seed: int, **forced: Any
) -> dict[str, Any]:
    import timm

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / filename
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = timm.create_model(model, pretrained=False, **{**kwargs, **forced})
        state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    torch.save(state, path)
    # The overlay tells timm's data config the tiny input size; without it preprocessing
    # would resize to the real model's 224/518 px and a fixed-size ViT would reject it.
    overlay: dict[str, Any] = {"input_size": list(input_size)}
    if "num_classes" in kwargs:
        overlay["num_classes"] = kwargs["num_classes"]
    # preprocess 'model': a toy of 28-32 px takes its own input size, not the CNS protocol's
    # 224 px (classifiers) or 518 px (DINOv2) crops.
    return {
        "model": model,
        "checkpoint": str(path),
        "model_kwargs": {**kwargs, "pretrained_cfg_overlay": overlay},
        "preprocess": "model",
    }


def make_tiny_dino(out_dir: str | os.PathLike[str], seed: int = 1) -> dict[str, Any]:
    """A tiny DINOv2-with-registers ViT (28 px, patch 14, width 32, depth 2).

    Returns a :class:`pipeline.config.DinoModelSpec`-compatible dict
    ``{"model", "checkpoint", "model_kwargs"}``.
    """
    return _timm_tiny(
        Path(out_dir), "tiny_dino.pth", TINY_DINO["model"], dict(TINY_DINO["model_kwargs"]),
        TINY_DINO["input_size"], seed, num_classes=0,
    )


def make_tiny_timm_classifier(
    out_dir: str | os.PathLike[str], arch: str = "resnet", name: str | None = None, seed: int = 2, **kwargs: Any
) -> dict[str, Any]:
    """A tiny timm classifier of kind ``arch`` (``"resnet"`` or ``"vit"``) with 1000 outputs.

    ``kwargs`` override the tiny create_model kwargs (e.g. ``num_classes=10`` together
    with a ``label_map``).  Returns a :class:`pipeline.config.ClassifierSpec`-compatible
    dict ``{"name", "kind", "model", "checkpoint", "model_kwargs"}``.
    """
    if arch not in TINY_CLASSIFIERS:
        raise CnsbenchError(f"unknown tiny classifier arch {arch!r}; choose from {sorted(TINY_CLASSIFIERS)}")
    model, base, input_size = TINY_CLASSIFIERS[arch]
    spec = _timm_tiny(
        Path(out_dir), f"tiny_{arch}_{seed}.pth", model, {**base, **kwargs}, input_size, seed
    )
    return {"name": name or f"tiny-{arch}", "kind": "timm", **spec}


def make_tiny_clip_zeroshot(
    out_dir: str | os.PathLike[str],
    name: str = "tiny-clip-zs",
    templates: str | list[str] = "simple",
    seed: int = 3,
    image_size: int | None = None,
) -> dict[str, Any]:
    """A zero-shot open_clip classifier spec on a tiny CLIP (see :func:`make_tiny_clip`).

    ``image_size`` (with a 4x4 patch grid) sizes the vision tower for that input, e.g. 224
    for the CNS-Bench classifier transform (Resize 256, CenterCrop 224).
    """
    vision = {"image_size": image_size, "patch_size": image_size // 4} if image_size else None
    clip = make_tiny_clip(out_dir, seed=seed, name=f"tiny-clip-zs-{seed}", vision=vision)
    return {
        "name": name,
        "kind": "open_clip_zeroshot",
        "model": clip["model"],
        "checkpoint": clip["pretrained"],
        "model_config_file": clip["model_config_file"],
        "templates": templates,
        "preprocess": "cns" if image_size == 224 else "model",
    }
