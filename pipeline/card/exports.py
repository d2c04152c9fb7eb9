"""A card in the community's formats: views of ``card.json``, written beside it.

* ``model-index.yaml``: the ``model-index`` block of a Hugging Face model card, built with
  ``huggingface_hub``'s ``ModelCardData`` / ``EvalResult``: task ``image-classification``,
  one result per benchmark with its headline metric (the dataset named by the benchmark,
  its family as the config and the benchmark's config hash as the revision), ``verified:
  false``.  Paste it into a model's ``README.md`` front matter.
* ``robustbench.json``: a model-info file in RobustBench's layout (its field names and
  percentages as strings with two decimals): ``clean_acc`` from the accuracy at scale 0,
  and where a corruption benchmark is in the suite its mean accuracy over the corrupted
  images as ``corruptions_acc`` and its mCE as ``corruptions_mce``.
* ``unaggregated.csv``: one row per (benchmark, family, shift, scale) with the accuracy (an
  adaptive build's: its stratified estimate, as its report's) and
  the number of images it counts (each entry's ``accuracy`` list).

Each is computed from the card alone (:func:`card_exports`), so a test can check it
against ``card.json``.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from pipeline.config import BuildConfig

MODEL_INDEX = "model-index.yaml"
ROBUSTBENCH = "robustbench.json"
UNAGGREGATED = "unaggregated.csv"
EXPORTS = (MODEL_INDEX, ROBUSTBENCH, UNAGGREGATED)
UNAGGREGATED_COLUMNS = ["benchmark", "family", "shift", "scale", "accuracy", "n"]
TASK = "image-classification"


def accuracy_rows(config: BuildConfig, samples: pd.DataFrame, predictions: pd.DataFrame, model: str) -> list[dict[str, Any]]:
    """``model``'s accuracy per (family, shift, scale) of an output, over the trajectories its
    report counts (complete ones): what ``unaggregated.csv`` lists for a benchmark."""
    from pipeline.aggregate.metrics import accuracy_table

    mine = predictions[predictions["classifier"] == model]
    weighted = adaptive_accuracy(config, samples, mine, model) if config.sampling is not None else {}
    rows = []
    for group in config.family_groups():
        own = samples[samples["shift"].isin(group.shifts)]
        table = accuracy_table(own, mine[mine["sample_id"].isin(own["sample_id"])], list(group.scales))
        for r in table.itertuples(index=False):
            if r.shift == "all":
                continue
            acc = weighted.get((group.kind, str(r.shift), round(float(r.scale) * 1000)), float(r.accuracy))
            rows.append({"family": group.kind, "shift": str(r.shift), "scale": float(r.scale),
                         "accuracy": acc if acc == acc else None, "n": int(r.n)})
    return rows


def adaptive_accuracy(config: BuildConfig, samples: pd.DataFrame, predictions: pd.DataFrame,
                      model: str) -> dict[tuple[str, str, int], float]:
    """An adaptive build's stratified accuracy of ``model`` per (family, shift, milli-scale): the
    number its report's ``accuracy.csv`` gives (docs/adaptive.md), not the pooled one."""
    from pipeline.aggregate.adaptive import group_arrays, group_cells
    from pipeline.plan.adaptive import strata_of

    out = {}
    for ga in group_arrays(config, samples, predictions, strata_of(config.benchmark.classes, config.all_shifts())):
        if model not in ga.classifiers:
            continue
        found = group_cells(config, ga)
        c, h, s = found.shape
        est = found.accuracy.estimate.reshape(c, h, s)[ga.classifiers.index(model)]
        for i, shift in enumerate(ga.group.shifts):
            for j, scale in enumerate(ga.group.scales):
                out[(ga.group.kind, str(shift), round(float(scale) * 1000))] = float(est[i, j])
    return out


def unaggregated(card: dict[str, Any]) -> pd.DataFrame:
    rows = [{"benchmark": e["benchmark"], **r} for e in card["benchmarks"] for r in e.get("accuracy") or []]
    return pd.DataFrame(rows, columns=UNAGGREGATED_COLUMNS)


def model_index(card: dict[str, Any]) -> str:
    """The ``model-index`` YAML block of the card (``huggingface_hub.ModelCardData.to_yaml``)."""
    from huggingface_hub import EvalResult, ModelCardData

    results = []
    for e in card["benchmarks"]:
        if e["value"] is None:  # no number to report (e.g. no trajectory counted)
            continue
        results.append(EvalResult(
            task_type=TASK,
            dataset_type=f"cnsbench/{card['suite']['name']}/{e['benchmark']}",
            dataset_name=e["benchmark"],
            dataset_config=e["family"],
            dataset_revision=e.get("benchmark_hash"),
            metric_type=e["metric"],
            metric_name=f"{e['metric']} ({e['protocol']} protocol)",
            metric_value=e["value"],
            verified=False,
        ))
    data = ModelCardData(model_name=card["model"]["name"], eval_results=results or None, tags=["cnsbench", "robustness"])
    return data.to_yaml() + "\n"


def _percent(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.2f}"


def robustbench(card: dict[str, Any]) -> dict[str, Any]:
    """The card as a RobustBench model-info entry (its field names; its percentages)."""
    clean = None
    corr_acc = corr_mce = None
    for e in card["benchmarks"]:
        details = {d["metric"]: d["value"] for d in e.get("details") or [] if not (d.get("key") or {}).get("shift")}
        if clean is None and details.get("accuracy_clean") is not None:
            clean = details["accuracy_clean"]
        if e["family"] == "corruptions" and corr_mce is None:
            corr_mce = e["value"]
            if clean is None and details.get("error_clean") is not None:
                clean = 1.0 - details["error_clean"]
            corrupted = [r["accuracy"] for r in e.get("accuracy") or [] if r["scale"] > 0 and r["accuracy"] is not None]
            corr_acc = sum(corrupted) / len(corrupted) if corrupted else None
    model = card["model"]
    out = {
        "link": "",
        "name": model["name"],
        "authors": "",
        "additional_data": False,
        "number_forward_passes": 1,
        "dataset": card["suite"]["name"],
        "venue": "",
        "architecture": model.get("model") or model.get("kind") or "",
        "eps": None,
        "clean_acc": _percent(clean),
        "reported": "",
    }
    if corr_mce is not None or corr_acc is not None:
        out["corruptions_acc"] = _percent(corr_acc)
        out["corruptions_mce"] = _percent(corr_mce)
    return out


def card_exports(card: dict[str, Any]) -> dict[str, str]:
    """File name -> text of every export of ``card`` (card.json's content)."""
    return {
        MODEL_INDEX: model_index(card),
        ROBUSTBENCH: json.dumps(robustbench(card), indent=2) + "\n",
        UNAGGREGATED: unaggregated(card).to_csv(index=False),
    }
