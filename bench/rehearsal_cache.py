"""Random-weight models with the real architectures, in the real file layouts, for a rehearsal.

:func:`make_cache` writes everything a config names into a cache root ``DIR``:

* ``DIR/hub``: a Hugging Face hub cache (:mod:`rehearsal_hub`) with the SD2 diffusers
  repository, every timm model (``timm/<name>``: ``config.json`` + ``model.safetensors``)
  and the open_clip ``openai`` models (``timm/<arch>_clip_<size>.openai``:
  ``open_clip_config.json`` + ``open_clip_model.safetensors``, float16 as OpenAI released them);
* ``DIR/cns/imagenet_star``: the CNS release's ImageNet* text encoder (``tokens.pt``,
  ``tokenizer/``, ``text_encoder/``);
* ``DIR/cns/sliders``: one slider per (shift, class) in the original trainer's layout
  (``generator.slider_pattern``; ``.pt``, bfloat16 as it saves them), on the module names
  of the SD2 UNet that the original ``LoRANetwork`` enumerates (c3lier + noxattn, rank 4).

Models are built one at a time (random init or timm/diffusers defaults), saved, and freed
before the next.  ``width="small"`` shrinks the SD2 channels (same blocks, same module
names) for the test suite; every other model keeps its real size.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import zlib
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rehearsal_hub import is_published, publish  # noqa: E402

SD2 = "stabilityai/stable-diffusion-2"

# The published SD2 (768-v) component configs, as in the hub repository.
SD2_TEXT_CONFIG = dict(
    architectures=["CLIPTextModel"], attention_dropout=0.0, bos_token_id=0, dropout=0.0, eos_token_id=2,
    hidden_act="gelu", hidden_size=1024, initializer_factor=1.0, initializer_range=0.02, intermediate_size=4096,
    layer_norm_eps=1e-05, max_position_embeddings=77, model_type="clip_text_model", num_attention_heads=16,
    num_hidden_layers=23, pad_token_id=1, projection_dim=512, vocab_size=49408,
)
SD2_UNET = dict(
    act_fn="silu", attention_head_dim=[5, 10, 20, 20], block_out_channels=[320, 640, 1280, 1280],
    center_input_sample=False, cross_attention_dim=1024,
    down_block_types=["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    downsample_padding=1, dual_cross_attention=False, flip_sin_to_cos=True, freq_shift=0, in_channels=4,
    layers_per_block=2, mid_block_scale_factor=1, norm_eps=1e-05, norm_num_groups=32, out_channels=4,
    sample_size=96, up_block_types=["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    use_linear_projection=True,
)
SD2_VAE = dict(
    act_fn="silu", block_out_channels=[128, 256, 512, 512],
    down_block_types=["DownEncoderBlock2D"] * 4, in_channels=3, latent_channels=4, layers_per_block=2,
    norm_num_groups=32, out_channels=3, sample_size=768, up_block_types=["UpDecoderBlock2D"] * 4,
)
SD2_SCHEDULER = {
    "_class_name": "DDIMScheduler", "beta_end": 0.012, "beta_schedule": "scaled_linear", "beta_start": 0.00085,
    "clip_sample": False, "num_train_timesteps": 1000, "prediction_type": "v_prediction", "set_alpha_to_one": False,
    "skip_prk_steps": True, "steps_offset": 1, "trained_betas": None,
}
SD2_MODEL_INDEX = {
    "_class_name": "StableDiffusionPipeline", "_diffusers_version": "0.8.0",
    "feature_extractor": ["transformers", "CLIPImageProcessor"], "requires_safety_checker": False,
    "safety_checker": [None, None], "scheduler": ["diffusers", "DDIMScheduler"],
    "text_encoder": ["transformers", "CLIPTextModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
    "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"],
}
SD2_FEATURE_EXTRACTOR = {
    "crop_size": 224, "do_center_crop": True, "do_convert_rgb": True, "do_normalize": True, "do_resize": True,
    "feature_extractor_type": "CLIPFeatureExtractor", "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3, "size": 224,
}
SD2_TOKENIZER_CONFIG = {
    "add_prefix_space": False, "bos_token": "<|startoftext|>", "do_lower_case": True, "eos_token": "<|endoftext|>",
    "errors": "replace", "model_max_length": 77, "name_or_path": "openai/clip-vit-large-patch14", "pad_token": "!",
    "tokenizer_class": "CLIPTokenizer", "unk_token": "<|endoftext|>",
}
SD2_SPECIAL_TOKENS = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "!",
                      "unk_token": "<|endoftext|>"}

# Same blocks, attention layout and module names as SD2, narrow channels (test suite).
SMALL = dict(
    unet=dict(block_out_channels=[32, 64, 128, 128], attention_head_dim=[2, 4, 8, 8], cross_attention_dim=64,
              sample_size=16),
    vae=dict(block_out_channels=[16, 32, 32, 32], norm_num_groups=8, sample_size=128),
    text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, projection_dim=64),
)

# The original trainer's module sets (generation/trainscripts/textsliders/lora.py): attention
# plus the "c3lier" convolution blocks; noxattn skips cross-attention and the time embedding.
SLIDER_PARENTS = ("Attention", "ResnetBlock2D", "Downsample2D", "Upsample2D", "DownBlock2D", "UpBlock2D")
SLIDER_LAYERS = ("Linear", "Conv2d", "LoRACompatibleLinear", "LoRACompatibleConv")

Log = Callable[[str], None]


def _free() -> None:
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def _staging(root: Path, name: str) -> Path:
    path = root / ".staging" / name.replace("/", "--")
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _save_safetensors(state: dict[str, Any], path: Path, dtype=None) -> int:
    """Save a state dict (optionally cast), tensors made contiguous and unshared; returns its parameters."""
    from safetensors.torch import save_file

    out = {}
    for k, v in state.items():
        t = v.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out[k] = t.contiguous().clone() if t.data_ptr() in {o.data_ptr() for o in out.values()} else t.contiguous()
    save_file(out, str(path), metadata={"format": "pt"})
    return sum(t.numel() for t in out.values())


# --------------------------------------------------------------------------- SD2
def _unet_config(width: str) -> dict[str, Any]:
    cfg = dict(SD2_UNET)
    if width == "small":
        cfg.update(SMALL["unet"])
    return cfg


def _text_config(width: str) -> dict[str, Any]:
    cfg = dict(SD2_TEXT_CONFIG)
    if width == "small":
        cfg.update(SMALL["text"])
    return cfg


def _write_tokenizer(out: Path) -> None:
    """SD2's four tokenizer files, the vocabulary and merges from open_clip's BPE file."""
    from pipeline.demo.tiny_sd import write_clip_tokenizer

    tmp = write_clip_tokenizer(out.parent / "_bpe")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.move(str(tmp / name), out / name)
    shutil.rmtree(tmp)
    (out / "tokenizer_config.json").write_text(json.dumps(SD2_TOKENIZER_CONFIG, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(SD2_SPECIAL_TOKENS, indent=2))


def write_sd2(root: Path, width: str, log: Log) -> None:
    """The diffusers repository of ``stabilityai/stable-diffusion-2``, one component at a time."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    files = ["model_index.json", "unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors",
             "text_encoder/model.safetensors", "tokenizer/vocab.json", "scheduler/scheduler_config.json"]
    if is_published(root, SD2, files):
        log(f"{SD2}: cached")
        return
    stage = _staging(root, SD2)
    (stage / "model_index.json").write_text(json.dumps(SD2_MODEL_INDEX, indent=2))
    (stage / "scheduler").mkdir()
    (stage / "scheduler" / "scheduler_config.json").write_text(json.dumps(SD2_SCHEDULER, indent=2))
    (stage / "feature_extractor").mkdir()
    (stage / "feature_extractor" / "preprocessor_config.json").write_text(json.dumps(SD2_FEATURE_EXTRACTOR, indent=2))
    _write_tokenizer(stage / "tokenizer")
    torch.manual_seed(0)
    unet = UNet2DConditionModel(**_unet_config(width))
    unet.save_pretrained(stage / "unet", safe_serialization=True)
    log(f"{SD2}: unet {sum(p.numel() for p in unet.parameters()) / 1e6:.0f} M parameters")
    del unet
    _free()
    vae_cfg = dict(SD2_VAE, **(SMALL["vae"] if width == "small" else {}))
    vae = AutoencoderKL(**vae_cfg)
    vae.save_pretrained(stage / "vae", safe_serialization=True)
    del vae
    _free()
    text = CLIPTextModel(CLIPTextConfig(**_text_config(width)))
    text.save_pretrained(stage / "text_encoder")
    del text
    _free()
    publish(root, SD2, stage)
    log(f"{SD2}: written")


