"""Analysis ``robustness_score``: the XIMAGENET-12 robustness score of each classifier.

Definitions (seed 003, Sec. 4), accuracies as fractions, scenarios i = 1..n:

* ``mu``: accuracy on the original images (here: scale 0, one image per (class, seed));
* ``C(i)``: accuracy of the classifier as trained (on originals) on scenario i at the
  evaluated strength (``strength``, default the published transform, 1.0) -- "EX1";
* ``C'(i)``: accuracy of the classifier trained *and* tested on scenario i -- "EX2".  The
  paper retrains each network per scenario; here a linear probe on the classifier's frozen
  features is trained per scenario and scored by k-fold cross-validation over the
  (class, seed) units, and its reference ``mu'`` is the same probe protocol on the
  originals (``inner_reference: probe``; ``classifier`` uses ``mu``);
* ``sigma2_cross = sum_i (C(i) - mu)^2 / d``, ``sigma2_inner = sum_i (C'(i) - mu')^2 / d``,
  ``S = 1 - (sigma2_cross + sigma2_inner)``.

The scenarios i are Table 2's eight (:data:`TABLE2_SCENARIOS`) that the output holds;
``scenarios`` names others (an output with none of the eight scores every shift, said in
the notes).  The other scenarios still get their accuracy curves.

The printed equations (1)-(2) divide by ``d = n``; the numbers of the published Table 2
divide by ``d = n - 1`` (each "Variance" is the sum of the row's squared drops over 7 for
its 8 scenarios: ResNet-50 0.6317 / 7 = 0.0902).  Both are computed: ``score_equation``
(d = n) and ``score_table`` (d = n - 1); ``score`` is the one ``variance`` names
(default ``table``, the variant behind the published numbers).

Probes run as Ray tasks when a Ray cluster is connected (one per classifier and
scenario), otherwise in this process (``probe_executor``).  Tables: ``robustness_score``
(one row per classifier), ``scenario_accuracy`` (per-scenario C, C', drops, squared
drops -- Table 2's cells), ``scenario_curves`` (accuracy per strength) and a figure.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Sequence

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.aggregate.analysis import AnalysisContext, AnalysisResult, read_images
from pipeline.aggregate.page import NA, float_format
from pipeline.errors import CnsbenchError

ORIGINAL = "original"  # the scale-0 images, as a scenario of the tables
# The eight scenarios of the published Table 2 (its column order), as scenario names here.
TABLE2_SCENARIOS = (
    "blur_background", "blur_object", "image_g", "image_b", "image_grey", "image_r", "random_background", "segmented_image",
)


class RobustnessOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    strength: float | None = Field(None, description="strength evaluated as the scenario (default: each shift's largest scale)")
    scenarios: list[str] | None = Field(
        None, description="shifts that count as scenarios (default: Table 2's eight present, else every shift but 'none')"
    )
    variance: Literal["table", "equation"] = Field("table", description="table: d = n - 1 (Table 2); equation: d = n (eq. 1-2)")
    inner_reference: Literal["probe", "classifier"] = "probe"
    probe: bool = Field(True, description="train linear probes for C'(i) (needs the images)")
    probe_folds: int = Field(5, ge=2)
    probe_l2: float = Field(1e-2, ge=0)
    probe_iterations: int = Field(200, ge=1)
    probe_executor: Literal["auto", "ray", "in_process"] = "auto"
    device: str = "cpu"


# --------------------------------------------------------------------------- the score
def variance_about(values: Sequence[float], mu: float, ddof: int) -> float:
    """sum_i (v_i - mu)^2 / (n - ddof): the paper's variance-like spread about ``mu``."""
    v = np.asarray(values, dtype=float)
    return float(((v - mu) ** 2).sum() / (len(v) - ddof))


def score_from_squared_deviations(cross_sq: Sequence[float], inner_sq: Sequence[float], variant: str = "table") -> dict[str, float]:
    """S from per-scenario squared drops (C(i) - mu)^2 and (C'(i) - mu)^2, e.g. Table 2's cells."""
    ddof = {"table": 1, "equation": 0}[variant]
    vc = float(np.sum(cross_sq) / (len(cross_sq) - ddof))
    vi = float(np.sum(inner_sq) / (len(inner_sq) - ddof))
    return {"var_cross": vc, "var_inner": vi, "score": 1.0 - (vc + vi)}


