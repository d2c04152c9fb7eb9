"""What the scale simulation models of each GPU node (``bench/scale.py``): the images it carries,
the CPU work of the real stages measured on this machine, the actors' start-up, and the pools.

* :func:`palette`: 256 px PNGs of photographs (the sample images matplotlib and scikit-learn
  ship), encoded once with the build's own encoder: what the generate stage saves.
* :func:`cpu_parts`: CPU seconds per image of the real code, measured here once per run
  (``time.process_time``, so another job on the machine does not inflate them): the PNG
  encode in generate (``pipeline.stages.base.encode_image``); the decode
  (``decode_image``); the filter's preprocessing (open_clip's transform of the filter's CLIP
  and the protocol's DINOv2 transform); each classifier's preprocessing (its protocol
  transform, ``pipeline.config.protocol.build_transform``).
* :func:`actors`: the stage actors of the config on the simulated GPU, with their classifier
  groups and start-up (:func:`pipeline.perf.estimate.actors`).
* :func:`pool_layout`: actors per pool for N GPUs: whole GPUs for generation and
  quarter-GPU filter and classify actors on the rest, as many generation GPUs as the others
  keep up with (their pools are started at the build's start and hold their GPU share).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
QUARTER = 0.25
MARGIN = 1.0  # filter and classify actors for (at least) the rate the generators make images at
SIDE = 256


def photographs() -> list[Path]:
    """Sample photographs installed with the libraries (matplotlib, scikit-learn)."""
    import importlib.util

    found = []
    for package, rel in (("matplotlib", "mpl-data/sample_data/grace_hopper.jpg"),
                         ("sklearn", "datasets/images/china.jpg"), ("sklearn", "datasets/images/flower.jpg")):
        spec = importlib.util.find_spec(package)
        if spec and spec.submodule_search_locations:
            path = Path(list(spec.submodule_search_locations)[0]) / rel
            if path.is_file():
                found.append(path)
    return found


def palette(folder: Path, count: int = 24) -> list[str]:
    """``count`` PNGs of ``SIDE`` px cut from photographs (crops at several places and scales)
    written to ``folder``: the images the stand-in generator emits."""
    import numpy as np
    from PIL import Image

    from pipeline.stages.base import encode_image

    folder.mkdir(parents=True, exist_ok=True)
    photos = [Image.open(p).convert("RGB") for p in photographs()]
    if not photos:  # no sample photograph installed: smooth noise, compressing about as a photograph does
        rng = np.random.default_rng(0)
        small = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
        photos = [Image.fromarray(small).resize((640, 480), Image.BICUBIC)]
    paths = []
    for i in range(count):
        im = photos[i % len(photos)]
        w, h = im.size
        k = i // len(photos)
        side = int(min(w, h) * (1.0 - 0.06 * (k % 8)))
        x0 = (w - side) * (k % 5) // 4
        y0 = (h - side) * ((k + 2) % 5) // 4
        crop = im.crop((x0, y0, x0 + side, y0 + side)).resize((SIDE, SIDE), Image.BICUBIC)
        path = folder / f"{i:02d}.png"
        path.write_bytes(encode_image(crop, "png"))
        paths.append(str(path))
    return paths


def _cpu_seconds(fn, inputs: list[Any], repeats: int = 3) -> float:
    """CPU seconds per call of ``fn`` over ``inputs`` (after one warm-up call)."""
    fn(inputs[0])
    t0 = time.process_time()
    for _ in range(repeats):
        for x in inputs:
            fn(x)
    return (time.process_time() - t0) / (repeats * len(inputs))


def cpu_parts(cfg, images: list[str]) -> dict[str, Any]:
    """CPU seconds per image of the real stages' CPU work (see the module doc)."""
    import open_clip

    from pipeline import registry
    from pipeline.config.protocol import CNS_CLASSIFIER, CNS_DINO, build_transform, preprocess_of
    from pipeline.stages.base import decode_image, encode_image

    data = [Path(p).read_bytes() for p in images[:8]]
    pil = [decode_image(b) for b in data]
    out: dict[str, Any] = {
        "encode": _cpu_seconds(lambda im: encode_image(im, cfg.output.image_format, cfg.output.jpeg_quality), pil),
        "decode": _cpu_seconds(decode_image, data),
    }
    flt = cfg.filter
    if flt.enabled and flt.kind != "none":
        _, _, clip = open_clip.create_model_and_transforms(flt.clip.model, pretrained=None, device="meta")
        dino = build_transform(preprocess_of(flt.dino.preprocess, CNS_DINO) or CNS_DINO)
        out["filter_preprocess"] = _cpu_seconds(clip, pil) + _cpu_seconds(dino, pil)
    else:
        out["filter_preprocess"] = 0.0
    seen: dict[Any, float] = {}
    per: list[float] = []
    for spec in cfg.classifiers:
        p = preprocess_of(spec.preprocess, CNS_CLASSIFIER)
        if p is None:
            try:
                p = registry.CLASSIFIERS.get(spec.kind).own_preprocess(spec)
            except Exception:  # noqa: BLE001 - a kind that cannot state it: the protocol's
                p = None
            p = p or CNS_CLASSIFIER
        if p not in seen:
            seen[p] = _cpu_seconds(build_transform(p), pil)
        per.append(seen[p])
    out["classifier_preprocess"] = per
    out["distinct_transforms"] = len(seen)
    return out


