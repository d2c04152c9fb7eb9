"""Train the miniature world from scratch: ``python -m pipeline.demo.train_world --output assets/world``.

Measured runtime on the development machine (2 shared CPU cores, torch 2.14 CPU, one
thread per process, ``--jobs 2``): **16 min 33 s wall** from scratch (18 min CPU), of
which the diffusion model takes 7 min, sliders (30 of them) 4 min, the VAE 2-4 min, CLIP
2-3 min (in the side process), textual inversion, DINO and the classifiers about 1 min
each.  Other jobs on the same cores stretch the wall time (during development, stages
run under a load average of ~10 took about 3x their CPU time); ``world.json`` records
each stage's wall and CPU seconds.  The
output is 16.3 MB (fp16 weights where the loader upcasts).

What it trains (one module per stage in :mod:`pipeline.demo.train`; all seeded; data from :mod:`pipeline.demo.world_data`, architectures from
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
                 trainer (:func:`pipeline.train.run.train_sliders`, text-slider
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
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from pipeline.demo import world_data as W
from pipeline.demo import world_models as M
from pipeline.demo.train.calibrate import stage_calibrate
from pipeline.demo.train.classifiers import stage_classifiers
from pipeline.demo.train.clip import stage_clip
from pipeline.demo.train.common import (
    CALIBRATION,
    CLASSIFIER_SETTINGS,
    CLIP_SETTINGS,
    DIFFUSION_SETTINGS,
    DINO_SETTINGS,
    GENERATION,
    SIDE_STAGES,
    SLIDER_SETTINGS,
    STAGES,
    TOKEN_SETTINGS,
    VAE_SETTINGS,
    VERSION,
    Ctx,
)
from pipeline.demo.train.diffusion import stage_diffusion
from pipeline.demo.train.dino import stage_dino
from pipeline.demo.train.evaluate import stage_evaluate
from pipeline.demo.train.sliders import stage_sliders
from pipeline.demo.train.tokens import stage_tokens
from pipeline.demo.train.vae import stage_vae
from pipeline.io.safejson import dumps as strict_dumps

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
    (ctx.out / "world.json").write_text(strict_dumps(world, indent=1) + "\n")
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
