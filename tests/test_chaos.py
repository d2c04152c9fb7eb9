"""A short randomised fault campaign (bench/chaos.py): every faulted build resumes to the clean output."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
CHAOS = Path(__file__).resolve().parents[1] / "bench" / "chaos.py"


def test_faulted_runs_end_identical_to_the_clean_build(tmp_path, capsys):
    # One run keeps the suite short (kills at fixed points are tests/test_resume*.py's); the
    # contract's `--runs 3` and the 30-run campaigns are recorded in BENCHMARKS.md.
    spec = importlib.util.spec_from_file_location("chaos", CHAOS)
    chaos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chaos)
    assert chaos.main(["--runs", "1", "--seed", "1", "--json", "--runner", "local", "--workdir", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"runs", "faults", "outputs_differing", "resumes"} <= set(result)
    assert result["runs"] == 1 and result["outputs_differing"] == 0
    assert sum(result["faults"].values()) >= 1 and result["resumes"] >= 1
    assert all(run["same"] for run in result["per_run"])
