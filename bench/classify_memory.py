"""Classifier groups on a GPU: measured peak memory of each group against its projection.

    python bench/classify_memory.py plan CONFIG [--set ...] > plan.json   # here: groups + projections
    python bench/classify_memory.py measure plan.json                     # on the GPU node (torch + timm)

``plan`` packs the config's classifiers as ``resources.classify.memory_budget_gb`` says
(pipeline.perf.memory) and writes, per classifier, what a GPU node needs to rebuild it with
random weights (the timm architecture, or the timm twin of a DINOv2 torch-hub entry; open_clip
models are skipped where open_clip is not installed).  ``measure`` builds each group on
the GPU in float32, runs one forward of the projected number of images through every model
of the group in turn, and prints per group the projected bytes (weights + activations,
without the runtime) and the measured peak of the CUDA allocator, plus the device's own
usage (CUDA context included) next to the projection with the runtime.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def plan(argv: list[str]) -> None:
    from pipeline.cli.options import add_set_argument, load_cli_config
    from pipeline.perf.memory import (
        RUNTIME_BYTES,
        classifier_footprints,
        classifier_groups,
        classify_images_per_forward,
        dinov2_timm_arch,
        group_bytes,
    )

    p = argparse.ArgumentParser()
    p.add_argument("config")
    add_set_argument(p)
    args = p.parse_args(argv)
    cfg = load_cli_config(args)
    footprints = classifier_footprints(cfg)
    models = []
    for spec, f in zip(cfg.classifiers, footprints, strict=True):
        entry = {"name": spec.name, "kind": spec.kind, "weights": f.weight_bytes, "activations": f.activation_bytes}
        if spec.kind == "timm":
            entry["timm"] = spec.model.split(".", 1)[0]
        elif spec.kind == "torch_hub" and (dino := dinov2_timm_arch(spec.model.rpartition(":")[2])):
            entry["timm"] = dino[0]
            entry["kwargs"] = {"img_size": 224}
        elif spec.kind == "open_clip_zeroshot":
            entry["open_clip"] = spec.model
        models.append(entry)
    groups = classifier_groups(cfg)
    json.dump({
        "budget_gb": cfg.resources.classify.memory_budget_gb,
        "images": classify_images_per_forward(cfg),
        "runtime": RUNTIME_BYTES,
        "models": models,
        "groups": [{"members": g, "projected": group_bytes([footprints[i] for i in g])} for g in groups],
    }, sys.stdout, indent=1)


def measure(path: str) -> None:
    import torch

    data = json.load(open(path))
    images, gb = data["images"], 1024**3
    free0, total = torch.cuda.mem_get_info()
    print(f"{torch.cuda.get_device_name()}: {total / gb:.1f} GB, {images} images per forward, "
          f"budget {data['budget_gb']} GB")
    for n, group in enumerate(data["groups"]):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        built, skipped = [], []
        for i in group["members"]:
            m = data["models"][i]
            try:
                if "timm" in m:
                    import timm

                    with torch.device("cuda"):
                        model = timm.create_model(m["timm"], pretrained=False, **m.get("kwargs", {}))
                    side = model.pretrained_cfg.get("input_size", (3, 224, 224))[-1] if "kwargs" not in m else 224
                    side = 224 if m["kind"] == "timm" else side  # the cns protocol's crop
                    forward = model
                else:
                    import open_clip

                    with torch.device("cuda"):
                        model = open_clip.create_model(m["open_clip"], pretrained=None, device="cuda")
                    size = model.visual.image_size
                    side = int(size[0] if isinstance(size, (tuple, list)) else size)
                    forward = model.visual
            except Exception as err:  # noqa: BLE001
                skipped.append(f"{m['name']} ({type(err).__name__})")
                continue
            built.append((m, model.eval(), forward, side))
        with torch.inference_mode():
            for m, _, forward, side in built:
                x = torch.randn(images, 3, side, side, device="cuda")
                forward(x)
                del x
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        used = total - torch.cuda.mem_get_info()[0]
        ran = [data["models"][i] for i in group["members"] if data["models"][i]["name"] not in
               {s.split(" ")[0] for s in skipped}]
        projected = sum(m["weights"] for m in ran) + max((m["activations"] for m in ran), default=0)
        print(f"group {n}: {len(ran)} models, projected {projected / gb:.2f} GB, measured peak {peak / gb:.2f} GB "
              f"({peak / max(projected, 1):.2f}x); device in use {used / gb:.2f} GB vs projected with runtime "
              f"{(projected + data['runtime']) / gb:.2f} GB" + (f"; skipped {', '.join(skipped)}" if skipped else ""))
        del built
        torch.cuda.empty_cache()


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:] or ["help"]
    if cmd == "plan":
        plan(rest)
    elif cmd == "measure":
        measure(rest[0])
    else:
        print(__doc__)
        sys.exit(2)
