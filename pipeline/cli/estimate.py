"""``cnsbench estimate``: GPU-hours, wall time and cost of a build on N GPUs of a kind (no GPU needed)."""

from __future__ import annotations

import argparse
import sys

from pipeline.cli.options import add_set_argument, load_cli_config


def run(args: argparse.Namespace) -> int:
    from pipeline.perf.estimate import estimate, gpu_spec, gpu_table

    try:
        gpu_spec(args.gpu)
    except ValueError as err:
        print(f"cnsbench estimate: error: {err}", file=sys.stderr)
        for key, g in sorted(gpu_table().items()):
            print(f"  {key:<10} {g['name']} ({g['bf16_tflops']:g} TFLOP/s BF16, {g['memory_gib']:g} GiB)", file=sys.stderr)
        return 2
    if args.price_per_hour is not None and args.price_per_hour < 0:
        raise ValueError(f"--price-per-hour must not be negative, got {args.price_per_hour}")
    cfg = load_cli_config(args)
    est = estimate(cfg, args.gpu, args.gpus, args.price_per_hour)
    for line in est.lines():
        print(line)
    if est.generate_memory_gib > est.gpu["memory_gib"]:
        print(
            f"cnsbench estimate: error: the generate actor needs about {est.generate_memory_gib:.1f} GiB "
            f"({est.memory_detail}) but a {est.gpu['name']} has {est.gpu['memory_gib']:g} GiB; "
            "lower generator.branch_batch_size or choose a larger GPU",
            file=sys.stderr,
        )
        return 2
    return 0


def register(sub) -> None:
    s = sub.add_parser("estimate", help="GPU-hours, wall time and cost of a build on N GPUs (a latency model)")
    s.add_argument("config")
    s.add_argument("--gpu", required=True, help="GPU kind: h100, a100, l4, ... (pipeline/data/gpus.json)")
    s.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    s.add_argument("--price-per-hour", type=float, default=None, help="price of one GPU-hour, for the cost")
    add_set_argument(s)
    s.set_defaults(func=run)
