"""Filter calibration on synthetic labelled scores whose right answer is known."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from pipeline.models.calibrate import (
    CalibrationError,
    calibrate,
    candidate_thresholds,
    clip_baseline,
    read_labels,
    removed,
    threshold_overrides,
)
from pipeline.cli import TINY_CONFIG
from pipeline.config import ConfigError, Thresholds, load_config
from pipeline.plan.schema import SCORE_COLUMNS


def run_cli(argv: list[str]) -> int:
    from pipeline.cli.calibrate_filter import register as add_cli

    parser = argparse.ArgumentParser()
    add_cli(parser.add_subparsers())
    args = parser.parse_args(["calibrate-filter", *argv])
    return args.func(args)


def separable(seed: int = 0, n_in: int = 140, n_ooc: int = 60) -> pd.DataFrame:
    """In-class images clearly above a cut on clip_image (0.8) and dino_image (0.7); the two
    text scores are the same noise for both groups, so clip_text alone cannot separate them."""
    rng = np.random.default_rng(seed)
    n = n_in + n_ooc
    ooc = np.r_[np.zeros(n_in, bool), np.ones(n_ooc, bool)]
    return pd.DataFrame(
        {
            "clip_text": rng.uniform(20, 35, n),
            "clip_shift_text": rng.uniform(25, 40, n),
            "clip_image": np.where(ooc, rng.uniform(0.40, 0.75, n), rng.uniform(0.85, 0.99, n)),
            "dino_image": np.where(ooc, rng.uniform(0.30, 0.65, n), rng.uniform(0.75, 0.95, n)),
            "ooc": ooc,
        }
    )


def keep_rule(df: pd.DataFrame, thresholds: dict, min_pass: int) -> np.ndarray:
    """Removal by the filter's own keep rule (pipeline.models.detectors.keep_decision)."""
    from pipeline.models.detectors import keep_decision

    _, kept = keep_decision({c: df[c].tolist() for c in SCORE_COLUMNS}, Thresholds(**thresholds), min_pass)
    return ~np.array(kept)


def test_separable_detectors_are_found_and_beat_the_clip_baseline():
    df = separable()
    cal = calibrate(df[list(SCORE_COLUMNS)].to_numpy(), df["ooc"].to_numpy(), target_tpr=0.9, min_pass=2)
    # Perfect separation exists, so the optimum removes every OOC image and no in-class one.
    assert cal.stats.removed_in == 0 and cal.stats.fpr == 0.0 and cal.stats.tpr == 1.0
    assert cal.stats.accuracy == 1.0
    gone = keep_rule(df, cal.thresholds, 2)
    assert gone.tolist() == df["ooc"].tolist()
    # The informative detectors carry the rule: their thresholds lie in the gaps between the
    # groups (the separation tie-break), not inside one group's range.
    assert 0.75 <= cal.thresholds["clip_image"] < 0.85 and 0.65 <= cal.thresholds["dino_image"] < 0.75
    # clip_text alone must remove most in-class images to reach the target.
    assert cal.baseline.tpr >= 0.9 and cal.baseline.fpr > 0.5 and cal.baseline.accuracy < cal.stats.accuracy


def test_target_tpr_is_reached_exactly_not_exceeded_at_a_cost():
    # All four detectors see the same score x, so "fewer than 2 pass" is "x <= second-smallest
    # threshold".  OOC x = 1..20, in-class x = 18.5, 19.5, ...: removing 18 OOC (TPR 0.9
    # exactly) is free, the 19th would cost an in-class image.
    x = np.r_[np.arange(1.0, 21.0), np.arange(18.5, 40.0)]
    ooc = np.r_[np.ones(20, bool), np.zeros(len(x) - 20, bool)]
    scores = np.repeat(x[:, None], 4, axis=1)
    cal = calibrate(scores, ooc, target_tpr=0.9, min_pass=2)
    assert cal.stats.removed_ooc == 18 and cal.stats.tpr == 0.9 and cal.stats.removed_in == 0
    t = np.array([cal.thresholds[c] for c in SCORE_COLUMNS])
    assert removed(scores, t, 2).tolist() == (x <= 18).tolist()
    # with a target just above 0.9 the 19th OOC image must go, and with it in-class 18.5
    cal = calibrate(scores, ooc, target_tpr=0.91, min_pass=2)
    assert cal.stats.removed_ooc == 19 and cal.stats.removed_in == 1


def test_clip_baseline_hand_computed():
    clip = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 5.5, 11, 12, 13], dtype=float)
    ooc = np.r_[np.ones(10, bool), np.zeros(4, bool)]
    t, stats = clip_baseline(clip, ooc, 0.9)
    # 9 of 10 OOC need clip_text <= t: the first candidate is the midpoint of 9 and 10.
    assert t == 9.5
    assert (stats.removed_ooc, stats.removed_in) == (9, 1)
    assert stats.tpr == 0.9 and stats.fpr == 0.25 and stats.accuracy == pytest.approx(12 / 14)


def test_candidates_and_nan_never_pass():
    c = candidate_thresholds(np.array([3.0, 1.0, 2.0, 2.0, np.nan]))
    assert c.tolist() == [0.0, 1.5, 2.5, 3.0]  # below all (1 - max(1, 1)), midpoints, the maximum
    assert removed(np.array([[np.nan, 5.0, 5.0, 5.0]]), np.zeros(4), 4).tolist() == [True]


