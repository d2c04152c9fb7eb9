"""Stage ``evaluate``: held-out checks of the classifiers on generated and slider digits."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.demo import world_data as W
from pipeline.demo.train.classifiers import evaluate_classifiers
from pipeline.demo.train.common import Ctx, seeded
from pipeline.demo.train.diffusion import generated_accuracy
from pipeline.demo.train.sliders import slider_config


# --------------------------------------------------------------------------- evaluation
def stage_evaluate(ctx: Ctx) -> dict[str, Any]:
    """Held-out checks of the generator: classifier accuracy on generated digits, and on
    slider trajectories of every digit (scale 0 vs 2.5) made by the pipeline's own sampler."""
    from pipeline.config import BenchmarkSpec
    from pipeline.models.sampler import get_sampler

    seeded(90)
    record: dict[str, Any] = {
        "generated_accuracy_class_words": generated_accuracy(ctx, use_tokens=False),
        "generated_accuracy_tokens": generated_accuracy(ctx, use_tokens=True),
    }
    cfg = slider_config(ctx)
    bench = BenchmarkSpec(labels=list(W.DIGIT_NAMES), classes=list(range(10)), seeds=[101, 102],
                          shifts=list(W.SHIFTS), scales=[0.0, 2.5])
    sampler = get_sampler(cfg.generator.kind, cfg.generator, list(bench.classes), bench.label_space, "cpu", torch.float32)
    images: dict[str, list] = {"0": []}
    images.update({s: [] for s in W.SHIFTS})
    labels = []
    for c in range(10):
        for seed in bench.seeds:
            group = sampler.generate_group(c, seed, list(W.SHIFTS), [0.0, 2.5])
            images["0"].append(group.image(W.SHIFTS[0], 0.0))
            for shift in W.SHIFTS:
                images[shift].append(group.image(shift, 2.5))
            labels.append(c)
    record["slider_accuracy_scale0"] = evaluate_classifiers(ctx, images["0"], labels)
    record["slider_accuracy_scale2.5"] = {s: evaluate_classifiers(ctx, images[s], labels) for s in W.SHIFTS}
    ctx.log(f"evaluate: {record}")
    return record


