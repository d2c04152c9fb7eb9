"""Rehearse the paper's benchmark at the real model sizes, offline, on random weights.

    python bench/rehearsal.py make-cache /tmp/rh                 # every model configs/cns_bench.yaml names
    python bench/rehearsal.py run --cache /tmp/rh --output /tmp/rh-out --json
    python bench/rehearsal.py startup --cache /tmp/rh --json     # each stage actor's start-up

``make-cache`` writes random-weight models with the real architectures in the real file
layouts (:mod:`rehearsal_cache`): a Hugging Face hub cache under ``DIR/hub`` and the CNS
release's files (ImageNet* text encoder, sliders) under ``DIR/cns``.

``run`` builds the config with ``cnsbench build --set ...`` on the Ray executor, fully
offline (``HF_HUB_OFFLINE=1``, ``HF_HOME=DIR``, ``TORCH_HOME=DIR/torch``), changing only
the plan size (1 class, 1 seed, 2 shifts, scales 0 and 2.5), the step count, where the
release's files lie (``DIR/cns``), and the classifier list: classifiers that cannot run
from the cache are left out and listed in ``classifiers_unavailable`` with the reason and
the command that makes them available.  Resolution and dtype stay the config's.  It
prints one JSON object: per stage the seconds, every actor's peak RSS (MB) and CPU
seconds, the parameters of each model the stage loads (millions) and the projected
memory; ``classifiers_ran``, ``classifiers_unavailable`` and ``images``.

``startup`` measures each stage actor's start-up in a fresh process on the cache
(:mod:`rehearsal_startup`): its imports, then each of its models loaded by the stage's own
code; ``python -m pipeline.perf.startup --write`` turns its JSON into ``pipeline/data/startup.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from rehearsal_cache import SD2, make_cache, open_clip_repo, torch_hub_reason  # noqa: E402
from rehearsal_hub import snapshot_files  # noqa: E402
from rehearsal_measure import ActorWatch, safetensors_params  # noqa: E402

CONFIG = ROOT / "configs" / "cns_bench.yaml"
MB = 1024**2
STAGE_NAMES = {"GenerateStage": "generate", "FilterStage": "filter", "ClassifyStage": "classify", "WriteStage": "write"}


def cache_env(cache: str | os.PathLike[str]) -> dict[str, str]:
    """The environment of a build that reads only ``cache``."""
    cache = str(Path(cache).resolve())
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "HF_TOKEN")}
    env.update(HF_HOME=cache, HF_HUB_CACHE=os.path.join(cache, "hub"), TORCH_HOME=os.path.join(cache, "torch"),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    return env


def release_sets(cache: Path) -> list[str]:
    """Where the CNS release's files lie in the cache (the config's ``Files to provide``)."""
    return [f"generator.class_tokens.path={cache / 'cns' / 'imagenet_star'}",
            f"generator.slider_store={cache / 'cns' / 'sliders'}"]


def plan_sets(cfg, steps: int) -> list[str]:
    """The plan-size and step-count overrides: 1 class, 1 seed, 2 shifts, scales 0 and 2.5."""
    classes = cfg.benchmark.classes[:1]
    shifts = cfg.benchmark.shifts[:2]
    return [f"benchmark.classes={json.dumps(classes)}", "benchmark.seeds=[1]",
            f"benchmark.shifts={json.dumps(shifts)}", "benchmark.scales=[0, 2.5]", f"generator.steps={steps}"]


def zero_shot_reason(spec, cache: Path) -> dict[str, str]:
    """Why a zero-shot classifier is not run on a CPU rehearsal: the size of its head."""
    from open_clip import zero_shot_metadata as meta

    repo, filename = open_clip_repo(spec.model, spec.checkpoint)
    files = snapshot_files(cache, repo)
    text = safetensors_params(files[filename], prefix="transformer.") if filename in files else 0
    prompts = 1000 * len(meta.OPENAI_IMAGENET_TEMPLATES)
    tflop = 2 * text * prompts * 77 / 1e12
    return {
        "reason": (f"runs offline from this cache, but its zero-shot head encodes {prompts} prompts (1000 classes x "
                   f"{len(meta.OPENAI_IMAGENET_TEMPLATES)} templates, 77 tokens) with a {text / 1e6:.0f} M-parameter "
                   f"text tower, {tflop:.0f} TFLOP: hours on a CPU, seconds on a GPU"),
        "fetch": "nothing to fetch; run the rehearsal with --zero-shot on a machine with a GPU",
    }


def split_classifiers(cfg, cache: Path, zero_shot: bool) -> tuple[list[Any], dict[str, dict[str, str]]]:
    """(classifier specs that run from the cache, name -> {reason, fetch} of the others)."""
    runnable, unavailable = [], {}
    for spec in cfg.classifiers:
        if spec.kind == "torch_hub" and not os.path.isdir(spec.model.rpartition(":")[0]):
            reason, fetch = torch_hub_reason(spec)
            unavailable[spec.name] = {"reason": reason, "fetch": fetch.replace("<cache>", str(cache))}
        elif spec.kind == "open_clip_zeroshot" and not zero_shot:
            unavailable[spec.name] = zero_shot_reason(spec, cache)
        else:
            runnable.append(spec)
    return runnable, unavailable


# --------------------------------------------------------------------------- model sizes
def stage_models(cfg, cache: Path) -> dict[str, dict[str, float]]:
    """Parameters (millions) of every model each stage loads, from the cached files' headers."""
    from timm.models import get_pretrained_cfg

    def hub_params(repo: str, names: tuple[str, ...]) -> float:
        files = snapshot_files(cache, repo)
        return round(sum(safetensors_params(p) for f, p in files.items() if f.endswith(names)) / 1e6, 1)

    sd = snapshot_files(cache, SD2)
    own_text = cfg.generator.class_tokens.kind != "text_encoder_dir"  # else SD2's is not loaded
    generate = {f"{part}": round(safetensors_params(sd[f]) / 1e6, 1) for f in sd
                for part in [f.split("/")[0]] if f.endswith(".safetensors") and (own_text or part != "text_encoder")}
    star = Path(cfg.generator.class_tokens.path or "") / "text_encoder" / "model.safetensors"
    if star.is_file():
        generate["imagenet_star_text_encoder"] = round(safetensors_params(star) / 1e6, 1)
    flt = cfg.filter
    filt = {flt.clip.model: hub_params(open_clip_repo(flt.clip.model, flt.clip.pretrained)[0], (".safetensors",)),
            flt.dino.model: hub_params(get_pretrained_cfg(flt.dino.model).hf_hub_id, ("model.safetensors",))}
    classify = {}
    for spec in cfg.classifiers:
        if spec.kind == "timm":
            classify[spec.name] = hub_params(get_pretrained_cfg(spec.model).hf_hub_id, ("model.safetensors",))
        elif spec.kind == "open_clip_zeroshot":
            classify[spec.name] = hub_params(open_clip_repo(spec.model, spec.checkpoint)[0], (".safetensors",))
    return {"generate": generate, "filter": filt, "classify": classify}


