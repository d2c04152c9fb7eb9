"""Stage ``sliders``: one concept slider per (digit, shift) with the project's slider trainer."""

from __future__ import annotations

import json
from typing import Any

from pipeline.demo import world_data as W
from pipeline.demo import world_models as M
from pipeline.demo.train.common import GENERATION, SLIDER_SETTINGS, Ctx, seeded


# --------------------------------------------------------------------------- sliders
def slider_config(ctx: Ctx, classes: list[int] | None = None):
    """A BuildConfig over the world's classes and shifts whose generator points at ``ctx.out``."""
    from pipeline.config import BuildConfig

    entries = M.config_entries(str(ctx.out))
    return BuildConfig.model_validate({
        "benchmark": {"name": "world-sliders", "labels": list(W.DIGIT_NAMES), "classes": classes or list(range(10)),
                      "seeds": [0], "shifts": list(W.SHIFTS)},
        "generator": {**entries["generator"], "resolution": M.RESOLUTION, "image_size": M.RESOLUTION,
                      "dtype": "float32", **{k: GENERATION[k] for k in ("steps", "guidance_scale", "negative_prompt",
                                                                        "lora_timestep_threshold")}},
        "classifiers": entries["classifiers"][:1],
        "slider_training": SLIDER_SETTINGS,
    })


def stage_sliders(ctx: Ctx) -> dict[str, Any]:
    from pipeline.train.run import train_sliders

    seeded(70)
    cfg = slider_config(ctx)
    summary = train_sliders(cfg, str(ctx.out / "sliders"), runner="local", echo=ctx.log)
    if summary.failed:
        raise RuntimeError(f"slider training failed for {sorted(summary.failed)}: {list(summary.failed.values())[0]}")
    losses = {}
    for path in sorted((ctx.out / "sliders").glob("*/*.json")):
        meta = json.loads(path.read_text())
        losses[f"{meta['shift']}/{meta['class_id']}"] = round(meta["mean_loss_last_10"], 6)
    return {"n_sliders": len(losses), "mean_loss_last_10": losses, "seconds": summary.seconds}