def robustness_score(cross: Sequence[float], inner: Sequence[float], mu: float, mu_inner: float | None = None, variant: str = "table") -> dict[str, float]:
    """S = 1 - (sigma2_cross + sigma2_inner) from accuracies C(i), C'(i) and mu (mu' for inner)."""
    mi = mu if mu_inner is None else mu_inner
    cross_sq = [(c - mu) ** 2 for c in cross]
    inner_sq = [(c - mi) ** 2 for c in inner]
    return score_from_squared_deviations(cross_sq, inner_sq, variant)


# --------------------------------------------------------------------------- probes
def fit_probe_cv(x: np.ndarray, y: np.ndarray, folds: np.ndarray, l2: float, iterations: int) -> float:
    """Cross-validated accuracy of a multinomial logistic-regression probe (features standardised per fold)."""
    import torch

    torch.manual_seed(0)
    correct = 0
    total = 0
    classes = np.unique(y)
    index = {c: i for i, c in enumerate(classes)}
    yi = np.array([index[c] for c in y])
    for f in np.unique(folds):
        tr, te = folds != f, folds == f
        if tr.sum() == 0 or te.sum() == 0:
            continue
        mean, std = x[tr].mean(0), x[tr].std(0) + 1e-6
        xt = torch.as_tensor((x[tr] - mean) / std, dtype=torch.float32)
        xe = torch.as_tensor((x[te] - mean) / std, dtype=torch.float32)
        yt = torch.as_tensor(yi[tr])
        w = torch.zeros(x.shape[1], len(classes), requires_grad=True)
        b = torch.zeros(len(classes), requires_grad=True)
        opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=iterations, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(xt @ w + b, yt) + l2 * (w**2).sum()
            loss.backward()
            return loss

        opt.step(closure)
        with torch.no_grad():
            pred = (xe @ w + b).argmax(1).numpy()
        correct += int((pred == yi[te]).sum())
        total += int(te.sum())
    return correct / total if total else math.nan


def frozen_features(clf: Any, images: list[Any]) -> np.ndarray:
    """Penultimate features of a classifier (timm: pre-logits; open_clip: image embedding), else its logits.

    The images go through the classifier's configured input transform (``Classifier.inputs``),
    the one its accuracies were measured with (a released layout's protocol included).
    """
    import torch

    model = getattr(clf, "model", None)
    with torch.inference_mode():
        if model is not None and hasattr(model, "forward_features") and hasattr(model, "forward_head"):
            x = clf.inputs(images).to(clf.device)
            return model.forward_head(model.forward_features(x), pre_logits=True).float().cpu().numpy()
        if model is not None and hasattr(model, "encode_image"):
            x = clf.inputs(images).to(clf.device)
            f = model.encode_image(x).float()
            return (f / f.norm(dim=-1, keepdim=True)).cpu().numpy()
        return clf.predict(images).numpy()


def _probe_task(x, y, folds, l2, iterations):  # module-level so Ray can pickle it
    return fit_probe_cv(x, y, folds, l2, iterations)


def _run_probes(jobs: list[tuple], opts: RobustnessOptions) -> list[float]:
    mode = opts.probe_executor
    if mode == "auto":
        try:
            import ray

            mode = "ray" if ray.is_initialized() else "in_process"
        except ImportError:  # pragma: no cover
            mode = "in_process"
    if mode == "ray":
        import ray

        if not ray.is_initialized():
            # address="local": this process's own Ray, never a `ray start` cluster that Ray's
            # bootstrap file may name (running or gone).
            ray.init(address="local", ignore_reinit_error=True, include_dashboard=False)
        task = ray.remote(num_cpus=1)(_probe_task)
        return ray.get([task.remote(*j, opts.probe_l2, opts.probe_iterations) for j in jobs])
    return [_probe_task(*j, opts.probe_l2, opts.probe_iterations) for j in jobs]


# --------------------------------------------------------------------------- the analysis
def parse_options(options: dict[str, Any]) -> RobustnessOptions:
    """The analysis' options checked (ValueError naming the key), defaults filled in."""
    try:
        return RobustnessOptions.model_validate(options)
    except ValidationError as err:
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise CnsbenchError(f"aggregate.analyses[robustness_score]: {detail}") from None


def default_scenarios(shifts: Sequence[str]) -> list[str]:
    """Table 2's eight scenarios among ``shifts`` (in Table 2's order), else every shift but ``none``."""
    present = [sc for sc in TABLE2_SCENARIOS if sc in set(shifts)]
    return present or sorted(x for x in shifts if x != "none")