def projected_memory(cfg) -> dict[str, Any]:
    """Projected actor memory (MB) per stage on the CPU (:func:`pipeline.perf.memory.project_stage_memory`);
    classify: one entry per classifier group."""
    from pipeline.perf import memory
    out: dict[str, Any] = {k: (round(v / MB) if v else None)
                           for k, v in memory.project_stage_memory(cfg, device="cpu").items()}
    feet = memory.classifier_footprints(cfg)
    out["classify"] = [round(memory.group_bytes([feet[i] for i in g]) / MB) for g in memory.classifier_groups(cfg)]
    return out


def gpu_projection(args: argparse.Namespace, cache: Path) -> dict[str, Any]:
    """Projected H100 GPU seconds per image of the paper's grid at the config's own size: the
    project's latency model (:mod:`pipeline.perf.latency`, its UNet evaluations counted by
    :mod:`pipeline.perf.evals`)."""
    from pipeline.config import load_config
    from pipeline.perf.data import gpu_spec
    from pipeline.perf.latency import grid_seconds_per_image

    full = load_config(args.config, sets=list(args.set or []) + release_sets(cache))
    grid = grid_seconds_per_image(full, gpu_spec("h100"))
    return {"model": "pipeline.perf.latency on an h100 (pipeline/data/gpus.json)",
            "unet_evals_per_image": round(grid["generate"]["unet_evals"], 2),
            **{stage: {"tflop_per_image": round(v["tflop"], 3), "gpu_seconds_per_image": round(v["seconds"], 4)}
               for stage, v in grid.items()}}