def write_imagenet_star(root: Path, out: Path, class_names: list[str], width: str, log: Log) -> None:
    """The release's ImageNet* directory: SD2's tokenizer plus one added token per class,
    the SD2 text encoder with the embedding matrix grown by as many rows, and ``tokens.pt``."""
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    from pipeline.models.diffusion import ti_token

    if (out / "tokens.pt").is_file() and (out / "text_encoder" / "model.safetensors").is_file():
        log(f"{out}: cached")
        return
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    _write_tokenizer(tmp / "_sd2_tokenizer")
    tokenizer = CLIPTokenizer.from_pretrained(tmp / "_sd2_tokenizer")
    tokens = [ti_token(i, name) for i, name in enumerate(class_names)]
    tokenizer.add_tokens(tokens)
    tokenizer.save_pretrained(tmp / "tokenizer")
    shutil.rmtree(tmp / "_sd2_tokenizer")
    torch.manual_seed(1)
    text = CLIPTextModel(CLIPTextConfig(**dict(_text_config(width), vocab_size=len(tokenizer))))
    text.save_pretrained(tmp / "text_encoder")
    del text
    _free()
    torch.save({"tokens": tokens, "initializer_words": list(class_names)}, tmp / "tokens.pt")
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out)
    log(f"{out}: {len(tokens)} class tokens")


