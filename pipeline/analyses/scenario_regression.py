"""Analysis ``scenario_regression``: accuracy explained by classifier, scenario and class.

The multiple linear regression of XIMAGENET-12 (seed 003, Table 3): ordinary least
squares (statsmodels) of the accuracy of each (classifier, scenario, class) cell at the
evaluated strength on three categorical variables -- the classifier, the scenario (the
original images, scale 0, are the reference level ``original``) and the class -- with
treatment coding.  Each estimate is the accuracy change against the reference levels
(the intercept: the first classifier, the originals, the first class); p-values from the
t statistics, summarised as in the paper (**** p < 0.0001, *** < 0.001, ** < 0.01,
* < 0.05, ns).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipeline.aggregate.analysis import AnalysisContext, AnalysisResult
from pipeline.aggregate.page import NA, float_format
from pipeline.analyses.robustness_score import (
    ORIGINAL,
    originals,
    parse_options,
    scenario_frames,
)


def stars(p: float) -> str:
    if p is None or math.isnan(p):
        return ""
    for limit, mark in ((1e-4, "****"), (1e-3, "***"), (1e-2, "**"), (5e-2, "*")):
        if p < limit:
            return mark
    return "ns"


def cell_accuracies(ctx: AnalysisContext) -> pd.DataFrame:
    """Accuracy per (classifier, scenario, class) at the evaluated strength, originals included."""
    opts = parse_options({k: v for k, v in ctx.options.items() if k in ("strength", "scenarios")})
    df, scenarios, strengths = scenario_frames(ctx, opts)
    if df.empty:
        return pd.DataFrame(columns=["classifier", "scenario", "class_name", "accuracy", "n"])
    orig = originals(df).assign(shift=ORIGINAL)
    at = pd.concat([df[(df["shift"] == sc) & np.isclose(df["scale"], strengths[sc])] for sc in scenarios] + [orig])
    cells = at.groupby(["classifier", "shift", "class_name"])["correct"].agg(["mean", "size"]).reset_index()
    return cells.rename(columns={"shift": "scenario", "mean": "accuracy", "size": "n"})


def fit(cells: pd.DataFrame, classifiers: list[str]) -> tuple[pd.DataFrame, dict]:
    import statsmodels.formula.api as smf

    data = cells.copy()
    data["accuracy"] = data["accuracy"].astype(float)
    terms = []
    if data["classifier"].nunique() > 1:
        terms.append(f"C(classifier, Treatment({classifiers[0]!r}))")
    if data["scenario"].nunique() > 1:
        terms.append(f"C(scenario, Treatment({ORIGINAL!r}))")
    if data["class_name"].nunique() > 1:
        terms.append("C(class_name)")
    model = smf.ols("accuracy ~ " + (" + ".join(terms) or "1"), data=data).fit()
    rows = []
    for name in model.params.index:
        label = (name.replace(f", Treatment({classifiers[0]!r})", "").replace(f", Treatment({ORIGINAL!r})", "")
                 .replace("C(classifier)", "classifier").replace("C(scenario)", "scenario").replace("C(class_name)", "class")
                 .replace("[T.", "[") )
        p = float(model.pvalues[name])
        rows.append({"variable": label, "estimate": float(model.params[name]), "std_error": float(model.bse[name]),
                     "p_value": p, "significance": stars(p)})
    # NaN or -inf when every cell has the same accuracy (no variance to explain): undefined, null.
    r2 = float(model.rsquared)
    info = {"r_squared": round(r2, 4) if math.isfinite(r2) else None, "n_cells": int(len(data)), "formula": model.model.formula}
    return pd.DataFrame(rows), info


def run(ctx: AnalysisContext) -> AnalysisResult:
    result = AnalysisResult(title="Multiple linear regression (XIMAGENET-12 Table 3)")
    cells = cell_accuracies(ctx)
    if len(cells) < 3:
        result.html = "<p>Too few cells for a regression.</p>"
        return result
    table, info = fit(cells, [c.name for c in ctx.config.classifiers if c.name in set(cells["classifier"])])
    result.tables["regression"] = table
    result.json = info
    result.html = (
        f"<p>OLS <code>{info['formula']}</code> over {info['n_cells']} (classifier, scenario, class) cells, "
        f"R² = {NA if info['r_squared'] is None else info['r_squared']}.</p>"
        + table.to_html(index=False, float_format=float_format(4, "g"), na_rep=NA)
    )
    return result
