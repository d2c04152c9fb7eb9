"""Analysis ``attributes``: ImageNet-E's view of attribute edits.

Per classifier, attribute (shift) and level (scale):

* ``report/attributes.csv`` -- ``classifier, attribute, level, accuracy, accuracy_drop``
  (the contract), then ``n``, ``parameter`` and ``value``: the physical parameter of the
  level (object pixel rate, centre offset, degrees, guidance strength lambda), the mean
  over the images' ``params`` or, for released images read by ``cnsbench evaluate``
  (no params), the default ``object_edit`` mapping the released-set reader uses.  ``accuracy_drop`` is
  ``accuracy(0) - accuracy(level)`` over the same trajectories (positive = worse, the papers' sign), the
  project's one definition (:func:`pipeline.aggregate.metrics.accuracy_table`).
* ``report/attributes_failure_points.csv`` -- the failure-point distribution over the
  levels of each attribute (:func:`pipeline.aggregate.metrics.failure_point_table`):
  the first level at which a classifier is wrong.
* ``report/attributes_release_sets.csv`` -- released sets without a physical level (random
  position, random direction: :func:`pipeline.families.object_edit.without_level`), apart
  from the level curves: ``classifier, attribute, accuracy_original, accuracy,
  accuracy_drop, n``.
* ``report/attributes_summary.csv`` -- ImageNet-E's summary: per classifier the mean
  accuracy drop over the published levels present (object pixel rate 0.1 / 0.08 / 0.05,
  lambda +-20, the released "full size" and adversarial-background sets), the accuracy on
  the unedited images, and the drop on each set without a level (``drop_random_position``,
  ...), which the level average leaves out as the original's does.

Each attribute is measured on its own levels (a released set has other levels per
attribute than a build), always on complete trajectories as in the CNS metrics.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from pipeline.aggregate.analysis import AnalysisContext, AnalysisResult
from pipeline.aggregate.page import NA, float_format
from pipeline.families.object_edit import RELEASE_ONLY, without_level

CONTRACT_COLUMNS = ["classifier", "attribute", "level", "accuracy", "accuracy_drop"]
COLUMNS = CONTRACT_COLUMNS + ["n", "parameter", "value", "published"]
PARAMETERS = {
    "size": "target_share",
    "position": "offset",
    "rotation": "degrees",
    "background_complexity": "lambda",
    "background_simplicity": "lambda",
}
PUBLISHED_SHARES = (0.1, 0.08, 0.05)  # ImageNet-E object pixel rates
PUBLISHED_LAMBDA = 20.0  # ImageNet-E background complexity levels -20 and 20


def _physical_values(ctx: AnalysisContext, samples: pd.DataFrame) -> dict[tuple[str, float], float]:
    """(attribute, level) -> mean physical value from params, else from the object_edit mapping."""
    out: dict[tuple[str, float], list[float]] = {}
    for shift, scale, raw in zip(samples["shift"], samples["scale"], samples.get("params", [None] * len(samples))):
        name = PARAMETERS.get(str(shift))
        if not name or not isinstance(raw, str) or not raw:
            continue
        value = json.loads(raw).get(name)
        if isinstance(value, (int, float)):
            out.setdefault((str(shift), round(float(scale), 3)), []).append(float(value))
    values = {k: sum(v) / len(v) for k, v in out.items()}
    from pipeline.families.object_edit import ATTRIBUTES, ObjectEditOptions, physical

    # Images without params were not made by a build but read (cnsbench evaluate): the
    # released-set reader put them on the default mapping's levels.
    defaults = ObjectEditOptions()
    for shift, scale in zip(samples["shift"], samples["scale"]):
        key = (str(shift), round(float(scale), 3))
        if key not in values and key[0] in ATTRIBUTES:
            values[key] = next(iter(physical(key[0], float(scale), defaults).values()))
    return values


def _published(attribute: str, level: float, value: float | None) -> bool:
    if level == 0 or without_level(attribute):
        return False
    if attribute in RELEASE_ONLY:
        return True
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    if attribute == "size":
        return any(abs(value - s) < 1e-4 for s in PUBLISHED_SHARES)
    if attribute in ("background_complexity", "background_simplicity"):
        return abs(abs(value) - PUBLISHED_LAMBDA) < 1e-6
    return False  # position, rotation: the released sets are random, without a level


def attribute_tables(ctx: AnalysisContext) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(attributes table, failure-point table) over every shift of the build."""
    from pipeline.aggregate.metrics import accuracy_table, failure_point_table

    samples = ctx.samples
    values = _physical_values(ctx, samples)
    acc_frames, fp_frames = [], []
    for shift in sorted(str(s) for s in pd.unique(samples["shift"])):
        sub = samples[samples["shift"] == shift]
        scales = sorted({round(float(s), 3) for s in sub["scale"]})
        if 0.0 not in scales or len(scales) < 2:
            continue  # no unedited reference or nothing edited: no drop to measure
        preds = ctx.predictions[ctx.predictions["sample_id"].isin(sub["sample_id"])]
        acc = accuracy_table(sub, preds, scales)
        if acc.empty:
            continue
        acc = acc.rename(columns={"shift": "attribute", "scale": "level"})
        acc["parameter"] = PARAMETERS.get(shift, "")
        acc["value"] = [values.get((shift, round(float(lv), 3)), float("nan")) for lv in acc["level"]]
        acc["published"] = [
            _published(shift, float(lv), None if pd.isna(v) else float(v)) for lv, v in zip(acc["level"], acc["value"])
        ]
        acc_frames.append(acc[COLUMNS])
        fp = failure_point_table(sub, preds, scales)
        fp = fp[fp["shift"] != "all"].rename(columns={"shift": "attribute", "scale": "level"})
        fp_frames.append(fp)
    table = pd.concat(acc_frames, ignore_index=True) if acc_frames else pd.DataFrame(columns=COLUMNS)
    fps = pd.concat(fp_frames, ignore_index=True) if fp_frames else pd.DataFrame()
    return table, fps


