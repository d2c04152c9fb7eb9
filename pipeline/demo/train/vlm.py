"""The world's vision-language model: ``python -m pipeline.demo.train.vlm --world assets/world``.

A LLaVA (``LlavaForConditionalGeneration``) whose vision tower is the world's own CLIP
image tower (``clip/world-clip.pt``, open_clip weights copied into transformers' CLIP
vision layout and checked to give the same features), frozen, behind a projector and a
small Llama trained here to answer ImageNet-D's two-choice question about a world digit:
"What is the main object in this image? Choose from the following list: {a}, {b}." ->
"{digit}".  Options are a digit's name and another digit's, in random order (so the
answer must come from the image, not from the position); train digits only, clean.
Written to ``vlm/`` as a directory ``AutoModelForImageTextToText.from_pretrained`` loads
(classifier kind ``vlm``); ``vlm/training.json`` records the settings, the time and the
held-out two-choice accuracy on clean test digits, in the release's option order (truth
first) and shuffled.  About 2 minutes of CPU (one core); 0.5 MB (float16).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from pipeline.demo import world_data as W
from pipeline.demo import world_models as M
from pipeline.io.safejson import dumps as strict_dumps

SETTINGS: dict[str, Any] = {
    "seed": 7,
    "steps": 400,
    "batch": 48,
    "lr": 3e-3,
    "text": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 2},
}
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


def clip_vision_state(open_clip_state: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """open_clip ``visual.*`` weights -> transformers' ``CLIPVisionTransformer`` names."""
    v = {k[len("visual."):]: t.float() for k, t in open_clip_state.items() if k.startswith("visual.")}
    out = {
        "embeddings.class_embedding": v["class_embedding"],
        "embeddings.patch_embedding.weight": v["conv1.weight"],
        "embeddings.position_embedding.weight": v["positional_embedding"],
        "pre_layrnorm.weight": v["ln_pre.weight"], "pre_layrnorm.bias": v["ln_pre.bias"],
        "post_layernorm.weight": v["ln_post.weight"], "post_layernorm.bias": v["ln_post.bias"],
    }
    for i in range(layers):
        src, dst = f"transformer.resblocks.{i}.", f"encoder.layers.{i}."
        q, k, val = v[src + "attn.in_proj_weight"].chunk(3)
        qb, kb, vb = v[src + "attn.in_proj_bias"].chunk(3)
        out.update({
            dst + "self_attn.q_proj.weight": q, dst + "self_attn.q_proj.bias": qb,
            dst + "self_attn.k_proj.weight": k, dst + "self_attn.k_proj.bias": kb,
            dst + "self_attn.v_proj.weight": val, dst + "self_attn.v_proj.bias": vb,
            dst + "self_attn.out_proj.weight": v[src + "attn.out_proj.weight"],
            dst + "self_attn.out_proj.bias": v[src + "attn.out_proj.bias"],
            dst + "layer_norm1.weight": v[src + "ln_1.weight"], dst + "layer_norm1.bias": v[src + "ln_1.bias"],
            dst + "layer_norm2.weight": v[src + "ln_2.weight"], dst + "layer_norm2.bias": v[src + "ln_2.bias"],
            dst + "mlp.fc1.weight": v[src + "mlp.c_fc.weight"], dst + "mlp.fc1.bias": v[src + "mlp.c_fc.bias"],
            dst + "mlp.fc2.weight": v[src + "mlp.c_proj.weight"], dst + "mlp.fc2.bias": v[src + "mlp.c_proj.bias"],
        })
    return out


def _world_clip(world: Path):
    import open_clip

    clip = M.make_clip()
    state = torch.load(world / "clip" / "world-clip.pt", map_location="cpu", weights_only=True)
    state = state.get("state_dict", state)
    clip.load_state_dict({k: t.float() for k, t in state.items()})
    return clip.eval(), state, open_clip


def _pixels(x: torch.Tensor) -> torch.Tensor:
    """Grey digits in [0, 1] -> what the CLIP image processor makes of their PNGs."""
    mean, std = torch.tensor(OPENAI_MEAN).view(1, 3, 1, 1), torch.tensor(OPENAI_STD).view(1, 3, 1, 1)
    return (W.to_rgb((x.clamp(0, 1) * 255).round() / 255) - mean) / std


