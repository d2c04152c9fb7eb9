"""Measured GPU seconds per image of the paper's stages at real size: the generate stage through the
real ``SliderSampler`` (eager and compiled, with sliders and bare), and filter and classify at each
precision and batch, against the FLOP projection.

On a GPU machine (H100 or H200; about 7 minutes, give it 10), from the repository root:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \\
      && PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 python3 bench/rehearsal_gpu.py --json --out $OUT/rehearsal_gpu.json

then, here, ``python -m pipeline.perf.gpus --gpu h100 --rehearsal rehearsal_gpu.json --write`` writes the
measured stage utilisations and slider factor into ``pipeline/data/gpus.json``;
``$OUT`` is a folder that outlives the run and ``.whl``, copied to the machine with the
repository, holds the packages a bare torch image lacks, at this project's versions (``.venv``),
fetched once beside the repository's files (``echo /.whl/ >> .git/info/exclude`` keeps them out
of git; 11 MB):

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \\
      -d .whl diffusers==0.42.1 open_clip_torch==3.3.0 ftfy==6.3.1 wcwidth==0.9.4 pydantic==2.14.4 \\
      pydantic_core==2.50.5 annotated_types==0.8.0 typing_inspection==0.4.5

Anywhere, in seconds: ``python bench/rehearsal_gpu.py --smoke --json`` (the demo world's toy models,
64 px, one thread of the CPU; ``--compile`` adds the compiled sampler with torch's ``eager``
backend, which only traces: a minute more).

Every model is built with random weights at its real architecture on the device (timing does
not depend on the weights; nothing is downloaded), from ``configs/cns_bench.yaml``:

* ``generate``: the bare SD2 UNet at the config's resolution and dtype by CFG batch (2: the
  shared steps before the LoRA window; 2 x ``branch_batch_size``: the window), and one VAE
  decode; per image the grid's UNet evaluations plus one decode (as bench/rehearsal.py counts);
* ``sampler``: the generate stage's own code, ``SliderSampler.generate_group`` for one
  (class, seed) over 14 shifts x the config's scales (16 branches per forward), each shift a
  random rank-4 slider of the config's module set; the same with the sliders' application
  taken out (``bare``: a bank that routes nothing, the same steps, decode and scheduler); each
  ``eager`` and ``compiled`` (``generator.compile``).  ``window_forward_s``: one window forward
  (16 branches, CFG, t = 501) with its rows' sliders; its ratio to the bare forward is the
  slider window factor (``cnsbench estimate``'s ``slider_window_factor``).  The group runs at
  ``--group-steps`` (default 25: its window and prefix in the config's proportion, half the
  time of 50); ``seconds_per_image_at_config_steps`` scales it by the UNet evaluations;
* ``precision``: the filter's CLIP ViT-B/16 and DINOv2-L (518 px) and every timm / CLIP
  classifier, each forward as the stages run it (``pipeline.models.precision``: float32 with
  TF32 off, tf32, bfloat16, bfloat16 + channels_last) at each of ``--batches`` images per
  forward; ``filter`` / ``classify`` keep the float32 figures at the config's batch;
* ``zero_shot_head``: the text-tower work of one zero-shot head (1000 classes x 80 templates).

``--out FILE`` rewrites FILE with the figures so far after each part, so a run stopped at its
time limit keeps what it measured; ``--budget-s`` skips the sampler parts that would start
after that many seconds.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from pipeline.perf.flops import open_clip_image_flops, timm_flops, unet_flops, vae_decode_flops  # noqa: E402

TEMPLATES = 80  # the OpenAI ImageNet prompt templates per class
CLASSES = 1000
SHIFTS = 14  # the paper's shifts
SETTINGS = "float32,tf32,bfloat16,bfloat16+channels_last"


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _free(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


WARMUP = 2  # calls before the timed ones (1 in --smoke)


def timed(fn: Callable[[], Any], device: str, repeats: int, warmup: int | None = None) -> float:
    """Median seconds of one call of ``fn`` after ``warmup`` calls (default :data:`WARMUP`)."""
    import torch

    warmup = WARMUP if warmup is None else warmup

    with torch.inference_mode():
        for _ in range(warmup):
            fn()
        _sync(device)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            _sync(device)
            times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def unet_evals_per_image(gen: dict[str, Any], bench: dict[str, Any], steps: int | None = None,
                         shifts: int | None = None) -> tuple[float, float]:
    """UNet sample-evaluations per image of the grid: (the shared prefix before the LoRA window,
    run once per (class, seed) at a batch of one; the window, run per distinct image in
    batches of ``branch_batch_size``), as :func:`pipeline.perf.evals.unet_evals_per_unit` counts them."""
    from pipeline.perf.evals import unet_evals_per_unit

    e = unet_evals_per_unit(steps or gen["steps"], gen["lora_timestep_threshold"], shifts or len(bench["shifts"]),
                            list(bench["scales"]), gen["guidance_scale"])
    factor = 2 if gen["guidance_scale"] > 1 else 1
    pre = factor * e["prefix_steps"]
    return round(pre / e["images"], 3), round((e["evals"] - pre) / e["images"], 3)


def _row(name: str, seconds: float, flops: float, per_image: float = 1.0, **extra: Any) -> dict[str, Any]:
    row = {"model": name, "seconds_per_image": round(seconds * per_image, 6),
           "achieved_tflops": round(flops / seconds / 1e12, 1) if seconds > 0 else None}
    row.update(extra)
    return row


def _sd2_configs(small: bool) -> tuple[dict, dict, dict]:
    """The SD2 UNet, VAE and text encoder configs; ``small``: the demo world's toy sizes
    (``pipeline.demo.tiny_sd``), two UNet blocks, for the smoke run on a CPU."""
    from rehearsal_cache import SD2_TEXT_CONFIG, SD2_UNET, SD2_VAE

    if not small:
        return dict(SD2_UNET), dict(SD2_VAE), dict(SD2_TEXT_CONFIG)
    from pipeline.demo.tiny_sd import ARCH

    tiny = ARCH["tiny"]
    blocks = len(tiny["vae"]["block_out_channels"])
    unet = dict(tiny["unet"], in_channels=4, out_channels=4)
    vae = dict(tiny["vae"], in_channels=3, out_channels=3, latent_channels=4,
               down_block_types=["DownEncoderBlock2D"] * blocks, up_block_types=["UpDecoderBlock2D"] * blocks)
    return unet, vae, dict(SD2_TEXT_CONFIG, **tiny["text"])


# --------------------------------------------------------------------------- bare UNet and VAE
def measure_generate(res: int, dtype, device: str, repeats: int, small: bool, batches: list[int]) -> dict[str, Any]:
    """Seconds per UNet sample-evaluation at each CFG batch of ``batches`` and of one VAE decode."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel

    unet_cfg, vae_cfg, _ = _sd2_configs(small)
    side = res // 8
    with torch.device(device):
        unet = UNet2DConditionModel(**unet_cfg).to(dtype).eval()
    flops = unet_flops(unet_cfg, res)  # one sample-evaluation (batch 1)
    per_eval = {}
    for n in batches:  # a CFG step on n/2 images: n sample-evaluations
        x = torch.randn(n, 4, side, side, device=device, dtype=dtype)
        ctx = torch.randn(n, 77, unet_cfg["cross_attention_dim"], device=device, dtype=dtype)
        t = torch.full((n,), 500, device=device)
        seconds = timed(lambda x=x, t=t, ctx=ctx: unet(x, t, encoder_hidden_states=ctx), device, repeats)
        per_eval[n] = _row(f"unet batch {n}", seconds / n, flops)
        print(f"[rehearsal_gpu] {per_eval[n]}", file=sys.stderr)
    unet = None  # freed before the VAE is built
    _free(device)
    with torch.device(device):
        vae = AutoencoderKL(**vae_cfg).to(dtype).eval()
    z = torch.randn(1, 4, side, side, device=device, dtype=dtype)
    decode = timed(lambda: vae.decode(z), device, max(2, repeats // 2))
    vae_flops = vae_decode_flops(vae_cfg, res)
    vae = None
    _free(device)
    return {"unet_eval": per_eval, "unet_flops_per_eval": flops, "vae_decode": _row("vae decode", decode, vae_flops),
            "vae_flops": vae_flops}


# --------------------------------------------------------------------------- image models by precision
def _image_model(kind: str, model: str, device: str, side: int | None = None, sized: bool = False):
    """(forward callable, the module to put in a precision, input side) of a timm model (at
    ``side`` if given, built for it with ``sized``: a ViT's ``img_size``) or an open_clip image tower."""
    import torch

    if kind == "timm":
        import timm

        with torch.device(device):  # initialised where it runs: a GPU builds a 600M model in a blink
            net = timm.create_model(model, pretrained=False, **({"img_size": side} if sized else {})).eval()
        return net, net, side or net.pretrained_cfg.get("input_size", (3, 224, 224))[-1]
    import open_clip

    with torch.device(device):
        clip = open_clip.create_model(model, pretrained=None, device=device).eval()
    side = clip.visual.image_size
    side = side[0] if isinstance(side, (tuple, list)) else side
    del clip.transformer  # the image tower is all a classify forward runs (the head is a matmul)
    return (lambda x: clip.encode_image(x)), clip, side


def _flops(kind: str, model: str, side: int, sized: bool) -> int:
    if kind == "timm":
        return timm_flops(model, side, **({"img_size": side} if sized else {}))
    return open_clip_image_flops(model, side)


def parse_settings(text: str) -> list[tuple[str, bool]]:
    """``float32,bfloat16+channels_last`` -> [(precision, channels_last), ...]."""
    out = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        precision, _, layout = item.partition("+")
        if layout not in ("", "channels_last"):
            raise SystemExit(f"--settings: {item!r}: only '+channels_last' may follow a precision")
        out.append((precision, bool(layout)))
    return out


def setting_name(precision: str, channels_last: bool) -> str:
    return precision + ("+channels_last" if channels_last else "")


def measure_precisions(models: list[tuple[str, str, str]], settings: list[tuple[str, bool]], batches: list[int],
                       device: str, repeats: int, sides: dict[str, tuple[int, bool]] | None = None) -> dict[str, Any]:
    """Seconds per image of each (name, kind, model) in each setting at each batch (images per
    forward), each forward as the stages run it (:class:`pipeline.models.precision.ModelPrecision`).
    Each model is built once; the settings run in order (bfloat16 casts it for the rest).
    ``sides``: name -> (input side, whether the model is built for it) where not the model's own."""
    import torch

    from pipeline.models.precision import ModelPrecision

    precisions = [p for p, _ in settings]
    if "bfloat16" in precisions and set(precisions[precisions.index("bfloat16"):]) != {"bfloat16"}:
        raise SystemExit("--settings: bfloat16 settings come last (the cast is not undone)")
    times: dict[str, dict[str, dict[str, float]]] = {setting_name(*s): {str(b): {} for b in batches} for s in settings}
    rows: dict[str, Any] = {}
    for name, kind, model in models:
        side, sized = (sides or {}).get(name, (None, False))
        try:
            fn, module, side = _image_model(kind, model, device, side, sized)
            rows[name] = {"input_side": side, "flops": _flops(kind, model, side, sized)}
            for precision, channels_last in settings:
                p = ModelPrecision(precision, channels_last)
                p.prepare(module)
                for b in batches:
                    x = p.inputs(torch.randn(b, 3, side, side, device=device))

                    def run(fn=fn, x=x, p=p) -> None:
                        with p.running(device):
                            fn(x)

                    times[setting_name(precision, channels_last)][str(b)][name] = timed(run, device, repeats) / b
                    x = None
            fn = module = None  # freed before the next model is built
        except Exception as exc:  # one model's failure is reported, the others still measured
            rows[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(f"[rehearsal_gpu] {name}: {rows[name]} "
              f"{ {s: {b: round(v.get(name, 0), 5) for b, v in t.items()} for s, t in times.items()} }", file=sys.stderr)
        _free(device)
    totals = {s: {b: round(sum(v.values()), 5) for b, v in t.items()} for s, t in times.items()}
    return {"models": rows, "seconds_per_image": totals, "by_model": times}


def stage_rows(grid: dict[str, Any], setting: str, batch: int) -> list[dict[str, Any]]:
    """The per-model rows (seconds per image, achieved TFLOP/s) of one setting and batch."""
    out = []
    for name, info in grid["models"].items():
        if "error" in info:
            out.append({"model": name, "error": info["error"]})
            continue
        sec = grid["by_model"][setting][str(batch)][name]
        out.append(_row(name, sec, info["flops"], input_side=info["input_side"]))
    return out


def _total(rows: list[dict[str, Any]]) -> float:
    return round(sum(r.get("seconds_per_image", 0.0) for r in rows), 5)


def measure_zero_shot_head(model: str, device: str, batch: int, smoke: bool) -> dict[str, Any]:
    """Seconds to encode one zero-shot head's prompts (1000 classes x 80 templates) on ``device``."""
    import open_clip
    import torch

    with torch.device(device):
        clip = open_clip.create_model(model, pretrained=None, device=device).eval()
    tokens = torch.randint(1, clip.vocab_size - 1, (batch, clip.context_length), device=device)
    per_batch = timed(lambda: clip.encode_text(tokens), device, 3)
    prompts = (1 if smoke else CLASSES) * TEMPLATES
    clip = None
    _free(device)
    return {"model": model, "prompts": prompts, "seconds_per_head": round(per_batch * prompts / batch, 2)}


# --------------------------------------------------------------------------- the sampler
class NoSliders:
    """A slider bank that loads and applies nothing: the sampler's steps with the bare UNet."""

    capacity = 1 << 30

    def __init__(self, unet: Any = None, **_: Any) -> None:
        self.unet = unet

    def __contains__(self, name: str) -> bool:
        return True  # every slider is "loaded": nothing is read

    def __getattr__(self, name: str) -> Callable[..., None]:
        # add, route, route_uniform, clear_route, reserve, mark_static, detach, ...: nothing to do
        return lambda *args, **kwargs: None


class SD2Parts:
    """Random-weight SD2 text encoder, tokenizer, VAE and scheduler, built once; each sampler gets
    a fresh UNet (the slider bank hooks into it)."""

    def __init__(self, small: bool, device: str, dtype) -> None:
        import torch
        from diffusers import AutoencoderKL, DDIMScheduler
        from rehearsal_cache import SD2_SCHEDULER
        from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

        from pipeline.demo.tiny_sd import write_clip_tokenizer

        self.unet_cfg, vae_cfg, text_cfg = _sd2_configs(small)
        self.device, self.dtype = device, dtype
        with tempfile.TemporaryDirectory() as tmp:
            self.tokenizer = CLIPTokenizer.from_pretrained(write_clip_tokenizer(Path(tmp) / "tokenizer"))
        with torch.device(device):
            self.vae = AutoencoderKL(**vae_cfg).to(dtype).eval()
            self.text_encoder = CLIPTextModel(CLIPTextConfig(**text_cfg)).to(dtype).eval()
        self.scheduler = DDIMScheduler.from_config(SD2_SCHEDULER)

    def pipeline(self):
        import torch
        from diffusers import StableDiffusionPipeline, UNet2DConditionModel

        with torch.device(self.device):
            unet = UNet2DConditionModel(**self.unet_cfg).to(self.dtype).eval()
        pipe = StableDiffusionPipeline(
            unet=unet, vae=self.vae, text_encoder=self.text_encoder, tokenizer=self.tokenizer,
            scheduler=self.scheduler, safety_checker=None, feature_extractor=None, requires_safety_checker=False,
        )
        pipe.set_progress_bar_config(disable=True)
        return pipe


def make_sampler(spec, parts: SD2Parts, class_id: int, bare: bool, compile_backend: str | None):
    """A ``SliderSampler`` set up as the generate stage does, on a fresh random UNet (no download:
    the pipeline loader is pointed at ``parts``); ``bare``: with :class:`NoSliders` as its bank."""
    from pipeline.labels import label_space
    from pipeline.models import diffusion
    from pipeline.models import sampler as sampler_module

    loader, bank = diffusion.load_pipeline, sampler_module.SliderBank
    diffusion.load_pipeline = lambda *args, **kwargs: parts.pipeline()
    if bare:
        sampler_module.SliderBank = NoSliders
    try:
        sampler = sampler_module.SliderSampler(spec, parts.device, parts.dtype)
        sampler.setup([class_id], label_space("imagenet"))
    finally:
        diffusion.load_pipeline, sampler_module.SliderBank = loader, bank
    if bare and not isinstance(sampler.bank, NoSliders):
        raise SystemExit("rehearsal_gpu: the sampler no longer makes its bank as SliderBank(unet): update make_sampler")
    if compile_backend and not spec.compile:  # the smoke's tracing-only compile
        sampler.compile_unet(backend=compile_backend)
    return sampler


def add_sliders(sampler, class_id: int, shifts: list[str], training: dict[str, Any], store: Path) -> None:
    """One random rank-r slider per shift (the config's module set), in the bank or its store."""
    from pipeline.models.lora import random_slider, save_slider_file

    for i, shift in enumerate(shifts):
        state = random_slider(sampler.pipe.unet, rank=training.get("rank", 4), alpha=training.get("alpha", 1.0),
                              targets=training.get("targets", "attn_conv"), method=training.get("method", "noxattn"),
                              seed=1000 + i, std=0.05)
        if hasattr(sampler, "add_slider"):
            sampler.add_slider(class_id, shift, state)
        else:  # an older sampler: through its slider store
            save_slider_file(state, str(store / shift / f"{class_id:03d}.safetensors"))


def window_forward(sampler, rows: list[str | None], mults: list[float], repeats: int) -> float:
    """Seconds of one window UNet forward (CFG doubles the rows) with ``rows``' sliders routed."""
    import torch

    unet, device = sampler.pipe.unet, sampler.device
    n = len(rows) * (2 if sampler.do_cfg else 1)
    side = sampler.spec.resolution // sampler.pipe.vae_scale_factor
    dtype = unet.dtype
    x = torch.randn(n, unet.config.in_channels, side, side, device=device, dtype=dtype)
    ctx = torch.randn(n, 77, unet.config.cross_attention_dim, device=device, dtype=dtype)
    t = torch.tensor(501, device=device)
    graphs = getattr(sampler, "cuda_graphs", False)
    sampler.bank.route(rows * 2 if sampler.do_cfg else rows, mults * 2 if sampler.do_cfg else mults)

    def call() -> None:
        if graphs:  # CUDA graphs: the previous replay's outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        unet(x, t, encoder_hidden_states=ctx, return_dict=False)

    try:
        return timed(call, device, repeats)
    finally:
        sampler.bank.clear_route()


def measure_sampler(sampler, class_id: int, shifts: list[str], scales: list[float], repeats: int,
                    group_repeats: int, names: dict[str, str]) -> dict[str, Any]:
    """One sampler: its window forwards and one (class, seed) group over ``shifts`` x ``scales``."""
    import torch

    branch = sampler.spec.branch_batch_size
    nonzero = [s for s in scales if s != 0]
    grid = [(names[sh], m) for sh in shifts for m in nonzero]
    chunk = (grid * branch)[:branch]  # the sampler's first chunk but the scale-0 branch: a few sliders
    distinct = [(names[shifts[i % len(shifts)]], nonzero[i % len(nonzero)]) for i in range(branch)]
    out: dict[str, Any] = {}
    start = time.perf_counter()
    sampler.generate_group(class_id, 0, shifts[:2], [0.0, *nonzero[:1]])  # warm-up: graphs, allocator
    out["warmup_s"] = round(time.perf_counter() - start, 2)
    out["window_forward_s"] = round(window_forward(sampler, [r for r, _ in chunk], [m for _, m in chunk], repeats), 5)
    out["window_forward_distinct_s"] = round(
        window_forward(sampler, [r for r, _ in distinct], [m for _, m in distinct], repeats), 5)
    best = None
    for _ in range(group_repeats):
        _sync(sampler.device)
        start = time.perf_counter()
        result = sampler.generate_group(class_id, 1, shifts, scales)
        _sync(sampler.device)
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    images = len(shifts) * len(scales)
    out.update({"group_seconds": round(best, 3), "images": images, "seconds_per_image": round(best / images, 5),
                "unet_evals_per_image": round(result.unet_evals / images, 3)})
    _ = torch  # the group ran under the sampler's own inference mode
    return out


def run_sampler_part(cfg: dict[str, Any], args, device: str, dtype, start: float, dump: Callable[[], None],
                     out: dict[str, Any]) -> None:
    """The ``sampler`` figures: eager and compiled, each with sliders and bare."""
    from pipeline.config import GeneratorSpec

    gen, bench, training = cfg["generator"], cfg["benchmark"], cfg.get("slider_training", {})
    shifts = [f"shift_{i:02d}" for i in range(args.shifts)]
    scales = [float(s) for s in bench["scales"]]
    class_id = int(bench["classes"][0]) if isinstance(bench["classes"][0], int) else 2
    steps = args.group_steps
    part: dict[str, Any] = {"shifts": len(shifts), "scales": scales, "steps": steps, "config_steps": gen["steps"],
                            "branches_per_forward": args.branch_batch}
    out["sampler"] = part
    parts = SD2Parts(args.smoke, device, dtype)
    modes = ["eager", "compiled"] if args.compile else ["eager"]
    if not args.compile:
        part["compiled"] = {"skipped": "--smoke without --compile" if args.smoke else "--no-compile"}
    compiles = "compile" in GeneratorSpec.model_fields
    for mode in modes:
        if mode == "compiled" and not compiles:
            part["compiled"] = {"skipped": "generator.compile does not exist in this version"}
            continue
        figures: dict[str, Any] = {}
        part[mode] = figures
        for variant in ("sliders", "bare"):
            if time.perf_counter() - start > args.budget_s:
                figures[variant] = {"skipped": f"past --budget-s {args.budget_s}"}
                continue
            with tempfile.TemporaryDirectory() as store:
                spec = GeneratorSpec(
                    kind="slider", model="random-sd2", class_tokens={"kind": "none"}, slider_store=store,
                    steps=steps, guidance_scale=gen["guidance_scale"],
                    lora_timestep_threshold=gen["lora_timestep_threshold"], resolution=args.resolution,
                    image_size=min(gen.get("image_size", 256), args.resolution), dtype=gen.get("dtype", "bfloat16"),
                    branch_batch_size=args.branch_batch,
                    **({"compile": mode == "compiled" and not args.smoke} if compiles else {}),
                )
                t0 = time.perf_counter()
                backend = "eager" if (mode == "compiled" and args.smoke) else None
                sampler = make_sampler(spec, parts, class_id, bare=variant == "bare", compile_backend=backend)
                add_sliders(sampler, class_id, shifts, training, Path(store))
                names = {sh: sampler.load_slider(class_id, sh) for sh in shifts}
                setup_s = time.perf_counter() - t0
                try:
                    figures[variant] = {"setup_s": round(setup_s, 2), **measure_sampler(
                        sampler, class_id, shifts, scales, args.repeats, args.group_repeats, names)}
                except Exception as exc:  # reported; the other variants still run
                    figures[variant] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
                sampler = None
            print(f"[rehearsal_gpu] sampler {mode} {variant}: {figures[variant]}", file=sys.stderr)
            _free(device)
            if mode == "compiled":
                import torch

                torch.compiler.reset()
            dump()
        s, b = figures.get("sliders", {}), figures.get("bare", {})
        if "window_forward_s" in s and "window_forward_s" in b:
            figures["slider_window_factor"] = round(s["window_forward_s"] / b["window_forward_s"], 3)
            figures["slider_window_factor_distinct"] = round(s["window_forward_distinct_s"] / b["window_forward_s"], 3)
            figures["group_factor"] = round(s["group_seconds"] / b["group_seconds"], 3)
        evals_now = sum(unet_evals_per_image(gen, bench, steps, len(shifts)))
        evals_config = sum(unet_evals_per_image(gen, bench, gen["steps"], len(shifts)))
        for v in ("sliders", "bare"):
            if "seconds_per_image" in figures.get(v, {}):
                figures[v]["seconds_per_image_at_config_steps"] = round(
                    figures[v]["seconds_per_image"] * evals_config / evals_now, 4)
    parts = None
    _free(device)


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    import torch
    import yaml

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(HERE.parent / "configs" / "cns_bench.yaml"))
    ap.add_argument("--smoke", action="store_true",
                    help="the demo world's toy models at 64 px, two classifiers: the script on a CPU")
    ap.add_argument("--repeats", type=int, default=5)
    ints = lambda text: [int(v) for v in text.split(",") if v]  # noqa: E731
    ap.add_argument("--unet-batches", type=ints, default=[], help="more bare UNet batches to time, e.g. 8,64")
    ap.add_argument("--batches", type=ints, default=None, help="images per forward for filter and classify "
                    "(default: the config's classify batch and 32)")
    ap.add_argument("--classify-batches", type=ints, default=[], help="(as --batches, added to them)")
    ap.add_argument("--settings", default=SETTINGS, help=f"precisions of filter and classify (default {SETTINGS})")
    ap.add_argument("--tf32", action="store_true", help="(kept for older command lines: tf32 is in the default settings)")
    ap.add_argument("--shifts", type=int, default=SHIFTS, help="shifts of the sampler's group")
    ap.add_argument("--group-steps", type=int, default=None, help="steps of the sampler's group (default 25)")
    ap.add_argument("--group-repeats", type=int, default=1)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="the compiled sampler too (default: on a GPU)")
    ap.add_argument("--parts", default="generate,precision,head,sampler", help="which parts to run")
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip sampler variants that would start later")
    ap.add_argument("--out", help="write the JSON here too, after each part")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    threads = torch.get_num_threads()
    if args.smoke:  # one thread: small ops on a shared CPU, no waiting on each other's threads
        torch.set_num_threads(1)
    try:
        return run(args, torch, yaml)
    finally:
        torch.set_num_threads(threads)


def run(args: argparse.Namespace, torch, yaml) -> int:
    cfg = yaml.safe_load(Path(args.config).read_text())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.smoke:
        print("rehearsal_gpu: no CUDA device (use --smoke to check the script on the CPU)", file=sys.stderr)
        return 2
    gen, bench, res_cfg = cfg["generator"], cfg["benchmark"], cfg["resources"]
    dtype = getattr(torch, gen.get("dtype", "float32")) if device == "cuda" else torch.float32
    res = 64 if args.smoke else gen["resolution"]
    args.resolution = res
    repeats = 1 if args.smoke else args.repeats
    args.repeats = repeats
    global WARMUP
    WARMUP = 1 if args.smoke else WARMUP
    args.compile = (device == "cuda") if args.compile is None else args.compile
    args.branch_batch = 4 if args.smoke else gen.get("branch_batch_size", 16)
    if args.smoke:
        args.shifts = min(args.shifts, 2)
    args.group_steps = args.group_steps or (3 if args.smoke else 25)
    batch = 1 if args.smoke else res_cfg["classify"]["batch_size"]
    batch = batch if isinstance(batch, int) else 8
    batches = sorted({*(args.batches or ([1] if args.smoke else [batch, 32])), *args.classify_batches, batch})
    settings = parse_settings(args.settings)
    if args.tf32 and ("tf32", False) not in settings:
        settings.insert(1, ("tf32", False))
    wanted = {p.strip() for p in args.parts.split(",")}

    clfs = [(c["name"], c.get("kind", "timm"), c["model"]) for c in cfg["classifiers"]
            if c.get("kind", "timm") in ("timm", "open_clip_zeroshot")]
    flt = cfg["filter"]
    filters = [("clip", "open_clip", flt["clip"]["model"]), ("dino", "timm", flt["dino"]["model"])]
    sides = {"dino": (518, True)}  # the filter's DINOv2 at the original's 518 px
    if args.smoke:  # one CNN and the demo world's CLIP (a registered toy config), a small DINOv2
        import open_clip

        open_clip.add_model_config(str(HERE.parent / "assets" / "world" / "clip" / "world-clip.json"))
        clfs = [("resnet18", "timm", "resnet18.a1_in1k"), ("clip_world", "open_clip_zeroshot", "world-clip")]
        filters = [("clip", "open_clip", "world-clip"), ("dino", "timm", "vit_small_patch14_dinov2.lvd142m")]
        sides = {"dino": (28, True), "resnet18": (64, False)}

    pre, window = unet_evals_per_image(gen, bench)
    branch = 2 * args.branch_batch if gen["guidance_scale"] > 1 else args.branch_batch
    out: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                           "torch": torch.__version__, "resolution": res, "dtype": str(dtype).split(".")[-1],
                           "unet_evals_per_image": {"prefix_batch_2": pre, f"window_batch_{branch}": window}}
    start = time.perf_counter()

    def dump() -> None:
        out["seconds"] = round(time.perf_counter() - start, 1)
        if args.out:
            Path(args.out).write_text(json.dumps(out, indent=1))

    gen_flops = None
    if "generate" in wanted:
        g = measure_generate(res, dtype, device, repeats, args.smoke, sorted({2, branch, *args.unet_batches}))
        unet = g["unet_eval"]
        gen_s = pre * unet[2]["seconds_per_image"] + window * unet[branch]["seconds_per_image"] \
            + g["vae_decode"]["seconds_per_image"]
        gen_flops = g["unet_flops_per_eval"] * (pre + window) + g["vae_flops"]
        out["generate"] = {"unet_eval_by_batch": {str(k): v for k, v in unet.items()}, "vae_decode": g["vae_decode"],
                           "seconds_per_image": round(gen_s, 4), "tflop_per_image": round(gen_flops / 1e12, 3),
                           "achieved_tflops": round(gen_flops / gen_s / 1e12, 1)}
        dump()
    if "precision" in wanted:
        fgrid = measure_precisions(filters, settings, batches, device, repeats, sides)
        image_models = [(n, "timm" if k == "timm" else "open_clip", m) for n, k, m in clfs]
        cgrid = measure_precisions(image_models, settings, batches, device, repeats, sides)
        out["precision"] = {"settings": [setting_name(*s) for s in settings], "batches": batches,
                            "filter": fgrid["seconds_per_image"], "classify": cgrid["seconds_per_image"],
                            "classify_models": len(image_models),
                            "by_model": {"filter": fgrid["by_model"], "classify": cgrid["by_model"]}}
        if "float32" in out["precision"]["settings"]:  # as before: float32 at the config's batch
            frows, crows = stage_rows(fgrid, "float32", batch), stage_rows(cgrid, "float32", batch)
            out["filter"] = {"models": frows, "batch": batch, "seconds_per_image": _total(frows)}
            out["classify"] = {"models": crows, "batch": batch, "seconds_per_image": _total(crows)}
        dump()
    zs = [m for _, k, m in clfs if k == "open_clip_zeroshot"]
    if "head" in wanted and zs:
        out["zero_shot_head"] = measure_zero_shot_head(max(zs, key=lambda m: ("L" in m, len(m))), device,
                                                       batch=8 if args.smoke else 1000, smoke=args.smoke)
        dump()
    if "sampler" in wanted:
        run_sampler_part(cfg, args, device, dtype, start, dump, out)
    if gen_flops is not None:  # the latency model's (pipeline.perf.latency) for the config's grid on an H100
        from pipeline.config import load_config
        from pipeline.perf.data import gpu_spec
        from pipeline.perf.latency import grid_seconds_per_image

        projected = grid_seconds_per_image(load_config(args.config), gpu_spec("h100"))
        out["projection_assumption"] = "pipeline.perf.latency on an H100 (pipeline/data/gpus.json's utilisations)"
        out["projected_seconds_per_image"] = {k: round(v["seconds"], 4) for k, v in projected.items()}
    dump()
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
