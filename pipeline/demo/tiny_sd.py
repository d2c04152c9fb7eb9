"""Stable-Diffusion-2-shaped text-to-image models built from configs and saved locally.

``build_sd2(dir, size="tiny")`` writes a diffusers model directory (UNet, VAE, CLIP text
encoder, a real CLIP tokenizer, the SD2 v-prediction DDIM scheduler) with random
weights; ``size="full"`` uses the real SD2 architecture (for GPU timing with random
weights).  The tokenizer's vocabulary and merges come from the BPE file that ships
inside ``open_clip_torch``, so prompts tokenize exactly as with the real model.
The directory is loaded by the same ``from_pretrained`` call as the real checkpoint.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

SD2_SCHEDULER = dict(
    num_train_timesteps=1000,
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    clip_sample=False,
    set_alpha_to_one=False,
    steps_offset=1,
    prediction_type="v_prediction",
)

# The demo's small UNet widths and text encoder, shared by the random-weight tiny SD2 below and
# the world's trained diffusion model (pipeline.demo.world_models), which differ in their block types.
TINY_UNET: dict[str, Any] = dict(
    block_out_channels=(32, 64),
    layers_per_block=1,
    attention_head_dim=(2, 4),
    cross_attention_dim=32,
    norm_num_groups=8,
    use_linear_projection=True,
)
TINY_TEXT: dict[str, Any] = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, projection_dim=32
)

ARCH = {
    "tiny": dict(
        unet=dict(
            sample_size=8,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            **TINY_UNET,
        ),
        vae=dict(
            block_out_channels=(8, 16, 16, 16),
            layers_per_block=1,
            norm_num_groups=8,
            sample_size=64,
        ),
        text=dict(TINY_TEXT),
    ),
    "full": dict(
        unet=dict(
            sample_size=96,
            block_out_channels=(320, 640, 1280, 1280),
            layers_per_block=2,
            down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
            up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
            attention_head_dim=(5, 10, 20, 20),
            cross_attention_dim=1024,
            norm_num_groups=32,
            use_linear_projection=True,
        ),
        vae=dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2, norm_num_groups=32, sample_size=768),
        text=dict(
            hidden_size=1024, intermediate_size=4096, num_hidden_layers=23, num_attention_heads=16, projection_dim=512
        ),
    ),
}


def sd_vae(vae_arch: dict[str, Any]):
    """An SD-shaped ``AutoencoderKL`` (RGB, 4 latent channels) of ``vae_arch``'s widths and depth."""
    from diffusers import AutoencoderKL

    n = len(vae_arch["block_out_channels"])
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        down_block_types=("DownEncoderBlock2D",) * n,
        up_block_types=("UpDecoderBlock2D",) * n,
        **vae_arch,
    )


def sd_text_encoder(tokenizer, text_arch: dict[str, Any]):
    """A CLIP text encoder of ``text_arch``'s size for ``tokenizer``'s vocabulary (77 positions, gelu)."""
    from transformers import CLIPTextConfig, CLIPTextModel

    return CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            max_position_embeddings=77,
            hidden_act="gelu",
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **text_arch,
        )
    )


def _bytes_to_unicode() -> dict[int, str]:
    # CLIP's reversible byte <-> unicode mapping (printable bytes map to themselves).
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def write_clip_tokenizer(out_dir: str | os.PathLike[str], pad_token: str = "!") -> Path:
    """A Hugging Face ``CLIPTokenizer`` directory from open_clip's BPE file (49,408 tokens)."""
    import importlib.util

    spec = importlib.util.find_spec("open_clip")
    bpe = Path(next(iter(spec.submodule_search_locations))) / "bpe_simple_vocab_16e6.txt.gz"
    merges = gzip.open(bpe).read().decode("utf-8").split("\n")
    merges = merges[1 : 49152 - 256 - 2 + 1]
    pairs = [tuple(m.split()) for m in merges]
    vocab = list(_bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab]
    vocab += ["".join(p) for p in pairs]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.json").write_text(json.dumps({tok: i for i, tok in enumerate(vocab)}, ensure_ascii=False))
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(p) for p in pairs) + "\n")
    from transformers import CLIPTokenizer

    tok = CLIPTokenizer(str(out / "vocab.json"), str(out / "merges.txt"), pad_token=pad_token, model_max_length=77)
    tok.save_pretrained(out)
    return out


def build_sd2(out_dir: str | os.PathLike[str], size: str = "tiny", seed: int = 0) -> Path:
    """Write a random-weight SD2-architecture diffusers pipeline to ``out_dir``."""
    import torch
    from diffusers import DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTokenizer

    arch = ARCH[size]
    torch.manual_seed(seed)
    out = Path(out_dir)
    tok_dir = write_clip_tokenizer(out / "_tokenizer_build")
    tokenizer = CLIPTokenizer.from_pretrained(tok_dir)
    unet = UNet2DConditionModel(in_channels=4, out_channels=4, **arch["unet"])
    vae = sd_vae(arch["vae"])
    text_encoder = sd_text_encoder(tokenizer, arch["text"])
    pipe = StableDiffusionPipeline(
        unet=unet,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler=DDIMScheduler(**SD2_SCHEDULER),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(out, safe_serialization=True)
    import shutil

    shutil.rmtree(tok_dir, ignore_errors=True)
    return out
