"""A model's own eval transform, read from its configuration without loading weights.

``preprocess: model`` means "the transform the model's library gives it": timm's data
config, open_clip's preprocess.  A released benchmark's protocol (:mod:`pipeline.sources.release_protocol`)
records that transform in ``config.json`` as explicit numbers, so an output states what
every classifier was fed; these functions compute them the way the libraries do and
return None where the transform is not a plain resize / center-crop / normalise (then
the choice stays ``model``).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from pipeline.config.protocol import INTERPOLATIONS, Preprocess


def timm_own_preprocess(model: str, model_kwargs: dict[str, Any]) -> Preprocess | None:
    """timm's eval transform of ``model`` (with ``model_kwargs``, ``pretrained_cfg_overlay``
    included), from a copy built on the meta device: ``Resize(floor(size / crop_pct))``,
    ``CenterCrop(size)`` for a square input and crop mode ``center``."""
    import timm
    import torch
    from timm.data import resolve_data_config

    kwargs = dict(model_kwargs)
    overlay = dict(kwargs.pop("pretrained_cfg_overlay", None) or {})
    for key in ("input_size", "test_input_size", "mean", "std"):
        if isinstance(overlay.get(key), list):
            overlay[key] = tuple(overlay[key])
    try:
        with torch.device("meta"):
            net = timm.create_model(model, pretrained=False, pretrained_cfg_overlay=overlay or None, **kwargs)
    except Exception:  # an architecture timm cannot build here: the classifier stage will say why
        return None
    cfg = resolve_data_config({}, model=net)
    _, height, width = cfg["input_size"]
    if height != width or cfg.get("crop_mode", "center") != "center" or cfg["interpolation"] not in INTERPOLATIONS:
        return None
    crop_pct = cfg.get("crop_pct") or 0.875
    return Preprocess(
        math.floor(height / crop_pct), int(height), str(cfg["interpolation"]),
        tuple(float(v) for v in cfg["mean"]), tuple(float(v) for v in cfg["std"]),
    )


def open_clip_own_preprocess(model: str, pretrained: str | None, model_config_file: str | None) -> Preprocess | None:
    """open_clip's eval transform of ``model``: ``Resize(size)`` (resize mode ``shortest``),
    ``CenterCrop(size)``, the preprocess config's mean/std, as ``create_model_and_transforms``
    resolves it (defaults, the model config's ``preprocess_cfg``, the pretrained tag's)."""
    import os

    import open_clip
    from open_clip.transform import PreprocessCfg, merge_preprocess_dict

    from pipeline.models.detectors import register_open_clip_config

    if model_config_file:
        register_open_clip_config(model_config_file, model, "model_config_file")
    arch = open_clip.get_model_config(model)
    if not arch:
        return None
    cfg = merge_preprocess_dict(asdict(PreprocessCfg()), arch.get("preprocess_cfg", {}))
    if pretrained and not os.path.isfile(pretrained):
        cfg = merge_preprocess_dict(cfg, open_clip.get_pretrained_cfg(model, pretrained) or {})
    size = arch.get("vision_cfg", {}).get("image_size", cfg["size"])
    if isinstance(size, (list, tuple)):
        if len(set(size)) != 1:
            return None
        size = size[0]
    if cfg.get("resize_mode", "shortest") != "shortest" or cfg["interpolation"] not in INTERPOLATIONS:
        return None
    return Preprocess(
        int(size), int(size), str(cfg["interpolation"]),
        tuple(float(v) for v in cfg["mean"]), tuple(float(v) for v in cfg["std"]),
    )