RELEASE_SET_COLUMNS = ["classifier", "attribute", "accuracy_original", "accuracy", "accuracy_drop", "n"]


def split_release_sets(table: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(level curves, released sets without a level) of an attributes table."""
    mask = table["attribute"].map(without_level).astype(bool)
    curves, sets = table[~mask].reset_index(drop=True), table[mask]
    orig = sets[sets["level"] == 0].set_index(["classifier", "attribute"])["accuracy"]
    edited = sets[sets["level"] != 0].copy()
    edited["accuracy_original"] = [orig.get((c, a), float("nan")) for c, a in zip(edited["classifier"], edited["attribute"])]
    return curves, edited[RELEASE_SET_COLUMNS].reset_index(drop=True)


def summary(table: pd.DataFrame, release_sets: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per classifier: accuracy on unedited images, mean drop at the published levels, at all levels, and per set without a level."""
    rows = []
    for clf in pd.unique(table["classifier"]):
        t = table[table["classifier"] == clf]
        pub = t[t["published"]]
        edited = t[t["level"] != 0]
        row = {
            "classifier": clf,
            "accuracy_original": float(t.loc[t["level"] == 0, "accuracy"].mean()),
            "mean_drop_published": float(pub["accuracy_drop"].mean()) if len(pub) else float("nan"),
            "n_published": len(pub),
            "mean_drop_all_levels": float(edited["accuracy_drop"].mean()) if len(edited) else float("nan"),
            "published_levels": " ".join(f"{a}@{lv:g}" for a, lv in zip(pub["attribute"], pub["level"])),
        }
        if release_sets is not None:
            for attr, drop in release_sets.loc[release_sets["classifier"] == clf, ["attribute", "accuracy_drop"]].values:
                row[f"drop_{attr}"] = float(drop)
        rows.append(row)
    return pd.DataFrame(rows)


def _figure(table: pd.DataFrame):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attributes = list(pd.unique(table["attribute"]))
    fig, axes = plt.subplots(1, len(attributes), figsize=(3.2 * len(attributes), 3.0), squeeze=False, sharey=True)
    for ax, attr in zip(axes[0], attributes):
        t = table[table["attribute"] == attr]
        for clf in pd.unique(t["classifier"]):
            c = t[t["classifier"] == clf].sort_values("level")
            ax.plot(c["level"], c["accuracy"], marker="o", label=str(clf))
        ax.set_title(attr, fontsize=9)
        ax.set_xlabel("level")
        ax.set_ylim(-0.02, 1.02)
    axes[0][0].set_ylabel("accuracy")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def run(ctx: AnalysisContext) -> AnalysisResult:
    table, fps = attribute_tables(ctx)
    result = AnalysisResult(title="Attribute edits (ImageNet-E)")
    if table.empty:
        result.html = "<p>No attribute with an unedited level 0 and edited levels in this output.</p>"
        return result
    table, release_sets = split_release_sets(table)
    if not fps.empty:
        fps = fps[~fps["attribute"].map(without_level).astype(bool)]
    summ = summary(table, release_sets)
    result.tables["attributes"] = table
    result.tables["attributes_summary"] = summ
    if not release_sets.empty:
        result.tables["attributes_release_sets"] = release_sets
    if not fps.empty:
        result.tables["attributes_failure_points"] = fps
    if ctx.config.aggregate.plots:
        result.figures["attributes_accuracy"] = _figure(table)
    result.json = {
        "summary": json.loads(summ.to_json(orient="records")),
        "accuracy": json.loads(table[COLUMNS].to_json(orient="records")),
        "release_sets": json.loads(release_sets.to_json(orient="records")),
    }
    wide = table.pivot_table(index=["attribute", "level"], columns="classifier", values="accuracy", sort=False)
    plot = '<p><img src="attributes_accuracy.png" alt="accuracy per attribute and level"></p>' if ctx.config.aggregate.plots else ""
    result.html = (
        "<p>Accuracy per attribute and level (level 0 = the unedited image); the summary's mean drop is over "
        "ImageNet-E's published levels present in this output.</p>"
        + summ.to_html(index=False, float_format=float_format(3), na_rep=NA)
        + wide.to_html(float_format=float_format(3), na_rep=NA)
        + plot
        + (
            "<p>Released sets without a level (a random position or direction per image), not on the level curves "
            "and not in the published mean:</p>" + release_sets.to_html(index=False, float_format=float_format(3), na_rep=NA)
            if not release_sets.empty
            else ""
        )
    )
    return result
