"""Stage ``calibrate``: the four filter thresholds from held-out digits (2-of-4 rule removes 90% of out-of-class pairs)."""

from __future__ import annotations

import math
from typing import Any

import torch

from pipeline.demo import world_data as W
from pipeline.demo import world_models as M
from pipeline.demo.train.common import CALIBRATION, Ctx, quantize, seeded
from pipeline.io.safejson import dumps as strict_dumps


# --------------------------------------------------------------------------- calibration
def filter_spec(ctx: Ctx, thresholds: dict[str, float] | None = None):
    from pipeline.config import FilterSpec

    entries = M.config_entries(str(ctx.out))["filter"]
    return FilterSpec.model_validate({**entries, **({"thresholds": thresholds} if thresholds else {})})


def stage_calibrate(ctx: Ctx) -> dict[str, Any]:
    import numpy as np

    from pipeline.models.detectors import OOCFilter, keep_decision
    from pipeline.plan.schema import SCORE_COLUMNS

    x, y, tr, te = ctx.data
    c = CALIBRATION
    gen = seeded(80)
    flt = OOCFilter(filter_spec(ctx), "cpu")
    # Held-out references: `per_class` test digits per class.
    refs = torch.cat([te[y[te] == k][: c["per_class"]] for k in range(10)])
    strengths = list(c["strengths"])
    in_scores = {s: {k: [] for k in SCORE_COLUMNS} for s in strengths}
    ooc_scores: dict[str, list[float]] = {k: [] for k in SCORE_COLUMNS}
    items, kinds = [], []
    for i in refs.tolist():
        name = W.DIGIT_NAMES[int(y[i])]
        for shift in W.SHIFTS:
            # In-class trajectory: the digit at rising strengths of the shift.
            imgs = [W.apply_shift(x[i : i + 1], shift, s) for s in strengths]
            items.append((W.to_pil(quantize(torch.cat(imgs))), strengths, name, shift))
            kinds.append("in")
            # Out-of-class, scored against this digit's class prompts and scale-0 image:
            # another class's held-out digit, and a blend in which another digit dominates
            # (weight 0.5..0.9), both under the shift at a random strength.
            others = te[y[te] != y[i]]
            j = int(others[torch.randint(0, len(others), (1,), generator=gen)])
            s = float(torch.rand(1, generator=gen))
            a = c["blend_low"] + (c["blend_high"] - c["blend_low"]) * float(torch.rand(1, generator=gen))
            other = W.apply_shift(x[j : j + 1], shift, s)
            blend = W.apply_shift((1 - a) * x[i : i + 1] + a * x[j : j + 1], shift, s)
            for img in (other, blend):
                items.append((W.to_pil(quantize(torch.cat([x[i : i + 1], img]))), [0.0, 1.0], name, shift))
                kinds.append("ooc")
    scored = []
    for lo in range(0, len(items), 64):
        scored += flt.score_trajectories(items[lo : lo + 64])
    for kind, sc in zip(kinds, scored):
        if kind == "in":
            for j, s in enumerate(strengths):
                for k in SCORE_COLUMNS:
                    in_scores[s][k].append(sc[k][j])
        else:
            for k in SCORE_COLUMNS:
                ooc_scores[k].append(sc[k][1])
    ooc = {k: np.array(v) for k, v in ooc_scores.items()}

    def thresholds_at(q: float) -> dict[str, float]:
        return {k: float(np.quantile(ooc[k], q)) for k in SCORE_COLUMNS}

    def removed(th) -> float:
        from pipeline.config import Thresholds

        _, kept = keep_decision({k: list(ooc[k]) for k in SCORE_COLUMNS}, Thresholds(**th), 2)
        return 1 - sum(kept) / len(kept)

    # Smallest common quantile whose 2-of-4 rule removes the target share of OOC pairs.
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        if removed(thresholds_at(mid)) >= c["ooc_removed"]:
            hi = mid
        else:
            lo = mid
    q = hi
    # Rounded up, so the rounded thresholds still remove at least the target share.
    th = {k: math.ceil(v * 1e6) / 1e6 for k, v in thresholds_at(q).items()}
    from pipeline.config import Thresholds

    kept_in = {}
    for s in strengths:
        _, kept = keep_decision(in_scores[s], Thresholds(**th), 2)
        kept_in[str(s)] = round(sum(kept) / len(kept), 4)
    record = {"quantile": round(q, 4), "thresholds": th, "ooc_removed": round(removed(th), 4),
              "in_class_kept_by_strength": kept_in,
              "ooc_score_median": {k: round(float(np.median(ooc[k])), 4) for k in SCORE_COLUMNS},
              "in_class_score_median_at_1": {k: round(float(np.median(in_scores[1.0][k])), 4) for k in SCORE_COLUMNS}}
    (ctx.out / "filter_thresholds.json").write_text(strict_dumps(th, indent=1) + "\n")
    ctx.log(f"calibrate: {record}")
    return record


