"""VLM answers per shift and scale: TRUE, FALSE and excluded counts, accuracy = TRUE / (TRUE + FALSE).

A ``vlm`` classifier's answers are scored by its protocol (:mod:`pipeline.models.vqa_protocols`);
an answer naming several options or none is excluded (``predictions.excluded``, ``correct``
null) and counts neither way, as in ImageNet-D's ``compute_accuracy.py``; so is an image the
protocol could not ask (no released question under ``distractors: questions``), whose
``answer`` is null (``n_unasked``, counted among ``n_excluded``).  This analysis
reports, per vlm classifier, shift and scale, every image's verdict counts
(``report/vlm_answers.csv``) and the protocol it was asked with.  The CNS metrics (accuracy,
failure points) treat a vlm like any classifier on its non-excluded answers; a trajectory
with an excluded answer at some scale has no failure point and leaves those metrics.
Reports without vlm classifiers get no section.
"""

from __future__ import annotations

import html

import pandas as pd

from pipeline.aggregate.analysis import AnalysisContext, AnalysisResult
from pipeline.aggregate.page import NA, float_format
from pipeline.config.vqa import asks

COLUMNS = ["classifier", "shift", "scale", "n", "n_true", "n_false", "n_excluded", "n_unasked", "accuracy"]


def answer_table(samples: pd.DataFrame, predictions: pd.DataFrame, vlms: list[str]) -> pd.DataFrame:
    """Per (vlm classifier, shift, scale): images, TRUE, FALSE, excluded, TRUE / (TRUE + FALSE)."""
    if "excluded" not in predictions or not vlms or not len(predictions):
        return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})
    keep = ["sample_id", "classifier", "correct", "excluded", *(["answer"] if "answer" in predictions else [])]
    p = predictions[predictions["classifier"].isin(vlms)][keep]
    rows = p.merge(samples[["sample_id", "shift", "scale"]], on="sample_id", how="inner")
    excluded = rows["excluded"].astype("boolean").fillna(False).astype(bool)
    correct = rows["correct"].astype("boolean")
    rows = rows.assign(
        t=(correct.fillna(False) & ~excluded).astype(int),
        f=((~correct.fillna(True)) & ~excluded).astype(int),
        x=excluded.astype(int),
        u=(excluded & (rows["answer"].isna() if "answer" in rows else False)).astype(int),  # not asked
    )
    g = rows.groupby(["classifier", "shift", "scale"], sort=True).agg(
        n=("sample_id", "size"), n_true=("t", "sum"), n_false=("f", "sum"), n_excluded=("x", "sum"),
        n_unasked=("u", "sum"),
    ).reset_index()
    answered = g["n_true"] + g["n_false"]
    g["accuracy"] = (g["n_true"] / answered.where(answered > 0)).astype(float)
    order = {name: i for i, name in enumerate(vlms)}
    return g.sort_values(["classifier", "shift", "scale"], key=lambda s: s.map(order) if s.name == "classifier" else s
                         ).reset_index(drop=True)[COLUMNS]


def run(ctx: AnalysisContext) -> AnalysisResult:
    askers = [c for c in ctx.config.classifiers if asks(c.kind)]
    vlms = [c.name for c in askers]
    if not vlms:
        return AnalysisResult()
    table = answer_table(ctx.samples, ctx.predictions, vlms)
    result = AnalysisResult(title="Vision-language models: answers")
    result.tables["vlm_answers"] = table
    per_clf = {}
    lines = [("<p>Accuracy = TRUE / (TRUE + FALSE); answers naming several options or none are excluded "
              "(counted, not scored), as ImageNet-D's VQA evaluation.</p>")]
    for spec in askers:
        t = table[table["classifier"] == spec.name]
        n_true, n_false, n_x = int(t["n_true"].sum()), int(t["n_false"].sum()), int(t["n_excluded"].sum())
        acc = n_true / (n_true + n_false) if n_true + n_false else None
        per_clf[spec.name] = {"n_true": n_true, "n_false": n_false, "n_excluded": n_x,
                              "accuracy": None if acc is None else round(acc, 4), "protocol": spec.protocol}
        proto = spec.protocol or {}
        shown = "n/a" if acc is None else f"{100 * acc:.1f}%"
        lines.append(
            f"<h4>{html.escape(spec.name)}</h4><p>protocol <code>{html.escape(str(proto.get('kind')))}</code>: "
            f"&ldquo;{html.escape(str(proto.get('prompt')))}&rdquo; (temperature {proto.get('temperature')}); "
            f"TRUE {n_true}, FALSE {n_false}, excluded {n_x}: accuracy {shown}.</p>"
        )
        lines.append(t.drop(columns="classifier").to_html(index=False, float_format=float_format(3), na_rep=NA))
    result.json = per_clf
    result.html = "\n".join(lines)
    return result