def scenario_frames(ctx: AnalysisContext, opts: RobustnessOptions) -> tuple[pd.DataFrame, list[str], dict[str, float]]:
    """Kept samples joined with predictions; the scenarios; the evaluated strength per scenario."""
    s = ctx.samples
    s = s[s["kept"].fillna(False).astype(bool)]
    scenarios = opts.scenarios or default_scenarios(list(s["shift"].unique()))
    strengths = {}
    for sc in scenarios:
        scales = s.loc[s["shift"] == sc, "scale"]
        strengths[sc] = opts.strength if opts.strength is not None else (float(scales.max()) if len(scales) else 1.0)
    df = s.merge(ctx.predictions[["sample_id", "classifier", "correct"]], on="sample_id")
    return df, scenarios, strengths


def originals(df: pd.DataFrame) -> pd.DataFrame:
    """Scale-0 rows, one per (classifier, class, seed): the originals every scenario shares."""
    return df[df["scale"] == 0].drop_duplicates(["classifier", "class_id", "seed"])


def run(ctx: AnalysisContext) -> AnalysisResult:
    opts = parse_options(ctx.options)
    df, scenarios, strengths = scenario_frames(ctx, opts)
    result = AnalysisResult(title="Robustness score (XIMAGENET-12)")
    classifiers = [c.name for c in ctx.config.classifiers]
    notes: list[str] = []
    if df.empty or not scenarios:
        result.html = "<p>No kept images: no robustness score.</p>"
        result.tables["robustness_score"] = pd.DataFrame(columns=["classifier", "score"])
        return result
    orig = originals(df)
    if opts.scenarios is None and not set(TABLE2_SCENARIOS) & set(scenarios):
        notes.append("None of Table 2's eight scenarios is in this output: the score is over every shift.")
    at = pd.concat([df[(df["shift"] == sc) & (np.isclose(df["scale"], strengths[sc]))] for sc in scenarios])

    inner: dict[tuple[str, str], float] = {}
    mu_probe: dict[str, float] = {}
    if opts.probe and ctx.read_image is not None:
        inner, mu_probe = _probe_accuracies(ctx, opts, orig, at, scenarios, classifiers)
    elif opts.probe:
        notes.append("C'(i) not computed: the images of this output are not readable here.")

    rows, acc_rows = [], []
    for clf in classifiers:
        mu = float(orig.loc[orig["classifier"] == clf, "correct"].mean())
        mu_i = mu_probe.get(clf, math.nan) if opts.inner_reference == "probe" else mu
        cross, inn = [], []
        for sc in scenarios:
            part = at[(at["classifier"] == clf) & (at["shift"] == sc)]
            c = float(part["correct"].mean()) if len(part) else math.nan
            ci = inner.get((clf, sc), math.nan)
            cross.append(c)
            inn.append(ci)
            acc_rows.append({
                "classifier": clf, "scenario": sc, "strength": strengths[sc], "n_images": len(part),
                "C": c, "C_prime": ci, "drop_cross": mu - c, "drop_inner": mu_i - ci,
                "sq_cross": (c - mu) ** 2, "sq_inner": (ci - mu_i) ** 2,
            })
        row: dict[str, Any] = {"classifier": clf}
        for variant in ("table", "equation"):
            got = robustness_score(cross, inn, mu, mu_i, variant) if len(scenarios) > 1 else {"var_cross": math.nan, "var_inner": math.nan, "score": math.nan}
            row[f"score_{variant}"] = got["score"]
            row[f"var_cross_{variant}"] = got["var_cross"]
            row[f"var_inner_{variant}"] = got["var_inner"]
        row["score"] = row[f"score_{opts.variance}"]
        row.update(mu=mu, mu_inner=mu_i, n_scenarios=len(scenarios), n_originals=int((orig["classifier"] == clf).sum()))
        rows.append(row)
    table = pd.DataFrame(rows)
    cols = ["classifier", "score"] + [c for c in table.columns if c not in ("classifier", "score")]
    table = table[cols]
    table["rank_score"] = table["score"].rank(ascending=False, method="min")
    table["rank_clean"] = table["mu"].rank(ascending=False, method="min")
    accuracy = pd.DataFrame(acc_rows)
    curves = _curves(df, sorted(x for x in df["shift"].unique() if x != "none"))
    result.tables["robustness_score"] = table
    result.tables["scenario_accuracy"] = accuracy
    result.tables["scenario_curves"] = curves
    if ctx.config.aggregate.plots and not curves.empty:
        result.figures["scenario_curves"] = _curve_figure(curves)
    ties = bool(table["mu"].duplicated().any())
    same = (not ties) and list(table.sort_values("score", ascending=False)["classifier"]) == list(
        table.sort_values("mu", ascending=False)["classifier"]
    )
    result.json = {
        "variance": opts.variance,
        "scenarios": scenarios,
        "strengths": strengths,
        "scores": {r["classifier"]: _num(r["score"]) for r in rows},
        "ranking_matches_clean_accuracy": bool(same),
        "clean_accuracy_ties": ties,
        "notes": notes,
    }
    result.html = _html(table, accuracy, opts, same, ties, notes, bool(ctx.config.aggregate.plots and not curves.empty))
    return result


