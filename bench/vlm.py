"""VLM classifier throughput: batched generation vs the same model asked one image at a time.

A LLaVA (``LlavaForConditionalGeneration``: CLIP vision tower, Llama) of the given size is
built with random weights (:mod:`pipeline.demo.tiny_vlm`), saved and loaded by the ``vlm``
classifier (:class:`pipeline.models.vlm.VLMClassifier`) exactly as a build loads one.  The
same images are answered twice in this process with the ``two_choice`` protocol: batched
(``--batch`` images per ``generate`` call, left padding) and one image per call.  Both use
the per-sample seeds, so they generate the same answers (checked) and the same tokens.

    python bench/vlm.py --json                                   # CPU, the default size
    python bench/vlm.py --device cuda --images 256 --batch 64 --json

Prints one JSON object (``--json``): images/s of both, the speed-up, and whether the
answers agree.  Rates are per second of this process's CPU time by default (``--clock
cpu``: a busy shared machine changes them little); ``--clock wall`` on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _clock(kind: str):
    return time.process_time if kind == "cpu" else time.perf_counter


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32, help="images per generate() call when batched")
    parser.add_argument("--hidden", type=int, default=256, help="width of the vision tower and the language model")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=112)
    parser.add_argument("--patch", type=int, default=14)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    import numpy as np
    import torch
    from PIL import Image

    import pipeline.models.vlm as V
    from pipeline.config import VLMSpec
    from pipeline.demo.tiny_vlm import build_tiny_llava
    from pipeline.labels import label_space
    from pipeline.models.vqa_protocols import IMAGENET_D_PROMPT

    torch.set_num_threads(1)
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    h, layers = args.hidden, args.layers
    size = {"hidden_size": h, "intermediate_size": 4 * h, "num_hidden_layers": layers, "num_attention_heads": max(1, h // 64)}
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_llava(Path(tmp) / "llava", [IMAGENET_D_PROMPT, *names], image_size=args.image_size,
                                patch_size=args.patch, vision=size, text={**size, "num_key_value_heads": size["num_attention_heads"]})
        spec = VLMSpec(name="vlm", kind="vlm", model=str(path), dtype=args.dtype, protocol={
            "kind": "two_choice", "distractors": "ranker", "temperature": 1.0, "max_new_tokens": args.new_tokens})
        clf = V.VLMClassifier(spec, args.device, label_space(names))
        rng = np.random.default_rng(0)
        images = [Image.fromarray(rng.integers(0, 256, (args.image_size, args.image_size, 3), dtype=np.uint8))
                  for _ in range(args.images)]
        truth = [i % 10 for i in range(args.images)]
        sids = [f"bench/{i:05d}" for i in range(args.images)]
        ranked = {"ranker": [[(t + 1) % 10, t] for t in truth]}
        clock = _clock(args.clock)
        clf.answer(images[:2], truth[:2], sids[:2], [None, None], {"ranker": ranked["ranker"][:2]})  # warm-up

        def timed(chunk: int):
            V.GENERATE_CHUNK = chunk
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = clock()
            out = clf.answer(images, truth, sids, [None] * len(images), ranked)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            return out, clock() - t0

        chunk = V.GENERATE_CHUNK
        try:
            batched, t_batched = timed(args.batch)
            single, t_single = timed(1)
        finally:
            V.GENERATE_CHUNK = chunk
    params = sum(p.numel() for p in clf.model.parameters())
    result = {
        "images": args.images,
        "batch": args.batch,
        "model": {"params": params, "hidden": h, "layers": layers, "image_size": args.image_size, "patch": args.patch,
                  "dtype": args.dtype, "new_tokens": args.new_tokens},
        "device": args.device,
        "clock": args.clock,
        "batched_images_per_s": round(args.images / t_batched, 2),
        "one_at_a_time_images_per_s": round(args.images / t_single, 2),
        "speedup": round(t_single / t_batched, 2),
        "answers_agree": sum(a == b for a, b in zip(batched.answers, single.answers)) / args.images,
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
