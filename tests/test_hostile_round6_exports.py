"""Exports that say what their readers think they say: robustbench.json, ``load_dataset(OUT)``, zero-width intervals.

- ``robustbench.json`` carries RobustBench's ``corruptions_acc`` alone: the mean accuracy over
  the 15 ImageNet-C corruptions at the integer severities 1 to 5, from the corruption
  family's rows only (a hand-made card whose corruption entry also holds slider shifts, the
  extra corruptions and half-step severities, recomputed by hand from ``unaggregated.csv``);
  a suite without the 15 gets no file and a sentence on the card's page; the fields are
  those RobustBench 1.1.1's ``ModelInfo`` and ``generate_leaderboard`` read.
- ``datasets.load_dataset(OUT, "predictions")`` after an evaluation has the rows of
  ``open_output(OUT).predictions()``, and two outputs of one folder name load their own.
- A zero-width bootstrap interval is shown as such, with its explanation.
"""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from pipeline.card.exports import ROBUSTBENCH, UNAGGREGATED, card_exports, robustbench, robustbench_source
from pipeline.card.schema import check_card
from pipeline.families.corruption.params import BENCHMARK, EXTRA

# RobustBench 1.1.1's robustbench.utils.ModelInfo: every field its model-info files may hold
RB_MODEL_INFO = {"link", "name", "authors", "additional_data", "number_forward_passes", "dataset", "venue",
                 "architecture", "eps", "clean_acc", "reported", "corruptions_acc", "corruptions_acc_3d",
                 "corruptions_mce", "corruptions_mce_3d", "autoattack_acc", "footnote"}
RB_DATASETS = {"cifar10", "cifar100", "imagenet"}  # robustbench.model_zoo.enums.BenchmarkDataset


def _acc(name: str, scale: float) -> float:
    """A distinct accuracy per cell, so a wrong cell in the mean shows."""
    return round(0.9 - 0.1 * scale - 0.004 * (sorted(BENCHMARK + EXTRA).index(name) if name in BENCHMARK + EXTRA else 7), 6)


def _corruption_rows(names=BENCHMARK, scales=(0.0, 1.0, 1.5, 2.0, 3.0, 4.0, 4.5, 5.0)) -> list[dict]:
    rows = [{"family": "corruption", "shift": n, "scale": s, "accuracy": _acc(n, s), "n": 4}
            for n in (*names, *EXTRA) for s in scales]
    # slider shifts of the same output: not RobustBench's, whatever their scale
    rows += [{"family": "slider", "shift": "age", "scale": s, "accuracy": 1.0, "n": 4} for s in (0.0, 1.0, 2.0, 3.0)]
    return rows


def _card(rows: list[dict], baseline: str = "linear", ce_names=BENCHMARK) -> dict:
    ces = [{"metric": "ce", "value": 0.5, "key": {"corruption": c, "normalised_by": baseline, "in_mce": True}}
           for c in ce_names]
    entry = {"benchmark": "corruptions", "family": "corruptions", "metric": "mce", "value": 0.75, "ci_low": 0.7,
             "ci_high": 0.8, "higher_is_better": False, "protocol": "custom", "config_hash": "c" * 64,
             "benchmark_hash": "b" * 64, "images_digest": "i" * 64,
             "details": ces + [{"metric": "error_clean", "value": 0.125}], "accuracy": rows}
    cns = {**entry, "benchmark": "cns", "family": "cns", "metric": "accuracy_drop", "value": 0.2, "ci_low": 0.1, "ci_high": 0.3, "details":
           [{"metric": "accuracy_clean", "value": 0.5, "key": {"scale": 0.0}}],
           "accuracy": [{"family": "slider", "shift": "age", "scale": 0.0, "accuracy": 0.5, "n": 4}]}
    return check_card({"card": 1, "model": {"name": "mynet", "weights_sha256": "w" * 64, "kind": "exported",
                                            "model": "small"},
                       "suite": {"name": "world", "hash": "h" * 64, "baseline": baseline},
                       "benchmarks": [cns, entry]}, "test card")


