"""Analysis ``scenario_regression``: accuracy explained by classifier, scenario and class.

The multiple linear regression of XIMAGENET-12 (seed 003, Table 3): ordinary least
squares (numpy's pseudo-inverse, the numbers of statsmodels' ``ols(...).fit()``) of the accuracy of each (classifier, scenario, class) cell at the
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


def _levels(values: pd.Series, reference: str | None) -> list[str]:
    """The levels of a categorical variable, the reference first, the rest sorted (patsy's order)."""
    levels = sorted(values.unique())
    if reference is not None and reference in levels:
        levels.remove(reference)
        levels.insert(0, reference)
    return levels


def ols(design: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray | float]:
    """Ordinary least squares as statsmodels' ``OLS.fit()`` computes it (``method="pinv"``):
    estimates ``pinv(X) y``, residual degrees of freedom ``n - rank(X)``, standard errors from
    ``scale * pinv(X) pinv(X)^T``, two-sided p-values of the t statistics, R² against the centred total."""
    from scipy import stats

    pinv = np.linalg.pinv(design, rcond=1e-15)
    params = pinv @ y
    resid = y - design @ params
    ssr = float(resid @ resid)
    df_resid = len(y) - int(np.linalg.matrix_rank(design))
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.float64(ssr) / df_resid  # no residual degree of freedom: inf (nan for an exact fit)
        bse = np.sqrt(np.diag(pinv @ pinv.T) * scale)
        t = params / bse
        p = 2 * stats.t.sf(np.abs(t), df_resid)
        centred = float(((y - y.mean()) ** 2).sum())
        r2 = 1 - ssr / centred if centred else (float("nan") if ssr == 0 else float("-inf"))
    return {"params": params, "bse": bse, "pvalues": p, "rsquared": r2}


def fit(cells: pd.DataFrame, classifiers: list[str]) -> tuple[pd.DataFrame, dict]:
    """The regression with treatment coding: an intercept, then per variable with more than one
    level one indicator column per level but the reference (``classifiers[0]``, ``original``, the
    first class in sorted order), the levels in sorted order (as statsmodels' formula
    ``accuracy ~ C(classifier, Treatment(...)) + C(scenario, Treatment('original')) + C(class_name)``)."""
    data = cells.copy()
    y = data["accuracy"].astype(float).to_numpy()
    columns, labels, terms = [np.ones(len(data))], ["Intercept"], []
    for column, label, reference, term in (
        ("classifier", "classifier", classifiers[0], f"C(classifier, Treatment({classifiers[0]!r}))"),
        ("scenario", "scenario", ORIGINAL, f"C(scenario, Treatment({ORIGINAL!r}))"),
        ("class_name", "class", None, "C(class_name)"),
    ):
        if data[column].nunique() <= 1:
            continue
        terms.append(term)
        for level in _levels(data[column], reference)[1:]:
            columns.append((data[column] == level).to_numpy(dtype=float))
            labels.append(f"{label}[{level}]")
    model = ols(np.column_stack(columns), y)
    rows = [
        {"variable": name, "estimate": float(model["params"][i]), "std_error": float(model["bse"][i]),
         "p_value": float(model["pvalues"][i]), "significance": stars(float(model["pvalues"][i]))}
        for i, name in enumerate(labels)
    ]
    # NaN or -inf when every cell has the same accuracy (no variance to explain): undefined, null.
    r2 = float(model["rsquared"])
    formula = "accuracy ~ " + (" + ".join(terms) or "1")
    info = {"r_squared": round(r2, 4) if math.isfinite(r2) else None, "n_cells": int(len(data)), "formula": formula}
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
