"""Resume on Ray: a Ray build killed with SIGKILL mid-write resumes to the in-process
build's output; a crashing actor is restarted and retried, one that always crashes is
given up and reported, and the next run completes the build.

The killed Ray build runs in a subprocess inside its own PID namespace (see ``buildproc``),
so the kill takes the driver and every Ray process of that build with it; the crashing
actors run on this test worker's Ray.  The runs after them (resumes, the reference) run in
this process: resuming is the driver's work (plan, clean up, commit), whichever runner
made the shards, and test_cluster resumes on Ray.
"""

from __future__ import annotations

import pandas as pd
import pytest
from buildproc import RAY_SUBPROCESS_TEST_S, assert_same, build_here, kill_at, snapshot, tiny_config

from pipeline.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(RAY_SUBPROCESS_TEST_S)]


@pytest.fixture(scope="module")
def cfg_path(tmp_path_factory):
    return tiny_config(tmp_path_factory.mktemp("cfg"))


def test_killed_ray_build_resumes_identically(cfg_path, tmp_path, capsys):
    """Shards a Ray build committed before its kill, completed in process, equal the
    in-process build's (ids and seeds come from coordinates, so the runner changes nothing)."""
    out = tmp_path / "out"
    # The last unit's write pauses (files written, manifest not): the kill lands with the
    # other shards committed by Ray and one half-written.
    kill_at(cfg_path, out, "ray", "write:before_manifest:painting_style/022/seed_0002:pause", tmp_path / "faults")
    committed = len(list((out / "manifest").glob("*.json")))
    assert committed >= 1, "the Ray build committed nothing before the last unit"
    assert build_here(cfg_path, out) == 0
    text = capsys.readouterr().out
    assert f"8 trajectories planned, {2 * committed} already done" in text and "uncommitted file" in text
    reference = tmp_path / "reference"
    assert build_here(cfg_path, reference) == 0
    assert_same(snapshot(out), snapshot(reference))


def test_crashing_actor_is_retried_then_reported(cfg_path, tmp_path, capsys, monkeypatch, ray_session):
    # On this test worker's Ray (the rules reach the actors through their runtime_env): a
    # crash takes an actor's process, not the driver.
    out = tmp_path / "out"
    faults = tmp_path / "faults"
    faults.mkdir()
    # The generation actor dies (hard exit) once on one unit: restarted, retried, fine.
    # The classifier actor dies every time on one batch: given up after the retries.
    rule = "generate:start:001/seed_0002:crash_once;classify:start:heavy_snow/022/seed_0002:crash"
    monkeypatch.setenv("CNSBENCH_FAULT_INJECT", rule)
    monkeypatch.setenv("CNSBENCH_FAULT_DIR", str(faults))
    capsys.readouterr()
    rc = main(["build", str(cfg_path), "--output", str(out), "--runner", "ray"])
    printed = capsys.readouterr().out
    assert rc == 3, printed[-3000:]
    monkeypatch.delenv("CNSBENCH_FAULT_INJECT")
    monkeypatch.delenv("CNSBENCH_FAULT_DIR")
    assert list(faults.glob("crashed-generate-*"))
    assert "FAILED heavy_snow/022/seed_0002: [classify] worker crashed 3 times" in printed
    snap = snapshot(out)
    done = {k.rsplit("_scale_", 1)[0] for k in snap["images"]}
    assert "heavy_snow/022/seed_0002" not in done and "painting_style/001/seed_0002" in done
    assert 6 <= len(done) <= 7  # the crashing batch holds the failed trajectory and maybe one more
    failures = pd.concat(pd.read_parquet(p) for p in (out / "failures").glob("*.parquet"))
    assert "heavy_snow/022/seed_0002" in set(failures["trajectory_id"])
    assert set(failures["stage"]) == {"classify"}
    assert main(["status", str(out)]) == 3
    # The next run retries the failed trajectories and completes the build.
    capsys.readouterr()
    assert build_here(cfg_path, out) == 0
    assert f"{8 - len(done)} to make" in capsys.readouterr().out
    assert len(snapshot(out)["images"]) == 48