def machine() -> str:
    """This machine in words: CPU model and cores."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU")
    return f"{os.cpu_count()}-core {model}, no GPU"


ZERO_SHOT_HEAD = (25.4, 'bench/rehearsal_gpu.py on an NVIDIA H200 (BENCHMARKS.md, "Model stages at real size on a GPU '
                  '(H200): measured against the FLOP projection"): the text tower of one zero-shot head of ViT-L/14-336 '
                  "(80 000 prompts), the largest of the config's")


def startup(args: argparse.Namespace) -> dict[str, Any]:
    """Each stage actor's start-up on the cache (:mod:`rehearsal_startup`, a fresh process per stage)."""
    import tempfile

    from pipeline.config import load_config

    cache = Path(args.cache).resolve()
    sets = list(args.set or []) + release_sets(cache)
    runnable, unavailable = split_classifiers(load_config(args.config, sets=sets), cache, zero_shot=False)
    sets.append("classifiers=" + json.dumps([s.model_dump(mode="json", exclude_defaults=True) for s in runnable]))
    env = cache_env(cache)
    actors: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rh-startup-") as tmp:
        for stage in args.stages:
            job = Path(tmp) / f"{stage}.json"
            job.write_text(json.dumps({"stage": stage, "config": str(args.config), "sets": sets, "started": time.time()}))
            proc = subprocess.run([sys.executable, str(HERE / "rehearsal_startup.py"), str(job)], env=env, cwd=ROOT,
                                  capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"start-up of {stage} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
            actors[stage] = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "command": "python bench/rehearsal.py startup --cache DIR --json",
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "actors": actors,
        "classifiers_unavailable": sorted(unavailable),
        "zero_shot_head_s": ZERO_SHOT_HEAD[0],
        "zero_shot_head_source": ZERO_SHOT_HEAD[1],
    }


# --------------------------------------------------------------------------- run
def build_command(config: str, output: str, sets: list[str], runner: str = "ray") -> list[str]:
    cmd = [sys.executable, "-m", "pipeline.cli", "build", config, "--output", output, "--runner", runner]
    for item in sets:
        cmd += ["--set", item]
    return cmd


def read_predictions(output: str) -> tuple[int, list[str]]:
    """(images, classifiers) with predictions in the output's ``predictions/*.parquet``."""
    import pyarrow.parquet as pq

    samples: set[str] = set()
    names: dict[str, None] = {}
    for f in sorted((Path(output) / "predictions").glob("*.parquet")):
        table = pq.read_table(f, columns=["sample_id", "classifier"])
        samples.update(table.column("sample_id").to_pylist())
        names.update(dict.fromkeys(table.column("classifier").to_pylist()))
    return len(samples), list(names)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pipeline.config import load_config

    cache = Path(args.cache).resolve()
    base = load_config(args.config, sets=list(args.set or []))
    sets = list(args.set or []) + plan_sets(base, args.steps) + release_sets(cache)
    if args.budget_gb and base.resources.classify.memory_budget_gb is None:
        sets.append(f"resources.classify.memory_budget_gb={args.budget_gb}")
    if args.resolution:
        sets.append(f"generator.resolution={args.resolution}")
    cfg0 = load_config(args.config, sets=sets)
    runnable, unavailable = split_classifiers(cfg0, cache, args.zero_shot)
    specs = [s.model_dump(mode="json", exclude_defaults=True) for s in runnable]
    sets.append("classifiers=" + json.dumps(specs))
    cfg = load_config(args.config, sets=sets)
    env = cache_env(cache)
    os.environ.update({k: env[k] for k in ("HF_HOME", "HF_HUB_CACHE", "TORCH_HOME", "HF_HUB_OFFLINE")})
    cmd = build_command(str(args.config), str(args.output), sets, args.runner)
    log = open(Path(args.output).with_suffix(".log"), "w") if args.log is None else open(args.log, "w")
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    watch = ActorWatch(proc.pid).start()
    rc = proc.wait()
    watch.stop()
    wall = time.monotonic() - start
    log.close()
    if rc != 0:
        tail = Path(log.name).read_text()[-4000:]
        raise SystemExit(f"rehearsal build failed (exit {rc}); {log.name} ends with:\n{tail}")
    models = stage_models(cfg, cache)
    projected = projected_memory(cfg)
    names = {s.name for s in runnable}
    models["classify"] = {k: v for k, v in models["classify"].items() if k in names}
    stages: dict[str, Any] = {
        stage: {"models_params_m": models.get(stage, {}), "projected_mb": projected.get(stage)}
        for stage in STAGE_NAMES.values()
    }
    for cls, actors in sorted(watch.by_stage().items()):  # Ray actors (none with --runner local)
        busy = [a for a in actors if a.first_busy is not None]
        seconds = (max(a.last_busy for a in busy) - min(a.first_busy for a in busy)) if busy else 0.0
        entry = stages.setdefault(STAGE_NAMES.get(cls, cls), {})
        peaks = [round(a.peak_rss / MB) for a in sorted(actors, key=lambda a: a.pid)]
        entry.update({"seconds": round(seconds, 1), "cpu_seconds": round(sum(a.cpu_seconds for a in actors), 1),
                      "actors_peak_rss_mb": peaks})
        projected_mb = entry.get("projected_mb")
        if projected_mb:  # measured / projected, actor by actor (classify: sorted, group sizes sorted)
            proj = sorted(projected_mb) if isinstance(projected_mb, list) else [projected_mb] * len(peaks)
            if len(proj) == len(peaks):
                entry["measured_over_projected"] = [round(m / p, 2) for m, p in zip(sorted(peaks), sorted(proj))]
    images, ran = read_predictions(args.output)
    return {
        "config": str(args.config),
        "sets": sets[: len(sets) - 1],
        "resolution": cfg.generator.resolution,
        "steps": cfg.generator.steps,
        "wall_seconds": round(wall, 1),
        "stages": stages,
        "classifiers_ran": ran,
        "classifiers_unavailable": unavailable,
        "images": images,
        "gpu_projection": gpu_projection(args, cache) if args.project else None,
    }


