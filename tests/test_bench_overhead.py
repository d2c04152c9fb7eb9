"""bench/overhead.py: the per-image CPU at HEAD against a reference commit, at its smallest size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scriptload import load_script

ROOT = Path(__file__).resolve().parents[1]


def _overhead():
    return load_script("bench/overhead.py", "bench_overhead")


@pytest.mark.unit  # the bench's file read and its functions called: no run
def test_recorded_reference_is_a_commit():
    ref = json.loads((ROOT / "bench" / "overhead_reference.json").read_text())
    assert len(ref["commit"]) == 40 and int(ref["commit"], 16) >= 0 and ref["reason"]


@pytest.mark.unit  # the bench's file read and its functions called: no run
def test_figures_and_ratios():
    bench = _overhead()
    cal = {"images": 2000, "cpu_s_per_image": 0.003,
           "cpu_s_per_1000_images": {"driver": 0.1, "writer": 0.2, "generate_batches": 0.1},
           "cpu_s_by_process": {"default_worker.py": 40.0, "driver": 5.0}}
    assert bench.figures(cal) == {"cpu_s_per_image": 0.003, "driver_cpu_s_per_1000_images": 0.1,
                                  "workers_cpu_s_per_1000_images": 20.0}
    no_meter = {**cal, "cpu_s_by_process": {}}
    assert bench.figures(no_meter)["workers_cpu_s_per_1000_images"] == pytest.approx(0.3)
    ref = [{"cpu_s_per_image": 2.0, "driver_cpu_s_per_1000_images": 1.0, "workers_cpu_s_per_1000_images": 4.0},
           {"cpu_s_per_image": 4.0, "driver_cpu_s_per_1000_images": 1.0, "workers_cpu_s_per_1000_images": 4.0}]
    head = [{"cpu_s_per_image": 3.3, "driver_cpu_s_per_1000_images": 1.5, "workers_cpu_s_per_1000_images": 2.0}]
    out = bench.compare(ref, head)
    assert out["cpu_s_per_image"] == {"reference": 3.0, "head": 3.3, "ratio": 1.1}
    assert out["driver_cpu_s_per_1000_images"]["ratio"] == 1.5
    assert out["workers_cpu_s_per_1000_images"]["ratio"] == 0.5


@pytest.mark.unit  # the bench's file read and its functions called: no run
def test_a_reference_tree_without_the_bench_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no bench/scale.py there"):
        _overhead().main(["--reference-tree", str(tmp_path), "--runs", "1", "--smallest"])


@pytest.mark.slow
@pytest.mark.cluster  # the bench at its smallest size: a Ray run in a subprocess
def test_smallest_size_against_this_tree(capsys):
    # This checkout as its own reference (no git worktree): each run is a calibration in a Ray of its own.
    # Its actors idle 1 s for the base CPU, not --smallest's 3 s: only the figures' presence is checked here.
    out = _overhead().main(["--reference-tree", str(ROOT), "--runs", "1", "--smallest", "--calibrate-hold-s", "1", "--json"])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["head"] == out["head"] and len(out["runs"]["reference"]) == len(out["runs"]["head"]) == 1
    for metric in ("cpu_s_per_image", "driver_cpu_s_per_1000_images", "workers_cpu_s_per_1000_images"):
        assert out[metric]["reference"] > 0 and out[metric]["head"] > 0 and out[metric]["ratio"] > 0