def test_deterministic():
    df = separable(seed=3)
    rng = np.random.default_rng(7)
    df["clip_image"] += rng.normal(0, 0.08, len(df))  # overlap: a real trade-off
    args = (df[list(SCORE_COLUMNS)].to_numpy(), df["ooc"].to_numpy())
    a, b = calibrate(*args), calibrate(*args)
    assert a.thresholds == b.thresholds and a.stats == b.stats
    assert a.stats.tpr >= 0.9


def test_cli_writes_a_mergeable_partial_config(tmp_path: Path, capsys):
    labels = tmp_path / "labels.parquet"
    separable().to_parquet(labels)
    out = tmp_path / "thresholds.yaml"
    assert run_cli([str(labels), "--output", str(out), "--target-tpr", "0.9", "--min-pass", "2"]) == 0
    printed = capsys.readouterr().out
    assert "calibrated (2 of 4 pass)" in printed and "clip_text only baseline" in printed
    assert printed.count("TPR") >= 3 and "FPR" in printed and "accuracy" in printed
    data = yaml.safe_load(out.read_text())
    assert set(data) == {"filter"} and data["filter"]["min_pass"] == 2
    assert set(data["filter"]["thresholds"]) == set(SCORE_COLUMNS)
    cfg = load_config(TINY_CONFIG, threshold_overrides(str(out)))
    assert cfg.filter.thresholds.model_dump() == data["filter"]["thresholds"] and cfg.filter.min_pass == 2
    assert cfg.filter.clip.model == load_config(TINY_CONFIG).filter.clip.model  # the rest is untouched
    # `cnsbench build CONFIG --filter-thresholds FILE` is the way in
    from pipeline.cli import make_parser

    args = make_parser().parse_args(["build", str(TINY_CONFIG), "--filter-thresholds", str(out)])
    assert args.filter_thresholds == str(out)
    # CSV input works the same way
    csv = tmp_path / "labels.csv"
    separable().to_csv(csv, index=False)
    assert run_cli([str(csv), "--output", str(tmp_path / "t2.yaml")]) == 0
    assert yaml.safe_load((tmp_path / "t2.yaml").read_text()) == data


@pytest.mark.parametrize(
    "mutate, suffix, message",
    [
        (lambda df: df.drop(columns=["dino_image"]), ".parquet", "missing column(s) ['dino_image']"),
        (lambda df: df.assign(clip_text=df["clip_text"].astype(str).where(df.index != 4, "high")), ".csv",
         "column 'clip_text' must be numeric; row 4 has 'high'"),
        (lambda df: df.assign(ooc=df["ooc"].astype(object).where(df.index != 2, "maybe")), ".csv",
         "column 'ooc' must be boolean; row 2 has 'maybe'"),
        (lambda df: df.assign(ooc=True), ".parquet", "no in-class (ooc false) rows"),
        (lambda df: df.iloc[0:0], ".parquet", "no rows"),
        (lambda df: df, ".txt", "must be a .parquet or .csv file"),
    ],
)
def test_malformed_labels(tmp_path: Path, mutate, suffix, message):
    df = mutate(separable())
    path = tmp_path / f"labels{suffix}"
    if suffix == ".parquet":
        df.to_parquet(path)
    else:
        df.to_csv(path, index=False)
    with pytest.raises(CalibrationError) as err:
        read_labels(str(path))
    assert message in str(err.value) and str(path) in str(err.value)


def test_bad_settings_and_files(tmp_path: Path):
    with pytest.raises(CalibrationError, match="not found"):
        read_labels(str(tmp_path / "nope.parquet"))
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1 not really")
    with pytest.raises(CalibrationError, match="cannot read it"):
        read_labels(str(garbage))
    df = separable()
    args = (df[list(SCORE_COLUMNS)].to_numpy(), df["ooc"].to_numpy())
    with pytest.raises(CalibrationError, match="target-tpr"):
        calibrate(*args, target_tpr=1.5)
    with pytest.raises(CalibrationError, match="min-pass"):
        calibrate(*args, min_pass=0)
    bad = tmp_path / "t.yaml"
    bad.write_text(yaml.safe_dump({"filter": {"thresholds": {"clip_text": 1.0}, "enabled": False}}))
    with pytest.raises(ConfigError, match="only filter.thresholds and filter.min_pass"):
        threshold_overrides(str(bad))
    bad.write_text(yaml.safe_dump({"filter": {"thresholds": {"clip_txt": 1.0}}}))
    with pytest.raises(ConfigError, match="filter.thresholds takes the keys"):
        threshold_overrides(str(bad))
    bad.write_text(yaml.safe_dump({"classifiers": []}))
    with pytest.raises(ConfigError, match="exactly one top-level key 'filter'"):
        threshold_overrides(str(bad))
    bad.write_text(yaml.safe_dump({"filter": {"min_pass": 7}}))
    with pytest.raises(ConfigError, match="min_pass"):
        load_config(TINY_CONFIG, threshold_overrides(str(bad)))  # the config validates the values
