"""Analysis ``mask_quality``: the object masks a build used, one row per (class, seed).

From the ``params`` the mask-using family recorded on each unit's scale-0 image: the
provider (``mask_kind``), the object's share of the image, its number of 4-connected
components and the share of the largest, whether the quality check found it unusable
(and why), and -- where a true mask was known (``reference`` of the ``cross_attention``
provider) -- the IoU of the model's cross-attention mask against it.
"""

from __future__ import annotations

import math

import pandas as pd

from pipeline.aggregate.analysis import AnalysisContext, AnalysisResult
from pipeline.aggregate.page import NA, float_format

COLUMNS = [
    "class_id", "class_name", "seed", "mask_kind", "mask_area", "mask_components", "mask_main_share",
    "usable", "reason", "mask_iou", "attention_area",
]


def mask_table(ctx: AnalysisContext) -> pd.DataFrame:
    p = ctx.params()
    if "param.mask_area" not in p.columns:
        return pd.DataFrame(columns=COLUMNS)
    p = p[p["param.mask_area"].notna()].sort_values(["class_id", "seed", "shift", "scale"])
    p = p.drop_duplicates(["class_id", "seed"])
    out = pd.DataFrame({
        "class_id": p["class_id"].astype(int),
        "class_name": p["class_name"],
        "seed": p["seed"].astype(int),
        "mask_kind": p.get("param.mask_kind"),
        "mask_area": p["param.mask_area"],
        "mask_components": p.get("param.mask_components"),
        "mask_main_share": p.get("param.mask_main_share"),
        "reason": p["param.mask_unusable"] if "param.mask_unusable" in p.columns else None,
        "mask_iou": p["param.mask_iou"] if "param.mask_iou" in p.columns else math.nan,
        "attention_area": p["param.attention_area"] if "param.attention_area" in p.columns else math.nan,
    })
    out["usable"] = out["reason"].isna()
    return out[COLUMNS].reset_index(drop=True)


def run(ctx: AnalysisContext) -> AnalysisResult:
    table = mask_table(ctx)
    result = AnalysisResult(title="Object masks")
    result.tables["mask_quality"] = table
    ious = pd.to_numeric(table["mask_iou"], errors="coerce").dropna()
    summary = {
        "units": int(len(table)),
        "unusable": int((~table["usable"].astype(bool)).sum()) if len(table) else 0,
        "mean_area": _num(pd.to_numeric(table["mask_area"], errors="coerce").mean()),
        "mean_iou": _num(ious.mean()) if len(ious) else None,
        "median_iou": _num(ious.median()) if len(ious) else None,
        "share_iou_at_least_0.5": _num((ious >= 0.5).mean()) if len(ious) else None,
    }
    result.json = summary
    lines = [f"<p>{summary['units']} units, {summary['unusable']} with an unusable mask (filtered out); "
             f"mean object share {summary['mean_area']}.</p>"]
    if summary["mean_iou"] is not None:
        per_class = table.groupby("class_name")["mask_iou"].mean().round(3).to_frame("mean IoU")
        lines.append(
            f"<p>Cross-attention masks against the true masks: mean IoU {summary['mean_iou']:.3f}, "
            f"median {summary['median_iou']:.3f}, {100 * summary['share_iou_at_least_0.5']:.0f}% of units at IoU >= 0.5.</p>"
        )
        lines.append(per_class.to_html(float_format=float_format(3), na_rep=NA))
    result.html = "\n".join(lines)
    return result


def _num(v) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), 4)