def test_corruptions_acc_is_robustbenchs_mean_recomputed_from_the_unaggregated_table():
    card = _card(_corruption_rows())
    files = card_exports(card)
    info = json.loads(files[ROBUSTBENCH])
    table = pd.read_csv(io.StringIO(files[UNAGGREGATED]))
    own = table[(table["family"] == "corruption") & table["shift"].isin(BENCHMARK)
                & table["scale"].isin([1.0, 2.0, 3.0, 4.0, 5.0])]
    assert len(own) == 75  # 15 corruptions x 5 severities, nothing else
    assert info["corruptions_acc"] == f"{100 * own['accuracy'].mean():.2f}"
    everything = table[(table["benchmark"] == "corruptions") & (table["scale"] > 0)]["accuracy"].mean()
    assert info["corruptions_acc"] != f"{100 * everything:.2f}"  # what was exported before: other rows changed it
    assert info["clean_acc"] == "87.50"  # the corruption benchmark's own originals (1 - error_clean), not cns's
    assert (info["venue"], info["dataset"], info["eps"]) == ("N/A", "imagenet", None)
    assert "world" in info["footnote"] and "not ImageNet-C's" in info["footnote"]
    assert "corruptions_mce" not in info  # normalised by the suite's linear classifier: card.json keeps it
    # RobustBench 1.1.1's readers: ModelInfo(**info) takes every field, generate_leaderboard's sort key is a float
    assert set(info) <= RB_MODEL_INFO and info["dataset"] in RB_DATASETS and float(info["corruptions_acc"]) > 0
    float(info["clean_acc"])


def test_alexnet_normalised_mce_is_exported():
    info = robustbench(_card(_corruption_rows(), baseline="alexnet"))
    assert info["corruptions_mce"] == "75.00"


@pytest.mark.parametrize("drop", [
    lambda r: r["shift"] == "fog",  # 14 of the 15
    lambda r: r["shift"] == "snow" and r["scale"] == 3.0,  # one severity missing
])
def test_without_all_15_at_every_severity_no_file_and_the_page_says_why(drop):
    from pipeline.card.page import card_html

    rows = [r for r in _corruption_rows() if not drop(r)]
    card = _card(rows)
    assert robustbench(card) is None and ROBUSTBENCH not in card_exports(card)
    entry, said = robustbench_source(card)
    assert entry is None and "RobustBench's corruptions_acc needs all 15" in said
    page = {**card, "model": {**card["model"], "weights": [], "preprocess": "model"},
            "suite": {**card["suite"], "file": "suite.yaml"},
            "benchmarks": [{**b, "n_units": 4, "ci": {"level": 0.95, "resamples": 10}, "description": "d",
                            "protocol_detail": {"name": "custom", "original": "o"}, "preprocess": "model",
                            "output": "o", "details": [{"ci_low": None, "ci_high": None, "key": {}, **d}
                                                      for d in b["details"]]} for b in card["benchmarks"]]}
    assert "No robustbench.json: its corruption benchmark has" in card_html(page)


def test_a_missing_accuracy_cell_is_missing_not_zero():
    rows = [{**r, "accuracy": None} if (r["shift"], r["scale"]) == ("fog", 2.0) else r for r in _corruption_rows()]
    assert robustbench(_card(rows)) is None


# --------------------------------------------------------------------------- load_dataset(OUT)
def _rows(path, cache, **kw) -> int:
    import datasets

    return sum(len(s) for s in datasets.load_dataset(str(path), "predictions", cache_dir=str(cache), **kw).values())


