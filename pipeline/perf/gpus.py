"""The measured part of ``data/gpus.json``, from GPU runs of the benches: the UNet's and VAE's
utilisations and activation memory (``bench/latency.py``), the filter and classify stages'
utilisations and the sliders' window factor (``bench/rehearsal_gpu.py``).

``gpus.json`` has two parts.  ``gpus`` is published data: each GPU's peak dense BF16
throughput and memory, typed in from its datasheet with the source beside it (nothing
measures a datasheet).  ``utilisation`` is measured: the fraction of that peak each kind of
model work reaches.  This module writes it from the benches' JSON (a bench writes only its
own output)::

    python bench/latency.py --json > latency.json                      # on the GPU
    python bench/rehearsal_gpu.py --json --out rehearsal_gpu.json      # on the GPU
    python -m pipeline.perf.gpus --gpu h100 --latency latency.json --rehearsal rehearsal_gpu.json --write

From ``--latency`` (its bfloat16 entry): ``unet_by_images_per_forward`` (the UNet's FLOPs per
image over its seconds per image at each CFG batch it timed, over the peak),
``vae_decode`` (the same for one decode) and the activation memory per sample and per
decode.  From ``--rehearsal``, per stage (``filter``, ``classify``): the stage's TFLOP per
image (the sum of its models', each ``achieved_tflops x seconds_per_image`` as the bench
measured it) over its measured seconds per image and the peak; ``classifier`` / ``filter``
stay the float32 figures at the bench's batch; ``classifier_by_precision`` /
``filter_by_precision`` add each precision the bench ran (``cnsbench estimate`` projects a
stage at its configured precision's figure, float32's where that is missing:
:func:`pipeline.perf.latency.stage_utilisation`);
``slider_window_factor`` is the window forward with sliders over the bare one, from the
compiled sampler where it ran, else the eager one.  What a run does not give is kept.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pipeline.errors import CnsbenchError
from pipeline.perf.data import DATA, emit

FILE = DATA / "gpus.json"
STAGES = {"classify": "classifier", "filter": "filter"}


def _stage_tflop(stage: dict[str, Any], where: str) -> float:
    models = stage.get("models") or []
    if not models:
        raise CnsbenchError(f"{where}.models: no model measured")
    return sum(float(m["achieved_tflops"]) * float(m["seconds_per_image"]) for m in models)


def gpu_key(result: dict[str, Any], gpu: str, table: dict[str, dict]) -> str:
    """``gpu`` checked against ``table`` and against the device the run says it measured."""
    key = gpu.lower()
    if key not in table:
        raise CnsbenchError(f"--gpu {gpu!r}: unknown GPU; known: {', '.join(sorted(table))}")
    device = str(result.get("device", ""))
    if not device or device == "cpu":
        raise CnsbenchError(f"the run was measured on {device or 'no device'!r}, not a GPU: utilisations come from a GPU run")
    family = key.split("-")[0].upper()
    if family not in device.upper():
        raise CnsbenchError(f"--gpu {gpu}: the run was measured on {device!r}, which is no {family}")
    return key


def utilisations(result: dict[str, Any], peak_tflops: float) -> dict[str, Any]:
    """The measured utilisation entries of a ``bench/rehearsal_gpu.py --json`` result."""
    out: dict[str, Any] = {}
    for stage, name in STAGES.items():
        measured = result.get(stage)
        if not isinstance(measured, dict) or "seconds_per_image" not in measured:
            raise CnsbenchError(f"not a bench/rehearsal_gpu.py result: no {stage}.seconds_per_image")
        tflop = _stage_tflop(measured, stage)
        out[name] = round(tflop / float(measured["seconds_per_image"]) / peak_tflops, 4)
        by_setting = (result.get("precision") or {}).get(stage) or {}
        batch = str(measured.get("batch", ""))
        per = {s: round(tflop / float(v[batch]) / peak_tflops, 4)
               for s, v in by_setting.items() if isinstance(v, dict) and batch in v and float(v[batch]) > 0}
        if per:
            out[f"{name}_by_precision"] = per
    sampler = result.get("sampler") or {}
    for mode in ("compiled", "eager"):
        factor = (sampler.get(mode) or {}).get("slider_window_factor")
        if factor is not None:
            out["slider_window_factor"] = float(factor)
            out["slider_window_mode"] = mode
            break
    return out


def generation_utilisations(result: dict[str, Any], peak_tflops: float) -> dict[str, Any]:
    """The UNet and VAE entries of a ``bench/latency.py --json`` result (its bfloat16 run)."""
    runs = [u for u in result.get("unet") or () if u.get("dtype") == "bfloat16"]
    if not runs:
        raise CnsbenchError("not a bench/latency.py result with a bfloat16 UNet run (unet[].dtype)")
    u = runs[0]
    flop_per_image = float(u["unet_gflop_per_eval_cfg2"]) * 1e9  # CFG batch of 2 = one image
    seconds = {"1": float(u["seconds_per_unet_eval_cfg2"])}
    seconds.update({str(n): float(s) for n, s in (u.get("seconds_per_image_eval_by_batch") or {}).items()})
    out: dict[str, Any] = {
        "unet_by_images_per_forward": {
            n: round(flop_per_image / s / (peak_tflops * 1e12), 4) for n, s in sorted(seconds.items(), key=lambda kv: int(kv[0]))
        },
        "vae_decode": round(float(u["vae_gflop_per_decode"]) * 1e9 / float(u["seconds_per_vae_decode"]) / (peak_tflops * 1e12), 4),
    }
    memory = u.get("activation_memory_gib") or {}
    if "unet_gib_per_sample" in memory:
        out["unet_activation_gib_per_sample"] = round(float(memory["unet_gib_per_sample"]), 3)
    if "vae_decode" in memory:
        out["vae_decode_activation_gib_per_image"] = round(float(memory["vae_decode"]), 3)
    return out


def with_latency(data: dict[str, Any], result: dict[str, Any], gpu: str) -> dict[str, Any]:
    """``data`` (gpus.json's contents) with the UNet and VAE figures ``result`` measured on ``gpu``."""
    key = gpu_key(result, gpu, data["gpus"])
    util = {**data["utilisation"], **generation_utilisations(result, float(data["gpus"][key]["bf16_tflops"]))}
    util["source"] = (
        f"bench/latency.py on an {result['device']} (random weights, bf16): achieved TFLOP/s / "
        f"{data['gpus'][key]['bf16_tflops']} (the {key}'s peak)")
    return {**data, "utilisation": util}


def with_rehearsal(data: dict[str, Any], result: dict[str, Any], gpu: str) -> dict[str, Any]:
    """``data`` (gpus.json's contents) with the utilisations measured by ``result`` on ``gpu``."""
    key = gpu_key(result, gpu, data["gpus"])
    measured = utilisations(result, float(data["gpus"][key]["bf16_tflops"]))
    util = {**data["utilisation"], **measured}
    util["float32_source"] = (
        f"bench/rehearsal_gpu.py on an {result['device']} (torch {result.get('torch', '?')}): the classify and "
        f"filter stages' TFLOP per image over their measured seconds per image at a batch of "
        f"{result['classify'].get('batch')}, over the {key}'s {data['gpus'][key]['bf16_tflops']} TFLOP/s")
    if "slider_window_factor" in measured:
        util["slider_window_source"] = (
            f"bench/rehearsal_gpu.py on an {result['device']}: the {measured['slider_window_mode']} sampler's window forward "
            f"with one slider per row over the bare UNet's, {result.get('resolution')} px, {result.get('dtype')}")
    return {**data, "utilisation": util}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.perf.gpus", description=__doc__.splitlines()[0])
    p.add_argument("--gpu", required=True, help="the GPU kind the runs measured (a key of gpus.json: h100, h200, ...)")
    p.add_argument("--latency", help="the JSON printed by `python bench/latency.py --json` on that GPU")
    p.add_argument("--rehearsal", help="the JSON written by `python bench/rehearsal_gpu.py --json --out FILE` on that GPU")
    p.add_argument("--write", action="store_true", help="write pipeline/data/gpus.json (else print it)")
    p.add_argument("--file", default=str(FILE), help=argparse.SUPPRESS)  # tests write elsewhere
    args = p.parse_args(argv)
    if not (args.latency or args.rehearsal):
        p.error("give --latency FILE, --rehearsal FILE or both")
    target = Path(args.file)
    doc = json.loads(target.read_text())
    for path, update in ((args.latency, with_latency), (args.rehearsal, with_rehearsal)):
        if not path:
            continue
        try:
            doc = update(doc, json.loads(Path(path).read_text()), args.gpu)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"python -m pipeline.perf.gpus: {path}: {exc}", file=sys.stderr)
            return 2
    return emit(target, doc, args.write)


if __name__ == "__main__":
    sys.exit(main())