def slider_module_names(unet) -> list[str]:
    """LoRA names of the original trainer's c3lier + noxattn network on ``unet``, in its order."""
    names: list[str] = []
    for name, module in unet.named_modules():
        if "attn2" in name or "time_embed" in name:
            continue
        if module.__class__.__name__ not in SLIDER_PARENTS:
            continue
        for child_name, child in module.named_modules():
            if child.__class__.__name__ in SLIDER_LAYERS:
                lora_name = f"lora_unet.{name}.{child_name}".replace(".", "_")
                if lora_name not in names:
                    names.append(lora_name)
    return names


def write_sliders(root: Path, store: Path, pattern: str, pairs: list[tuple[int, str, str]], width: str, log: Log) -> int:
    """One slider per (class id, class name, shift) under ``store``; returns the layers each adapts."""
    import torch
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        unet = UNet2DConditionModel(**_unet_config(width))
    modules = dict(unet.named_modules())
    names = slider_module_names(unet)
    by_lora = {f"lora_unet.{p}".replace(".", "_"): m for p, m in modules.items()}
    for class_id, class_name, shift in pairs:
        path = store / pattern.format(shift=shift, class_id=class_id, class_name=class_name)
        if path.is_file():
            continue
        gen = torch.Generator().manual_seed(zlib.crc32(f"{shift}/{class_id}".encode()))
        state: dict[str, torch.Tensor] = {}
        for lora in names:
            layer = by_lora[lora]
            if isinstance(layer, torch.nn.Linear):
                down_shape, up_shape = (4, layer.in_features), (layer.out_features, 4)
            else:
                down_shape = (4, layer.in_channels, *layer.kernel_size)
                up_shape = (layer.out_channels, 4, 1, 1)
            state[f"{lora}.lora_down.weight"] = (torch.randn(down_shape, generator=gen) * 0.02).to(torch.bfloat16)
            state[f"{lora}.lora_up.weight"] = (torch.randn(up_shape, generator=gen) * 0.02).to(torch.bfloat16)
            state[f"{lora}.alpha"] = torch.tensor(1.0, dtype=torch.bfloat16)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, path)
    log(f"{store}: {len(pairs)} sliders of {len(names)} layers")
    return len(names)


# --------------------------------------------------------------------------- timm, open_clip
def write_timm(root: Path, name: str, log: Log) -> int:
    """``timm/<name>``: the architecture with the tag's config, random init; returns parameters."""
    import timm
    from timm.models import get_pretrained_cfg

    repo = get_pretrained_cfg(name).hf_hub_id
    if is_published(root, repo, ["config.json", "model.safetensors"]):
        log(f"{repo}: cached")
        return -1
    from timm.models._hub import save_config_for_hf

    model = timm.create_model(name, pretrained=False)
    stage = _staging(root, repo)
    n = _save_safetensors(model.state_dict(), stage / "model.safetensors")
    save_config_for_hf(model, str(stage / "config.json"))
    del model
    _free()
    publish(root, repo, stage)
    log(f"{repo}: {n / 1e6:.0f} M parameters")
    return n


