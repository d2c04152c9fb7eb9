"""The measured part of ``data/gpus.json``: the utilisations of the filter and classify stages
and the sliders' window factor, from a GPU run of ``bench/rehearsal_gpu.py``.

``gpus.json`` has two parts.  ``gpus`` is published data: each GPU's peak dense BF16
throughput and memory, typed in from its datasheet with the source beside it (nothing
measures a datasheet).  ``utilisation`` is measured: the fraction of that peak each kind of
model work reaches.  This module writes the stage utilisations and the slider factor into it
from the bench's JSON (the bench writes only its own output)::

    python bench/rehearsal_gpu.py --json --out rehearsal_gpu.json      # on the GPU
    python -m pipeline.perf.gpus rehearsal_gpu.json --gpu h100 --write

Per stage (``filter``, ``classify``) the utilisation is the stage's TFLOP per image (the sum of
its models', each ``achieved_tflops x seconds_per_image`` as the bench measured it) divided by
its measured seconds per image and the GPU's peak.  ``classifier`` / ``filter`` stay the float32
figures at the bench's batch (what ``cnsbench estimate`` reads); ``classifier_by_precision`` /
``filter_by_precision`` add each precision the bench ran.  ``slider_window_factor`` is the
window forward with sliders over the bare one, from the compiled sampler where it ran, else
the eager one.  The UNet and VAE figures (``bench/latency.py``) are left as they are.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pipeline.perf.data import DATA, emit

FILE = DATA / "gpus.json"
STAGES = {"classify": "classifier", "filter": "filter"}


def _stage_tflop(stage: dict[str, Any], where: str) -> float:
    models = stage.get("models") or []
    if not models:
        raise ValueError(f"{where}.models: no model measured")
    return sum(float(m["achieved_tflops"]) * float(m["seconds_per_image"]) for m in models)


def gpu_key(result: dict[str, Any], gpu: str, table: dict[str, dict]) -> str:
    """``gpu`` checked against ``table`` and against the device the run says it measured."""
    key = gpu.lower()
    if key not in table:
        raise ValueError(f"--gpu {gpu!r}: unknown GPU; known: {', '.join(sorted(table))}")
    device = str(result.get("device", ""))
    if not device or device == "cpu":
        raise ValueError(f"the run was measured on {device or 'no device'!r}, not a GPU: utilisations come from a GPU run")
    family = key.split("-")[0].upper()
    if family not in device.upper():
        raise ValueError(f"--gpu {gpu}: the run was measured on {device!r}, not an {family}")
    return key


def utilisations(result: dict[str, Any], peak_tflops: float) -> dict[str, Any]:
    """The measured utilisation entries of a ``bench/rehearsal_gpu.py --json`` result."""
    out: dict[str, Any] = {}
    for stage, name in STAGES.items():
        measured = result.get(stage)
        if not isinstance(measured, dict) or "seconds_per_image" not in measured:
            raise ValueError(f"not a bench/rehearsal_gpu.py result: no {stage}.seconds_per_image")
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


def with_run(data: dict[str, Any], result: dict[str, Any], gpu: str, command: str) -> dict[str, Any]:
    """``data`` (gpus.json's contents) with the utilisations measured by ``result`` on ``gpu``."""
    key = gpu_key(result, gpu, data["gpus"])
    measured = utilisations(result, float(data["gpus"][key]["bf16_tflops"]))
    util = {**data["utilisation"], **measured}
    util["float32_source"] = (
        f"bench/rehearsal_gpu.py on an {result['device']} (`{command}`, torch {result.get('torch', '?')}): the classify and "
        f"filter stages' TFLOP per image over their measured seconds per image at a batch of "
        f"{result['classify'].get('batch')}, over the {key}'s {data['gpus'][key]['bf16_tflops']} TFLOP/s")
    if "slider_window_factor" in measured:
        util["slider_window_source"] = (
            f"bench/rehearsal_gpu.py on an {result['device']}: the {measured['slider_window_mode']} sampler's window forward "
            f"with one slider per row over the bare UNet's, {result.get('resolution')} px, {result.get('dtype')}")
    return {**data, "utilisation": util}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.perf.gpus", description=__doc__.splitlines()[0])
    p.add_argument("result", help="the JSON written by `python bench/rehearsal_gpu.py --json --out FILE` on a GPU")
    p.add_argument("--gpu", required=True, help="the GPU kind the run measured (a key of gpus.json: h100, h200, ...)")
    p.add_argument("--write", action="store_true", help="write pipeline/data/gpus.json (else print it)")
    p.add_argument("--file", default=str(FILE), help=argparse.SUPPRESS)  # tests write elsewhere
    args = p.parse_args(argv)
    target = Path(args.file)
    try:
        result = json.loads(Path(args.result).read_text())
        doc = with_run(json.loads(target.read_text()), result, args.gpu, f"python -m pipeline.perf.gpus {args.result}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"python -m pipeline.perf.gpus: {args.result}: {exc}", file=sys.stderr)
        return 2
    return emit(target, doc, args.write)


if __name__ == "__main__":
    sys.exit(main())
