"""Per-row sliders at a constant cost: aten ops and CPU time of one UNet forward, bare and
with 1, 2, 4, 8 and 16 distinct sliders in a batch of 16 rows.

The UNet is SD2-shaped with random weights; the bank (``pipeline.models.lora.SliderBank``)
holds 16 random sliders (rank 4, alpha 1) and each row gets slider ``i % n`` at its own
nonzero multiplier.  Ops are counted with a ``TorchDispatchMode`` on one forward (every
aten op dispatched, views included, under ``torch.no_grad``); time is the fastest of ``--repeats`` forwards after
a warm-up, the cases interleaved so that a change of the machine's load falls on all of
them, on ``--threads`` CPU threads (default 1: with two threads on a shared 2-core machine
the fastest of 20 timings still varied 2-4x from run to run); the process's CPU time is
reported beside the wall time.

    python bench/slider_ops.py --json                    # size small (SD2 layout, 64..256 channels, 16x16 latent)
    python bench/slider_ops.py --size tiny --repeats 1 --json   # the test suite's size

Prints one JSON object: ``ops_bare``, ``ops_by_sliders`` (keys "1", "2", "4", "8", "16"),
``seconds_bare``, ``seconds_by_sliders``, ``wall_ratio`` (16 distinct sliders over bare)
and ``cpu_time_ratio`` (the same in process CPU time),
and ``contract_ok``: ``ops_by_sliders["16"] <= 1.05 * ops_by_sliders["1"]`` and
``ops_by_sliders["1"] <= 1.5 * ops_bare``; the exit status is 1 when it does not hold.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROWS = 16
DISTINCT = (1, 2, 4, 8, 16)

# "small": the SD2 UNet's layout (pipeline.demo.tiny_sd.ARCH["full"]: 4 blocks, 2 layers each,
# cross-attention in the first 3, 64-channel heads, 1024-wide text states) at a quarter of its
# width, on a 16x16 latent.
SMALL = dict(sample_size=16, block_out_channels=(64, 128, 256, 256), attention_head_dim=(1, 2, 4, 4))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=("tiny", "small"), default="small")
    p.add_argument("--targets", choices=("attn", "attn_conv"), default="attn",
                   help="slider module set (attn: the shipped world's sliders; attn_conv: CNS-Bench's)")
    p.add_argument("--repeats", type=int, default=5, help="timed forwards per case after a warm-up (the fastest counts)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1: on a shared machine other load stalls multi-threaded ops)")
    p.add_argument("--json", action="store_true")
    return p


def unet_config(size: str) -> dict:
    from pipeline.demo.tiny_sd import ARCH

    return dict(ARCH["tiny"]["unet"]) if size == "tiny" else {**ARCH["full"]["unet"], **SMALL}


def count_ops(fn) -> int:
    """Aten ops dispatched by ``fn()`` (each op of every tensor, views included)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counter.count += 1
            return func(*args, **(kwargs or {}))

    with Counter():
        fn()
    return Counter.count


def fastest(cases: dict, repeats: int) -> tuple[dict, dict]:
    """Fastest wall and CPU seconds of each ``setup(); fn()`` case, the cases taken in turn."""
    wall = {k: float("inf") for k in cases}
    cpu = dict(wall)
    for round_ in range(repeats + 1):  # round 0 warms up
        for key, (setup, fn) in cases.items():
            setup()
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            if round_ > 0 or repeats == 0:
                wall[key] = min(wall[key], time.perf_counter() - t0)
                cpu[key] = min(cpu[key], time.process_time() - c0)
    return wall, cpu


def main(argv: list[str] | None = None) -> dict:
    args = _parser().parse_args(argv)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        result = measure(args)
    finally:
        torch.set_num_threads(threads)  # the suite calls main() in its own process
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    if not result["contract_ok"]:
        raise SystemExit(1)
    return result


def measure(args) -> dict:
    import torch
    from diffusers import UNet2DConditionModel

    from pipeline.models.lora import SliderBank, random_slider

    torch.manual_seed(0)
    config = unet_config(args.size)
    unet = UNet2DConditionModel(in_channels=4, out_channels=4, **config).eval()
    gen = torch.Generator().manual_seed(0)
    side = config["sample_size"]
    x = torch.randn(ROWS, 4, side, side, generator=gen)
    emb = torch.randn(ROWS, 77, config["cross_attention_dim"], generator=gen)
    t = torch.tensor(500)

    def forward():
        with torch.no_grad():  # as the counts were taken; inference_mode dispatches fewer ops
            unet(x, t, encoder_hidden_states=emb)

    bank = SliderBank(unet, capacity=max(DISTINCT))
    names = [f"slider_{i:02d}" for i in range(max(DISTINCT))]
    for i, name in enumerate(names):
        bank.add(name, random_slider(unet, rank=4, targets=args.targets, seed=i, std=0.05))
    mults = [0.5 + 0.25 * i for i in range(ROWS)]

    def route(n: int):
        return lambda: bank.route([names[i % n] for i in range(ROWS)], mults)

    bank.clear_route()
    ops_bare = count_ops(forward)
    ops = {}
    for n in DISTINCT:
        route(n)()
        ops[str(n)] = count_ops(forward)
    cases = {"bare": (bank.clear_route, forward), "1": (route(1), forward), "16": (route(16), forward)}
    wall, cpu = fastest(cases, args.repeats)
    bank.detach()

    ok = ops["16"] <= 1.05 * ops["1"] and ops["1"] <= 1.5 * ops_bare
    return {
        "size": args.size,
        "targets": args.targets,
        "rows": ROWS,
        "slider_rank": 4,
        "adapted_layers": sum(1 for k in random_slider(unet, rank=1, targets=args.targets) if k.endswith(".alpha")),
        "ops_bare": ops_bare,
        "ops_by_sliders": ops,
        "seconds_bare": wall["bare"],
        "seconds_by_sliders": {"1": wall["1"], "16": wall["16"]},
        "wall_ratio": wall["16"] / wall["bare"],
        "cpu_seconds_bare": cpu["bare"],
        "cpu_seconds_by_sliders": {"1": cpu["1"], "16": cpu["16"]},
        "cpu_time_ratio": cpu["16"] / cpu["bare"],
        "torch_threads": torch.get_num_threads(),
        "contract_ok": ok,
    }


if __name__ == "__main__":
    main()
