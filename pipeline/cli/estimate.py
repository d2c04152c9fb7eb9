"""``cnsbench estimate``: whether a build's actors fit N GPUs of a kind, and its GPU time, wall time
and cost there (a latency model; no GPU needed).  A config whose actors do not fit exits 2
before anything is printed, naming each actor, its projected GiB and the setting to change."""

from __future__ import annotations

import argparse
import math
import sys

from pipeline.cli.options import add_set_argument, load_cli_config


def _gpus(text: str) -> int:
    """``--gpus``: a whole number of GPUs, 1 to :data:`pipeline.perf.estimate.MAX_GPUS`."""
    from pipeline.perf.estimate import MAX_GPUS

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of GPUs, 1 to {MAX_GPUS:,}, not {text!r}") from None
    if not 1 <= n <= MAX_GPUS:
        raise argparse.ArgumentTypeError(f"a whole number of GPUs, 1 to {MAX_GPUS:,}, not {text!r}")
    return n


def _price(text: str) -> float:
    """``--price-per-hour``: a finite, non-negative price."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"a finite price >= 0 per GPU-hour, not {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    from pipeline.perf.estimate import DoesNotFit, estimate
    from pipeline.perf.data import gpu_spec, gpu_table

    try:
        gpu_spec(args.gpu)
    except ValueError as err:
        print(f"cnsbench estimate: error: {err}", file=sys.stderr)
        for key, g in sorted(gpu_table().items()):
            print(f"  {key:<10} {g['name']} ({g['bf16_tflops']:g} TFLOP/s BF16, {g['memory_gb']:g} GB)", file=sys.stderr)
        return 2
    cfg = load_cli_config(args)
    try:
        est = estimate(cfg, args.gpu, args.gpus, args.price_per_hour, config=args.config)
    except DoesNotFit as err:
        print(f"cnsbench estimate: error: {err}", file=sys.stderr)
        return 2
    for line in est.lines():
        print(line)
    return 0


def register(sub) -> None:
    s = sub.add_parser("estimate", help="whether a build fits N GPUs, and its GPU time, wall time and cost there")
    s.add_argument("config")
    s.add_argument("--gpu", required=True, help="GPU kind: h100, a100, l4, ... (pipeline/data/gpus.json)")
    s.add_argument("--gpus", type=_gpus, required=True, help="number of GPUs (1 to 100,000)")
    s.add_argument("--price-per-hour", type=_price, default=None, help="price of one GPU-hour, for the cost")
    add_set_argument(s)
    s.set_defaults(func=run)