def markdown_table(result: dict[str, Any]) -> str:
    """The measured table of docs/rehearsal.md from a ``run --json`` result."""
    proj = result.get("gpu_projection") or {}
    lines = ["| stage | models (M parameters) | actors' peak RSS (MB) | projected (MB) | seconds | CPU seconds "
             "| projected H100 s/image (paper grid) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for stage in ("generate", "filter", "classify", "write"):
        st = result["stages"].get(stage, {})
        models = st.get("models_params_m") or {}
        total = sum(models.values())
        named = ", ".join(f"{k} {v:g}" for k, v in models.items()) if len(models) <= 4 else f"{len(models)} models"
        gpu = proj.get(stage, {}).get("gpu_seconds_per_image", "")
        lines.append(f"| {stage} | {named}{f' (total {total:.0f})' if models else ''} | "
                     f"{', '.join(map(str, st.get('actors_peak_rss_mb', [])))} | {st.get('projected_mb')} | "
                     f"{st.get('seconds', '')} | {st.get('cpu_seconds', '')} | {gpu} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    mk = sub.add_parser("make-cache", help="write the random-weight model cache")
    mk.add_argument("dir")
    mk.add_argument("--config", default=str(CONFIG))
    mk.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override (as cnsbench --set)")
    mk.add_argument("--width", choices=("full", "small"), default="full", help="small: narrow SD2 (tests)")
    r = sub.add_parser("run", help="build the config offline from the cache and measure it")
    r.add_argument("--cache", required=True)
    r.add_argument("--output", required=True)
    r.add_argument("--config", default=str(CONFIG))
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="further overrides (tests: smaller models)")
    r.add_argument("--steps", type=int, default=2)
    r.add_argument("--resolution", type=int, default=None, help="default: the config's")
    r.add_argument("--budget-gb", type=float, default=6.0,
                   help="resources.classify.memory_budget_gb when the config sets none (classifier groups)")
    r.add_argument("--runner", choices=("ray", "local"), default="ray", help="local: in one process (tests)")
    r.add_argument("--zero-shot", action="store_true", help="run the open_clip zero-shot classifiers (a GPU's job)")
    r.add_argument("--no-project", dest="project", action="store_false", help="skip the FLOP-based GPU projection")
    r.add_argument("--log", help="build log (default: OUTPUT.log)")
    r.add_argument("--json", action="store_true")
    t = sub.add_parser("table", help="the markdown table of a run's JSON result")
    t.add_argument("result")
    su = sub.add_parser("startup", help="each stage actor's imports and model loading, from the cache")
    su.add_argument("--cache", required=True)
    su.add_argument("--config", default=str(CONFIG))
    su.add_argument("--set", action="append", metavar="KEY=VALUE", help="further overrides (tests: smaller models)")
    su.add_argument("--stages", nargs="+", default=["generate", "filter", "classify", "write"],
                    choices=["generate", "filter", "classify", "write"])
    su.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":  # before anything reads the hub cache location
        env = cache_env(args.cache)
        os.environ.update({k: env[k] for k in ("HF_HOME", "HF_HUB_CACHE", "TORCH_HOME", "HF_HUB_OFFLINE")})
    if args.command == "make-cache":
        result = make_cache(args.config, args.dir, sets=args.set, width=args.width, log=lambda m: print(m, file=sys.stderr))
        print(json.dumps(result, indent=2))
        return 0
    if args.command == "table":
        print(markdown_table(json.loads(Path(args.result).read_text())))
        return 0
    if args.command == "startup":
        print(json.dumps(startup(args), indent=None if args.json else 2))
        return 0
    if args.steps < 2:
        raise SystemExit("--steps must be at least 2")
    result = run(args)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