def actors(cfg, gpu: str):
    """The stage actors of ``cfg`` on the simulated ``gpu`` (classify groups packed for its memory)."""
    from pipeline.perf.estimate import actors as stage_actors
    from pipeline.perf.data import gpu_spec

    return stage_actors(cfg, gpu_spec(gpu))[1]


def per_image(cfg, gpu: str, cpu: dict[str, Any], groups: list[list[int]]) -> dict[str, tuple[float, float]]:
    """(GPU seconds at a whole GPU, CPU seconds) per image of each pool: generate, filter, classify:k."""
    from pipeline.perf import data, latency

    spec = data.gpu_spec(gpu)
    group = cfg.family_groups()[0]
    unit_s, e = latency.unit_seconds(cfg, spec, len(group.shifts), list(group.scales))
    out = {"generate": (unit_s / e["images"], cpu["encode"] * e["branches"] / e["images"]),
           "filter": (latency.image_seconds(cfg, spec, "filter")[0], cpu["decode"] + cpu["filter_preprocess"])}
    for k, members in enumerate(groups):
        out[f"classify:{k}"] = (latency.image_seconds(cfg, spec, "classify", members)[0],
                                cpu["decode"] + sum(cpu["classifier_preprocess"][i] for i in members))
    return out


def pool_layout(n_gpus: int, seconds: dict[str, tuple[float, float]], margin: float = MARGIN) -> dict[str, dict]:
    """Actors and GPU share per pool for ``n_gpus``: the most whole-GPU generation actors whose
    image rate the quarter-GPU filter and classify actors on the other GPUs keep up with
    (``margin`` x); one GPU: generation on half of it, the others sharing the rest."""
    aux = [k for k in seconds if k != "generate"]
    if n_gpus < 2:
        share = 0.5 / len(aux)
        return {"generate": {"actors": 1, "gpu_share": 0.5}, **{k: {"actors": 1, "gpu_share": share} for k in aux}}
    gpu, cpu = seconds["generate"]
    per_gen = gpu + cpu  # actor-seconds per image of a whole-GPU generation actor
    for g in range(n_gpus - 1, 0, -1):
        rate = g / per_gen
        need = {k: max(1, math.ceil(rate * (seconds[k][0] / QUARTER + seconds[k][1]) * margin)) for k in aux}
        if sum(need.values()) * QUARTER <= n_gpus - g:
            return {"generate": {"actors": g, "gpu_share": 1.0},
                    **{k: {"actors": n, "gpu_share": QUARTER} for k, n in need.items()}}
    raise ValueError(f"{n_gpus} GPUs cannot hold a generation actor and the filter and classify pools")


def bound(n_gpus: int, layout: dict[str, dict], seconds: dict[str, tuple[float, float]], units: int,
          images_per_unit: int) -> float:
    """The layout's efficiency bound: GPU work per image over the GPUs' time per image at the
    slowest pool's rate, the last wave of units leaving generators idle."""
    rates = {k: layout[k]["actors"] / (s[0] / layout[k]["gpu_share"] + s[1]) for k, s in seconds.items()}
    g = layout["generate"]["actors"]
    waves = math.ceil(units / g) / (units / g)
    rate = min(rates["generate"] / waves, *[r for k, r in rates.items() if k != "generate"])
    work = sum(s[0] for s in seconds.values())
    return work * rate / n_gpus