def _num(v: float) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), 6)


def _probe_accuracies(ctx, opts, orig, at, scenarios, classifiers):
    from pipeline.registry import CLASSIFIERS
    from pipeline.stages.base import decode_image

    labels = ctx.config.benchmark.label_space
    need = pd.concat([orig, at])[["sample_id", "seed", "shard"]].drop_duplicates("sample_id").sort_values(["shard", "sample_id"])
    images = {sid: decode_image(data) for sid, data in read_images(ctx.read_image, need["sample_id"]).items()}
    seeds = sorted(need["seed"].unique())
    fold_of_seed = {s: i % opts.probe_folds for i, s in enumerate(seeds)}
    jobs, keys = [], []
    for spec in ctx.config.classifiers:
        if spec.name not in classifiers:
            continue
        clf = CLASSIFIERS.get(spec.kind)(spec, opts.device, labels)
        feats = dict(zip(need["sample_id"], frozen_features(clf, [images[s] for s in need["sample_id"]])))
        for sc in [ORIGINAL, *scenarios]:
            part = (orig if sc == ORIGINAL else at[at["shift"] == sc])
            part = part[part["classifier"] == spec.name]
            if part["class_id"].nunique() < 2 or len(part) < opts.probe_folds:
                continue
            x = np.stack([feats[s] for s in part["sample_id"]])
            folds = np.array([fold_of_seed[s] for s in part["seed"]])
            jobs.append((x, part["class_id"].to_numpy(), folds))
            keys.append((spec.name, sc))
    accs = _run_probes(jobs, opts)
    inner = {k: a for k, a in zip(keys, accs) if k[1] != ORIGINAL}
    mu_probe = {k[0]: a for k, a in zip(keys, accs) if k[1] == ORIGINAL}
    return inner, mu_probe


def _curves(df: pd.DataFrame, scenarios: list[str]) -> pd.DataFrame:
    part = df[df["shift"].isin(scenarios)]
    g = part.groupby(["classifier", "shift", "scale"])["correct"].agg(["mean", "size"]).reset_index()
    return g.rename(columns={"shift": "scenario", "scale": "strength", "mean": "accuracy", "size": "n_images"})


def _curve_figure(curves: pd.DataFrame):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clfs = list(dict.fromkeys(curves["classifier"]))
    fig, axes = plt.subplots(1, len(clfs), figsize=(4 * len(clfs), 3.6), sharey=True, squeeze=False)
    for ax, clf in zip(axes[0], clfs):
        for sc, part in curves[curves["classifier"] == clf].groupby("scenario"):
            ax.plot(part["strength"], part["accuracy"], marker="o", ms=3, label=sc)
        ax.set_title(clf)
        ax.set_xlabel("strength")
        ax.set_ylim(0, 1.02)
    axes[0][0].set_ylabel("accuracy")
    axes[0][-1].legend(fontsize=6, loc="lower left")
    fig.tight_layout()
    return fig


def _html(table, accuracy, opts, same, ties, notes, figure) -> str:
    show = table[["classifier", "score", "score_table", "score_equation", "mu", "mu_inner", "var_cross_table", "var_inner_table", "rank_score", "rank_clean"]]
    pivot = accuracy.pivot(index="classifier", columns="scenario", values="drop_cross")
    parts = [
        f"<p>S = 1 - (var_cross + var_inner); <code>score</code> uses the {opts.variance} variant "
        "(table: divide by n - 1 as the published Table 2; equation: by n as eq. 1-2).</p>",
        show.to_html(index=False, float_format=float_format(4), na_rep=NA),
        "<p>Accuracy drop mu - C(i) per scenario (trained on originals):</p>",
        pivot.to_html(float_format=float_format(3), na_rep=NA),
        "<p>" + ("Clean accuracy ties between classifiers: the score separates what clean accuracy cannot."
                 if ties else f"Ranking by score {'matches' if same else 'differs from'} the ranking by clean accuracy.") + "</p>",
    ]
    if figure:
        parts.append('<img src="scenario_curves.png" alt="accuracy per scenario and strength">')
    parts += [f"<p>{n}</p>" for n in notes]
    return "\n".join(parts)