def open_clip_repo(model: str, tag: str) -> tuple[str, str]:
    """(hub repository, file) open_clip's loader downloads for ``model`` with ``pretrained=tag``."""
    from open_clip.constants import HF_SAFE_WEIGHTS_NAME
    from open_clip.pretrained import get_pretrained_cfg

    hub = (get_pretrained_cfg(model, tag) or {}).get("hf_hub", "")
    if not hub:
        raise ValueError(f"open_clip {model} pretrained={tag!r} has no hub location; it cannot be cached offline")
    # "org/repo/" names the repository (open_clip then reads its safetensors file first),
    # "org/repo/file" one file of it.
    repo, filename = os.path.split(hub)
    return repo, filename or HF_SAFE_WEIGHTS_NAME


def write_open_clip(root: Path, model: str, tag: str, log: Log) -> int:
    """The hub repository open_clip's loader reads for (model, tag), float16 weights."""
    import open_clip
    import torch
    from open_clip.pretrained import get_pretrained_cfg

    repo, filename = open_clip_repo(model, tag)
    if is_published(root, repo, [filename]):
        log(f"{repo}: cached")
        return -1
    pcfg = get_pretrained_cfg(model, tag)
    clip = open_clip.create_model(model, pretrained=None, force_quick_gelu=bool(pcfg.get("quick_gelu")))
    stage = _staging(root, repo)
    n = _save_safetensors(clip.state_dict(), stage / filename, dtype=torch.float16)
    preprocess = {k: pcfg[k] for k in ("mean", "std", "interpolation", "resize_mode") if k in pcfg}
    (stage / "open_clip_config.json").write_text(json.dumps(
        {"model_cfg": open_clip.get_model_config(model), "preprocess_cfg": preprocess}, indent=2))
    del clip
    _free()
    publish(root, repo, stage)
    log(f"{repo}: {n / 1e6:.0f} M parameters")
    return n


# --------------------------------------------------------------------------- from a config
def torch_hub_reason(spec) -> tuple[str, str]:
    """(why a torch_hub classifier cannot be made offline, what to run where there is internet)."""
    repo, _, entry = spec.model.rpartition(":")
    return (
        f"torch.hub.load('{repo}', '{entry}') runs the repository's hubconf.py, whose code is fetched from "
        f"GitHub (github.com/{repo.split(':')[0]}) and which downloads its weights from the publisher's server; "
        "neither can be written offline",
        "HF_HOME=<cache> TORCH_HOME=<cache>/torch cnsbench prefetch configs/cns_bench.yaml  "
        f"(for this entry alone: python -c \"import torch; torch.hub.load('{repo}', '{entry}')\")",
    )


def make_cache(config_path: str, root: str | os.PathLike[str], sets: list[str] | None = None,
               width: str = "full", log: Log = print) -> dict[str, Any]:
    """Write every model ``config_path`` (with ``--set`` items ``sets``) names into ``root``.

    Returns ``{"written": {what: parameters}, "unavailable": {classifier: {reason, fetch}}}``.
    """
    from pipeline.config import load_config

    cfg = load_config(config_path, sets=sets or [])
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    (root / "torch").mkdir(exist_ok=True)
    written: dict[str, int] = {}
    unavailable: dict[str, dict[str, str]] = {}
    gen = cfg.generator
    if gen.model == SD2:
        write_sd2(root, width, log)
    labels = cfg.benchmark.label_space
    if gen.class_tokens.kind == "text_encoder_dir":
        names = [labels.name(i) for i in range(len(labels))]
        write_imagenet_star(root, root / "cns" / "imagenet_star", names, width, log)
    if gen.slider_store:
        pairs = [(c, labels.name(c), s) for c in cfg.benchmark.classes for s in cfg.all_shifts()]
        write_sliders(root, root / "cns" / "sliders", gen.slider_pattern, pairs, width, log)
    flt = cfg.filter
    if flt.enabled and flt.kind != "none":
        written[f"filter.clip {flt.clip.model}"] = write_open_clip(root, flt.clip.model, flt.clip.pretrained, log)
        written[f"filter.dino {flt.dino.model}"] = write_timm(root, flt.dino.model, log)
    for spec in cfg.classifiers:
        if spec.kind == "timm" and not spec.checkpoint:
            written[spec.name] = write_timm(root, spec.model, log)
        elif spec.kind == "open_clip_zeroshot" and spec.checkpoint and not os.path.exists(spec.checkpoint):
            written[spec.name] = write_open_clip(root, spec.model, spec.checkpoint, log)
        elif spec.kind == "torch_hub":
            reason, fetch = torch_hub_reason(spec)
            unavailable[spec.name] = {"reason": reason, "fetch": fetch}
    shutil.rmtree(root / ".staging", ignore_errors=True)
    return {"written": written, "unavailable": unavailable}