def train_world_vlm(world: Path, out: Path, settings: dict[str, Any] = SETTINGS, echo=print) -> dict[str, Any]:
    from transformers import LlavaForConditionalGeneration

    from pipeline.demo.tiny_vlm import (
        build_tiny_llava,
        make_processor,
        make_tokenizer,
        tiny_llava_config,
    )
    from pipeline.models.vqa_protocols import IMAGENET_D_PROMPT

    start = time.perf_counter()
    torch.manual_seed(settings["seed"])
    rng = random.Random(settings["seed"])
    clip, state, _ = _world_clip(world)
    vcfg = M.CLIP_CFG["vision_cfg"]
    names = list(W.DIGIT_NAMES)
    tokenizer = make_tokenizer([IMAGENET_D_PROMPT, *names])
    processor = make_processor(tokenizer, vcfg["image_size"], vcfg["patch_size"], OPENAI_MEAN, OPENAI_STD)
    cfg = tiny_llava_config(
        len(tokenizer), vcfg["image_size"], vcfg["patch_size"],
        vision={"hidden_size": vcfg["width"], "intermediate_size": 4 * vcfg["width"], "num_hidden_layers": vcfg["layers"],
                "num_attention_heads": vcfg["width"] // vcfg["head_width"], "hidden_act": "gelu"},
        text=settings["text"], image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
    )
    model = LlavaForConditionalGeneration(cfg)
    model.model.vision_tower.load_state_dict(clip_vision_state(state, vcfg["layers"]))
    x, y = W.load_digits_tensor()
    tr, te = W.split(y)
    with torch.no_grad():  # the copied tower gives open_clip's token features
        probe = _pixels(x[te[:4]])
        ours = model.model.vision_tower(probe, output_hidden_states=True).hidden_states[-1]
        v = clip.visual
        t = v.conv1(probe).flatten(2).transpose(1, 2)
        t = torch.cat([v.class_embedding.expand(len(t), 1, -1), t], dim=1) + v.positional_embedding
        theirs = v.transformer(v.ln_pre(t))
        gap = float((ours - theirs).abs().max())
    if gap > 1e-3:
        raise RuntimeError(f"the copied CLIP vision tower differs from open_clip's by {gap}")
    model.model.vision_tower.requires_grad_(False)

    prompt_ids: dict[tuple[int, int], torch.Tensor] = {}
    blank = W.to_pil(x[:1])[0]

    def ids(a: int, b: int) -> torch.Tensor:
        if (a, b) not in prompt_ids:
            msg = [{"role": "user", "content": [{"type": "image"}, {"type": "text",
                   "text": IMAGENET_D_PROMPT.format(options=f"{names[a]}, {names[b]}")}]}]
            text = processor.apply_chat_template(msg, add_generation_prompt=True, tokenize=False)
            prompt_ids[(a, b)] = processor(images=[blank], text=[text], return_tensors="pt")["input_ids"][0]
        return prompt_ids[(a, b)]

    eos = tokenizer.eos_token_id
    answer = torch.tensor([tokenizer.convert_tokens_to_ids(n) for n in names])
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=settings["lr"], weight_decay=0.0)
    model.train()
    xtr, ytr = x[tr], y[tr]
    loss_value = float("nan")
    for step in range(settings["steps"]):
        for g in opt.param_groups:
            g["lr"] = settings["lr"] * min(1.0, (step + 1) / 50) * (0.5 + 0.5 * torch.cos(torch.tensor(step / settings["steps"] * 3.1416)).item())
        idx = torch.randint(0, len(xtr), (settings["batch"],))
        rows, labels = [], []
        for j in idx.tolist():
            c = int(ytr[j])
            other = rng.choice([d for d in range(10) if d != c])
            pair = (c, other) if rng.random() < 0.5 else (other, c)
            p = ids(*pair)
            rows.append(torch.cat([p, torch.tensor([int(answer[c]), eos])]))
            labels.append(torch.cat([torch.full_like(p, -100), torch.tensor([int(answer[c]), eos])]))
        res = model(input_ids=torch.stack(rows), pixel_values=_pixels(xtr[idx]), labels=torch.stack(labels))
        opt.zero_grad()
        res.loss.backward()
        opt.step()
        loss_value = float(res.loss.detach())
        if step % 100 == 0:
            echo(f"[vlm] step {step}: loss {loss_value:.3f}")
    model.eval()
    result = {
        "settings": settings,
        "final_loss": loss_value,
        "held_out_two_choice_accuracy": {
            order: _held_out_accuracy(model, processor, x[te], y[te], names, order) for order in ("original", "shuffled")
        },
        "train_seconds": round(time.perf_counter() - start, 1),
        "vision_tower": f"world CLIP image tower (clip/world-clip.pt), frozen; max feature difference {gap:.2e}",
    }
    build_tiny_llava(out, [IMAGENET_D_PROMPT, *names], model=model.half(), image_size=vcfg["image_size"],
                     patch_size=vcfg["patch_size"], mean=OPENAI_MEAN, std=OPENAI_STD)
    (out / "training.json").write_text(strict_dumps(result, indent=1))
    return result


@torch.no_grad()
def _held_out_accuracy(model, processor, x, y, names, order: str) -> float:
    """Greedy two-choice accuracy (TRUE / (TRUE + FALSE)) on held-out digits; distractor: a random other digit."""
    from pipeline.models.vqa_protocols import IMAGENET_D_PROMPT, two_choice_verdict

    rng = random.Random(11)
    images = W.to_pil(x)
    texts, truths, others = [], [], []
    for c in y.tolist():
        other = rng.choice([d for d in range(10) if d != c])
        pair = (c, other) if order == "original" or rng.random() < 0.5 else (other, c)
        msg = [{"role": "user", "content": [{"type": "image"}, {"type": "text",
               "text": IMAGENET_D_PROMPT.format(options=f"{names[pair[0]]}, {names[pair[1]]}")}]}]
        texts.append(processor.apply_chat_template(msg, add_generation_prompt=True, tokenize=False))
        truths.append(names[c])
        others.append(names[other])
    n_true = n_false = 0
    for lo in range(0, len(texts), 64):
        batch = processor(images=images[lo:lo + 64], text=texts[lo:lo + 64], return_tensors="pt", padding=True)
        out = model.generate(**batch, do_sample=False, max_new_tokens=3)
        answers = processor.tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
        for t, o, a in zip(truths[lo:lo + 64], others[lo:lo + 64], answers):
            v = two_choice_verdict(t, o, a, {})
            n_true += v == "TRUE"
            n_false += v == "FALSE"
    return round(n_true / max(1, n_true + n_false), 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", default="assets/world", help="the trained world (its clip/ is the vision tower)")
    parser.add_argument("--output", default=None, help="default: WORLD/vlm")
    parser.add_argument("--steps", type=int, default=SETTINGS["steps"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    world = Path(args.world)
    result = train_world_vlm(world, Path(args.output or world / "vlm"), {**SETTINGS, "steps": args.steps})
    print(json.dumps(result["held_out_two_choice_accuracy"]), f"{result['train_seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
