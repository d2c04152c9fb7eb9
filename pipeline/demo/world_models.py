"""Architectures of the miniature world and the config entries that load them.

Every component is a real architecture of the real path at a small size, built from a
config here and loaded back by the pipeline's own loading code:

* the text-to-image model: diffusers ``AutoencoderKL`` (32 px -> 4x8x8 latent),
  ``UNet2DConditionModel`` (SD2-style: cross-attention at both levels,
  ``use_linear_projection=True``), ``CLIPTextModel`` with the real CLIP tokenizer, and the
  SD2 v-prediction DDIM scheduler -- one ``StableDiffusionPipeline`` directory;
* the filter's CLIP: an open_clip ``CLIP`` from a custom JSON architecture
  (:data:`CLIP_CFG`), and its DINOv2 stand-in: timm ``vit_small_patch14_reg4_dinov2``
  with :data:`DINO_KWARGS`;
* the classifiers: a linear model saved as TorchScript (classifier kind ``torchscript``),
  a small ResNet and a small ViT (kind ``timm``), and zero-shot open_clip on the world's
  CLIP (kind ``open_clip_zeroshot``).

:func:`config_entries` returns the YAML-able config entries (relative to an assets root)
that ``configs/demo.yaml`` uses; a test checks the two agree.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pipeline.demo.tiny_sd import TINY_TEXT, TINY_UNET, sd_text_encoder, sd_vae

# --------------------------------------------------------------------------- diffusion
RESOLUTION = 32  # generated size in pixels
LATENT = 8  # latent side (VAE factor 4)

# The tiny SD2's UNet widths and text encoder (pipeline.demo.tiny_sd), cross-attention in both blocks.
UNET_CFG: dict[str, Any] = dict(
    sample_size=LATENT,
    in_channels=4,
    out_channels=4,
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    **TINY_UNET,
)

VAE_ARCH: dict[str, Any] = dict(block_out_channels=(16, 32, 32), layers_per_block=1, norm_num_groups=8, sample_size=RESOLUTION)

TEXT_CFG: dict[str, Any] = dict(TINY_TEXT)


def make_unet():
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(**UNET_CFG)


def make_vae():
    return sd_vae(VAE_ARCH)


def make_text_encoder(tokenizer):
    return sd_text_encoder(tokenizer, TEXT_CFG)


# --------------------------------------------------------------------------- filter models
CLIP_NAME = "world-clip"
CLIP_CFG: dict[str, Any] = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 3, "width": 64, "head_width": 32, "patch_size": 4},
    # The real 49,408-token BPE vocabulary (open_clip's tokenizer emits those ids).
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}

DINO_MODEL = "vit_small_patch14_reg4_dinov2.lvd142m"
DINO_KWARGS: dict[str, Any] = {
    "img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 3, "num_heads": 4, "init_values": 1.0,
}
# timm data config of the small models: 32 px, no crop margin, grey-friendly mean/std.
TIMM_OVERLAY: dict[str, Any] = {
    "input_size": [3, 32, 32], "crop_pct": 1.0, "interpolation": "bilinear", "mean": [0.5] * 3, "std": [0.5] * 3,
}


def make_clip():
    import open_clip

    return open_clip.CLIP(**CLIP_CFG)


def make_dino():
    import timm

    return timm.create_model(DINO_MODEL, pretrained=False, num_classes=0, **DINO_KWARGS)


# --------------------------------------------------------------------------- classifiers
CNN_MODEL = "resnet10t.c3_in1k"
CNN_KWARGS: dict[str, Any] = {"stem_width": 16, "channels": [16, 32, 64, 128], "num_classes": 10}
VIT_MODEL = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
VIT_KWARGS: dict[str, Any] = {"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 4, "num_heads": 4, "num_classes": 10}


def make_timm_classifier(kind: str):
    import timm

    model, kwargs = {"cnn": (CNN_MODEL, CNN_KWARGS), "vit": (VIT_MODEL, VIT_KWARGS)}[kind]
    return timm.create_model(model, pretrained=False, **kwargs)


class LinearDigits(nn.Module):
    """Softmax regression on the grey pixels: logits = W @ mean_over_RGB(x).flatten() + b.

    Takes the normalised ``[N, 3, 32, 32]`` tensor the ``torchscript`` classifier kind
    feeds it (mean/std 0.5).
    """

    def __init__(self, pixels: int = RESOLUTION * RESOLUTION, classes: int = 10) -> None:
        super().__init__()
        self.fc = nn.Linear(pixels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean(dim=1).flatten(1))


# --------------------------------------------------------------------------- config entries
def config_entries(root: str = "../assets/world") -> dict[str, Any]:
    """Config entries (generator paths, filter models, classifiers) for assets under ``root``."""
    r = root.rstrip("/")
    overlay = dict(TIMM_OVERLAY)
    return {
        "generator": {
            "model": f"{r}/sd",
            "class_tokens": {"kind": "ti_folder", "path": f"{r}/tokens"},
            "slider_store": f"{r}/sliders",
            "slider_pattern": "{shift}/{class_id:03d}.safetensors",
        },
        "filter": {
            "clip": {"model": CLIP_NAME, "pretrained": f"{r}/clip/{CLIP_NAME}.pt",
                     "model_config_file": f"{r}/clip/{CLIP_NAME}.json"},
            "dino": {"model": DINO_MODEL, "checkpoint": f"{r}/dino/dino.pth",
                     "model_kwargs": {**DINO_KWARGS, "pretrained_cfg_overlay": overlay}},
        },
        "classifiers": [
            {"name": "linear", "kind": "torchscript", "model": "linear-softmax-regression",
             "checkpoint": f"{r}/classifiers/linear.torchscript.pt"},
            {"name": "cnn", "kind": "timm", "model": CNN_MODEL, "checkpoint": f"{r}/classifiers/cnn.pth",
             "model_kwargs": {**CNN_KWARGS, "pretrained_cfg_overlay": overlay}},
            {"name": "vit", "kind": "timm", "model": VIT_MODEL, "checkpoint": f"{r}/classifiers/vit.pth",
             "model_kwargs": {**VIT_KWARGS, "pretrained_cfg_overlay": overlay}},
            {"name": "clip-zs", "kind": "open_clip_zeroshot", "model": CLIP_NAME,
             "checkpoint": f"{r}/clip/{CLIP_NAME}.pt", "model_config_file": f"{r}/clip/{CLIP_NAME}.json",
             "templates": ["a photo of a {c}"]},
        ],
    }