def test_load_dataset_after_evaluate_has_the_outputs_rows_and_same_named_outputs_their_own(demo_world, tmp_path):
    pytest.importorskip("datasets")
    import shutil

    import torch

    import cnsbench

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(48, 10))
    pre = {"resize": 32, "crop": 32, "interpolation": "bilinear", "mean": [0.5] * 3, "std": [0.5] * 3}

    a, b, cache = tmp_path / "a" / "demo", tmp_path / "b" / "demo", tmp_path / "cache"
    shutil.copytree(demo_world, a)
    shutil.copytree(demo_world, b)
    before = len(cnsbench.open_output(a).predictions())
    assert _rows(a, cache) == before  # a first load fills the cache

    cnsbench.evaluate(model, a, output=a, in_place=True, name="mine", preprocess=pre, runner="local", echo=lambda m: None)
    after = len(cnsbench.open_output(a).predictions())
    assert after > before
    assert _rows(a, cache) == after  # not the rows of the first load
    assert _rows(a, cache, download_mode="force_redownload") == after
    assert _rows(b, cache) == before  # same folder name, one cache folder: its own rows, not a's

    # a copy whose committed files are gone says so instead of serving another output's rows
    gone = next(iter(sorted((b / "predictions").glob("*.parquet"))))
    gone.unlink()
    import datasets

    with pytest.raises(FileNotFoundError):
        datasets.load_dataset(str(b), "predictions", cache_dir=str(cache))


# --------------------------------------------------------------------------- zero-width intervals
def test_a_zero_width_interval_is_shown_as_such_and_explained():
    from pipeline.aggregate.page import ZERO_WIDTH, ci_table, zero_width
    from pipeline.card.page import card_html

    assert zero_width(0.2667, 0.2667) and not zero_width(0.2, 0.3)
    assert not zero_width(None, None) and not zero_width(float("nan"), float("nan"))
    table = pd.DataFrame({"model": ["a", "b"], "value": [0.2667, 0.5], "value_ci_low": [0.2667, 0.4],
                          "value_ci_high": [0.2667, 0.6]})
    html = ci_table(table)
    assert html.count("zero width*") == 1  # model a only
    assert "[0.2667, 0.2667] </span>" not in html and "[0.2667, 0.2667]</span> <span" in html
    assert "every bootstrap resample gave the same value" in ZERO_WIDTH and "not certainty" in ZERO_WIDTH
    assert f"<p>* {ZERO_WIDTH}.</p>" in html
    assert "zero width" not in ci_table(table.iloc[[1]])  # no mark, no note where none collapsed

    card = _card(_corruption_rows())
    card["benchmarks"][0].update(value=0.2667, ci_low=0.2667, ci_high=0.2667)
    page = {**card, "model": {**card["model"], "weights": [], "preprocess": "model"},
            "suite": {**card["suite"], "file": "suite.yaml"},
            "benchmarks": [{**b, "n_units": 4, "ci": {"level": 0.95, "resamples": 10}, "description": "d",
                            "protocol_detail": {"name": "custom", "original": "o"}, "preprocess": "model",
                            "output": "o", "details": []} for b in card["benchmarks"]]}
    shown = card_html(page)
    assert shown.count("zero width*") == 1 and "<b>0.2667</b> [0.2667, 0.2667] (zero width: every bootstrap" in shown


def test_the_leaderboard_page_marks_a_zero_width_interval():
    from pipeline.card.page import leaderboard_html

    table = pd.DataFrame([{"benchmark": "cns", "rank": r, "tier": 1, "model": m, "metric": "accuracy_drop", "value": v,
                           "value_ci_low": lo, "value_ci_high": hi, "better": "lower", "clean_accuracy": 0.9,
                           "failure_point": None, "failure_point_rank": None, "protocol": "custom",
                           "failure_point_basis": "none"}
                          for r, m, v, lo, hi in [(1, "a", 0.2667, 0.2667, 0.2667), (2, "b", 0.3, 0.2, 0.4)]])
    html = leaderboard_html(table, pd.DataFrame(), {"suite": "s", "models": ["a", "b"], "suite_hash": "h", "cards": []})
    assert html.count("zero width*") == 1 and "not certainty" in html
