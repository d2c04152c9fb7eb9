"""A card in the community's formats: model-index.yaml, robustbench.json, unaggregated.csv as views of card.json.

Built from a hand-made card (in process, no model): ``huggingface_hub.ModelCard`` parses the
model-index block back to the card's headline values, RobustBench's fields carry the clean
accuracy and the corruption benchmark's numbers only with ImageNet-C's 15 corruptions, and the unaggregated table lists every
(benchmark, shift, scale) of the card.  The end-to-end card of the demo build writes them
too (tests/test_api.py).
"""

from __future__ import annotations

import io
import json

import pandas as pd

from pipeline.card.exports import MODEL_INDEX, ROBUSTBENCH, UNAGGREGATED, card_exports, robustbench, robustbench_source
from pipeline.card.schema import check_card


def _entry(name: str, family: str, metric: str, value: float | None, details: list, accuracy: list) -> dict:
    return {"benchmark": name, "family": family, "metric": metric, "value": value, "ci_low": None, "ci_high": None,
            "higher_is_better": False, "protocol": "custom", "config_hash": "c" * 64, "benchmark_hash": f"{name}-h" * 4,
            "images_digest": "i" * 64, "details": details, "accuracy": accuracy}


CARD = check_card({
    "card": 1,
    "model": {"name": "small-cnn", "weights_sha256": "w" * 64, "kind": "exported", "model": "small"},
    "suite": {"name": "world", "hash": "h" * 64, "baseline": "linear"},
    "benchmarks": [
        _entry("cns", "cns", "accuracy_drop", 0.25,
               [{"metric": "accuracy_clean", "value": 0.9, "key": {"scale": 0.0}},
                {"metric": "accuracy_drop", "value": 0.4, "key": {"shift": "blur", "scale": 2.5}}],
               [{"family": "slider", "shift": "blur", "scale": 0.0, "accuracy": 0.9, "n": 10},
                {"family": "slider", "shift": "blur", "scale": 2.5, "accuracy": 0.5, "n": 10}]),
        _entry("corruptions", "corruptions", "mce", 0.8,
               [{"metric": "error_clean", "value": 0.2}],
               [{"family": "corruption", "shift": "fog", "scale": 0.0, "accuracy": 0.8, "n": 4},
                {"family": "corruption", "shift": "fog", "scale": 1.0, "accuracy": 0.6, "n": 4},
                {"family": "corruption", "shift": "fog", "scale": 5.0, "accuracy": 0.2, "n": 4}]),
        _entry("imagenet_e", "imagenet_e", "mean_drop", None, [], []),
    ],
}, "test card")


def test_model_index_parses_back_to_the_cards_headline_values():
    from huggingface_hub import ModelCard

    text = card_exports(CARD)[MODEL_INDEX]
    parsed = ModelCard(f"---\n{text}---\n")
    results = parsed.data.eval_results
    assert parsed.data.model_name == "small-cnn"
    shown = [e for e in CARD["benchmarks"] if e["value"] is not None]  # a benchmark without a number is left out
    assert [(r.dataset_name, r.metric_type, r.metric_value) for r in results] == \
        [(e["benchmark"], e["metric"], e["value"]) for e in shown]
    for r, e in zip(results, shown):
        assert r.task_type == "image-classification" and r.verified is False
        assert r.dataset_config == e["family"] and r.dataset_revision == e["benchmark_hash"]
        assert r.dataset_type == f"cnsbench/world/{e['benchmark']}"


def test_robustbench_needs_the_15_corruptions_and_the_unaggregated_table_lists_every_row():
    files = card_exports(CARD)
    # one corruption of ImageNet-C's 15: no RobustBench entry (tests/test_hostile_round6_exports.py has full ones)
    assert ROBUSTBENCH not in files and robustbench(CARD) is None
    entry, said = robustbench_source(CARD)
    assert entry is None and "1 of the 15 ImageNet-C corruptions" in said

    table = pd.read_csv(io.StringIO(files[UNAGGREGATED]))
    assert list(table.columns) == ["benchmark", "family", "shift", "scale", "accuracy", "n"]
    want = [(e["benchmark"], r["shift"], r["scale"], r["accuracy"]) for e in CARD["benchmarks"] for r in e["accuracy"]]
    assert list(zip(table["benchmark"], table["shift"], table["scale"], table["accuracy"])) == want


def test_a_suite_without_corruptions_has_no_robustbench_file():
    card = {**CARD, "benchmarks": CARD["benchmarks"][:1]}
    assert robustbench(card) is None and ROBUSTBENCH not in card_exports(card)
    assert "the suite has no corruption benchmark" in robustbench_source(card)[1]
