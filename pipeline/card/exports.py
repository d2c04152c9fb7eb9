"""A card in the community's formats: views of ``card.json``, written beside it.

* ``model-index.yaml``: the ``model-index`` block of a Hugging Face model card, built with
  ``huggingface_hub``'s ``ModelCardData`` / ``EvalResult``: task ``image-classification``,
  one result per benchmark with its headline metric (the dataset named by the benchmark,
  its family as the config and the benchmark's config hash as the revision), ``verified:
  false``.  Paste it into a model's ``README.md`` front matter.
* ``robustbench.json``: a model-info file of RobustBench's ImageNet corruptions leaderboard
  (its field names, percentages as strings with two decimals, ``venue`` ``"N/A"``,
  ``dataset`` ``"imagenet"``, a ``footnote`` naming the suite), written only where a
  corruption benchmark of the suite has all 15 ImageNet-C corruptions at the integer
  severities 1 to 5: ``corruptions_acc`` is their mean accuracy (RobustBench's definition,
  from the corruption family's rows alone), ``clean_acc`` that benchmark's accuracy on its
  originals, and ``corruptions_mce`` is there only when the mCE is ImageNet-C's (normalised
  by AlexNet's errors; one normalised by a classifier of the suite stays in card.json).
  Without those 15 no file is written (RobustBench's leaderboard code ranks by
  ``corruptions_acc`` and fails without it); ``card.html`` says why.
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


# RobustBench's ImageNet-C protocol: its 15 corruptions, each at the integer severities 1 to 5
RB_SEVERITIES = (1.0, 2.0, 3.0, 4.0, 5.0)
RB_DATASET = "imagenet"  # the leaderboard (model_info/imagenet/corruptions) whose corruptions these are
RB_CORRUPTION_FAMILY = "corruption"  # the family of a corruption benchmark's accuracy rows


def _imagenet_c() -> tuple[str, ...]:
    from pipeline.families.corruption.params import BENCHMARK

    return BENCHMARK


def robustbench_cells(rows: list[dict[str, Any]]) -> dict[tuple[str, float], float] | None:
    """Accuracy per (corruption, severity) of RobustBench's protocol among ``rows`` (an entry's
    ``accuracy`` list): the corruption family's rows of the 15 ImageNet-C corruptions at the
    integer severities 1 to 5; None unless all 75 cells have a number.  Slider shifts, the
    extra corruptions and half-step severities are not RobustBench's and never enter."""
    names = _imagenet_c()
    cells = {(r["shift"], float(r["scale"])): r["accuracy"] for r in rows
             if r.get("family") == RB_CORRUPTION_FAMILY and r["shift"] in names and float(r["scale"]) in RB_SEVERITIES}
    wanted = [(n, s) for n in names for s in RB_SEVERITIES]
    if any(cells.get(c) is None for c in wanted):
        return None
    return {c: float(cells[c]) for c in wanted}


def robustbench_source(card: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The corruption benchmark ``robustbench.json`` is made from (None: the file is not written)
    and the sentence the card's page says about it."""
    corr = [e for e in card["benchmarks"] if e["family"] == "corruptions"]
    for e in corr:
        if robustbench_cells(e.get("accuracy") or []) is not None:
            return e, (f"robustbench.json: corruptions_acc is the mean accuracy over the 15 ImageNet-C corruptions "
                       f"at severities 1 to 5 of benchmark {e['benchmark']} (RobustBench's definition), on this "
                       "suite's images, not on ImageNet-C's.")
    if not corr:
        why = "the suite has no corruption benchmark"
    else:
        have = {r["shift"] for e in corr for r in e.get("accuracy") or []
                if r.get("family") == RB_CORRUPTION_FAMILY and r["shift"] in _imagenet_c()}
        why = (f"its corruption benchmark has {len(have)} of the 15 ImageNet-C corruptions at every integer severity "
               "1 to 5 with a number (RobustBench's corruptions_acc needs all 15)")
    return None, f"No robustbench.json: {why}; RobustBench's leaderboard ranks entries by that field."


def _alexnet_mce(e: dict[str, Any]) -> float | None:
    """The entry's mCE when it is ImageNet-C's (the 15 corruptions, each normalised by AlexNet's
    published errors); None otherwise (normalised by a classifier of the suite: not RobustBench's)."""
    ces = [d for d in e.get("details") or [] if d["metric"] == "ce" and (d.get("key") or {}).get("in_mce")]
    named = {(d.get("key") or {}).get("corruption") for d in ces}
    if e["metric"] != "mce" or named != set(_imagenet_c()) or any(d["key"].get("normalised_by") != "alexnet" for d in ces):
        return None
    return e["value"]


def robustbench(card: dict[str, Any]) -> dict[str, Any] | None:
    """The card as a RobustBench model-info entry of its ImageNet corruptions leaderboard (its
    field names; its percentages), or None when the suite lacks RobustBench's 15 corruptions
    at severities 1 to 5 (:func:`robustbench_source`)."""
    e, _ = robustbench_source(card)
    if e is None:
        return None
    cells = robustbench_cells(e["accuracy"])
    clean_rows = [r["accuracy"] for r in e["accuracy"] if r.get("family") == RB_CORRUPTION_FAMILY
                  and r["shift"] in _imagenet_c() and float(r["scale"]) == 0.0 and r["accuracy"] is not None]
    details = {d["metric"]: d["value"] for d in e.get("details") or [] if not d.get("key")}
    clean = (1.0 - details["error_clean"]) if details.get("error_clean") is not None else (
        sum(clean_rows) / len(clean_rows) if clean_rows else None)
    model, suite = card["model"], card["suite"]
    out = {
        "link": "",
        "name": model["name"],
        "authors": "",
        "additional_data": False,
        "number_forward_passes": 1,
        "dataset": RB_DATASET,
        "venue": "N/A",
        "architecture": model.get("model") or model.get("kind") or "",
        "eps": None,
        "clean_acc": _percent(clean),
        "reported": "",
        "corruptions_acc": _percent(sum(cells.values()) / len(cells)),
    }
    mce = _alexnet_mce(e)
    if mce is not None:
        out["corruptions_mce"] = _percent(mce)
    out["footnote"] = (f"cnsbench suite {suite['name']} ({str(suite.get('hash') or '')[:12]}), benchmark "
                       f"{e['benchmark']}: ImageNet-C's 15 corruptions on the suite's images, not ImageNet-C's")
    return out


def card_exports(card: dict[str, Any]) -> dict[str, str]:
    """File name -> text of every export of ``card`` (card.json's content); ``robustbench.json``
    only where :func:`robustbench` makes one."""
    return {
        MODEL_INDEX: model_index(card),
        UNAGGREGATED: unaggregated(card).to_csv(index=False),
        **({ROBUSTBENCH: json.dumps(rb, indent=2) + "\n"} if (rb := robustbench(card)) is not None else {}),
    }
