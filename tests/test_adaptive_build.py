"""Adaptive builds for real (tiny config, in process): the bench's smallest size, and a build
killed with SIGKILL mid-round that resumes to the same allocation and digest (docs/adaptive.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from buildproc import build_here, kill_at, tiny_config

from pipeline.io.digest import output_digest

ROOT = Path(__file__).resolve().parent.parent


def adaptive_tiny(directory: Path) -> Path:
    """The tiny config over seeds 1..4 with a target it cannot meet: rounds of 2 trajectories
    after the pilot until the cap of 72 images (the pilot's 48 and two rounds)."""
    def mutate(raw: dict) -> None:
        raw["benchmark"]["seeds"] = "1..4"
        raw.setdefault("aggregate", {})["bootstrap"] = {"resamples": 0}
        raw["sampling"] = {"target": 0.01, "max_images": 72, "pilot": 2, "round_size": 2}

    return tiny_config(directory, mutate, name="adaptive.yaml")


def design(out: Path) -> dict:
    return json.loads((out / "report" / "metrics.json").read_text())["sampling"]


@pytest.mark.cluster  # the bench's smoke run: builds
def test_bench_smoke_builds_a_subset_with_the_replayed_allocation(tmp_path, capsys):
    """bench/adaptive.py at its smallest size."""
    sys.path.insert(0, str(ROOT / "bench"))
    import adaptive

    assert adaptive.main(["--smoke", "--json", "--work", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["build"]["subset_of_uniform"] and doc["build"]["same_allocation_as_replay"]
    assert doc["build"]["every_accuracy_row_has_interval"]
    figures = doc["targets"]["0.3"]
    assert set(figures) >= {"images_ratio", "coverage", "kendall_tau", "efficiency"}
    assert 0 < figures["images_ratio"] <= 1 and 0 <= figures["coverage"] <= 1
    # Real-valued seeds per stratum never need more than whole ones.
    assert figures["efficiency_fractional"] <= figures["efficiency"] + 1e-9


@pytest.mark.slow
def test_killed_mid_round_resumes_to_the_same_allocation_and_digest(tmp_path):
    cfg = adaptive_tiny(tmp_path)
    reference = tmp_path / "reference"
    assert build_here(cfg, reference) == 0
    ref = design(reference)
    assert ref["stop"] == "cap reached" and len(ref["rounds"]) == 3
    assert [r["images"] for r in ref["rounds"]] == [48, 60, 72]
    # A (class, seed) unit only a later round makes: kill the build as it generates it.
    later = next(r for r in ref["seeds_per_stratum"] if r["seeds"] >= 3)
    out = tmp_path / "out"
    kill_at(cfg, out, "local", f"generate:start:{later['class_id']:03d}/seed_0003:pause", tmp_path / "faults")
    assert (out / "config.json").exists() and not (out / "report" / "metrics.json").exists()
    assert build_here(cfg, out) == 0
    again = design(out)
    assert again["seeds_per_stratum"] == ref["seeds_per_stratum"] and again["rounds"] == ref["rounds"]
    assert output_digest(str(out)) == output_digest(str(reference))
    rows = json.loads((out / "report" / "metrics.json").read_text())["accuracy"]
    assert rows and all(r["accuracy_ci_low"] is not None and r["accuracy_ci_high"] is not None
                        for r in rows if r["accuracy"] is not None)
