"""Resume for real: builds killed with SIGKILL at several points, then resumed, match an
uninterrupted build; crashed workers are retried then reported; damaged shards are redone.

Every build runs in a subprocess inside its own PID namespace (see ``buildproc``), so a
kill takes the driver and every Ray process of that build with it, and nothing of it can
outlive the test or touch other Ray processes on the host.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from buildproc import assert_same, tiny_config, env_with, kill_at, run_build, snapshot

from pipeline.cli import main

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def cfg_path(tmp_path_factory) -> Path:
    return tiny_config(tmp_path_factory.mktemp("cfg"))


@pytest.fixture(scope="module")
def reference_local(cfg_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref-local") / "out"
    res = run_build(cfg_path, out, "local")
    assert res.returncode == 0, res.stderr[-3000:]
    return snapshot(out)


@pytest.mark.parametrize(
    "rule",
    [
        "generate:start:022/seed_0001:pause",  # during generation
        "classify:start:painting_style/022:pause",  # during classification
        "write:before_manifest:*:pause",  # during a write: files written, manifest not
    ],
)
def test_killed_local_build_resumes_identically(cfg_path, reference_local, tmp_path, rule):
    out = tmp_path / "out"
    kill_at(cfg_path, out, "local", rule, tmp_path / "faults")
    res = run_build(cfg_path, out, "local")
    assert res.returncode == 0, res.stderr[-3000:]
    assert_same(snapshot(out), reference_local)
    assert not list(out.rglob(".tmp-*"))
    assert not (out / "attempts").exists()


def test_killed_ray_build_resumes_identically(cfg_path, reference_local, tmp_path):
    """Killed and resumed on Ray, the output equals the in-process build's (ids and seeds come
    from coordinates, so the runner changes nothing)."""
    out = tmp_path / "out"
    kill_at(cfg_path, out, "ray", "write:before_manifest:*:pause", tmp_path / "faults")
    first = len(list((out / "manifest").glob("*.json")))
    res = run_build(cfg_path, out, "ray")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "uncommitted file" in res.stdout or first == 0
    assert_same(snapshot(out), reference_local)


def test_crashing_actor_is_retried_then_reported(cfg_path, tmp_path):
    out = tmp_path / "out"
    faults = tmp_path / "faults"
    faults.mkdir()
    # The generation actor dies (hard exit) once on one unit: restarted, retried, fine.
    # The classifier actor dies every time on one batch: given up after the retries.
    rule = "generate:start:001/seed_0002:crash_once;classify:start:heavy_snow/022/seed_0002:crash"
    res = run_build(cfg_path, out, "ray", env_with(CNSBENCH_FAULT_INJECT=rule, CNSBENCH_FAULT_DIR=str(faults)))
    assert res.returncode == 3, res.stdout[-2000:] + res.stderr[-3000:]
    assert list(faults.glob("crashed-generate-*"))
    assert "FAILED heavy_snow/022/seed_0002: [classify] worker crashed 3 times" in res.stdout
    snap = snapshot(out)
    done = {k.rsplit("_scale_", 1)[0] for k in snap["images"]}
    assert "heavy_snow/022/seed_0002" not in done and "painting_style/001/seed_0002" in done
    assert 6 <= len(done) <= 7  # the crashing batch holds the failed trajectory and maybe one more
    failures = pd.concat(pq.read_table(p).to_pandas() for p in (out / "failures").glob("*.parquet"))
    assert "heavy_snow/022/seed_0002" in set(failures["trajectory_id"])
    assert set(failures["stage"]) == {"classify"}
    assert main(["status", str(out)]) == 3
    # The next run retries the failed trajectories and completes the build.
    res = run_build(cfg_path, out, "ray")
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(snapshot(out)["images"]) == 48


def test_damaged_shards_are_detected_and_regenerated(cfg_path, reference_local, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_build(cfg_path, out, "local").returncode == 0
    tars = sorted((out / "images").glob("*.tar"))
    tars[0].write_bytes(tars[0].read_bytes()[:1000])  # truncated
    data = bytearray(tars[1].read_bytes())
    data[700] ^= 0xFF  # corrupted, same size: only a deep check sees it
    tars[1].write_bytes(bytes(data))
    assert main(["status", str(out), "--verify"]) == 0
    text = capsys.readouterr().out
    assert f"{tars[0].stem} is damaged" in text and "truncated" in text
    assert f"{tars[1].stem} is damaged" in text and "sha256" in text
    res = run_build(cfg_path, out, "local", None, "--verify")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "regenerating it" in res.stdout
    assert_same(snapshot(out), reference_local)


def test_incompatible_config_is_refused_unless_new_version(cfg_path, tmp_path):
    out = tmp_path / "out"
    raw = yaml.safe_load(cfg_path.read_text())
    raw["benchmark"]["seeds"] = [1]
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump(raw))
    assert main(["build", str(small), "--output", str(out), "--runner", "local"]) == 0
    # Extending the plan (a new seed) computes only the new trajectories.
    raw["benchmark"]["seeds"] = [1, 2]
    small.write_text(yaml.safe_dump(raw))
    res = run_build(small, out, "local")
    assert res.returncode == 0 and "8 trajectories planned, 4 already done, 4 to make" in res.stdout
    # Changing what existing rows mean is refused, naming the keys.
    raw["generator"]["steps"] = 20
    raw["filter"]["min_pass"] = 3
    small.write_text(yaml.safe_dump(raw))
    res = run_build(small, out, "local")
    assert res.returncode == 2
    assert "generator.steps: 50 -> 20" in res.stderr and "filter.min_pass: 2 -> 3" in res.stderr
    res = run_build(small, out, "local", None, "--new-version")
    assert res.returncode == 0, res.stderr[-3000:]
    previous = list((out / "previous").iterdir())
    assert len(previous) == 1 and len(list((previous[0] / "manifest").glob("*.json"))) == 4


def test_added_classifier_runs_only_on_committed_images(cfg_path, reference_local, tmp_path):
    raw = yaml.safe_load(cfg_path.read_text())
    all_classifiers = raw["classifiers"]
    raw["classifiers"] = all_classifiers[:2]
    cfg = tmp_path / "two.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    assert run_build(cfg, out, "local").returncode == 0
    assert set(snapshot(out)["predictions"]["classifier"]) == {c["name"] for c in all_classifiers[:2]}
    raw["classifiers"] = all_classifiers
    cfg.write_text(yaml.safe_dump(raw))
    res = run_build(cfg, out, "local")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "adding predictions of tiny-clip-zs to 4 committed shard(s)" in res.stdout
    assert "8 already done, 0 to make" in res.stdout
    snap, ref = snapshot(out), reference_local
    assert snap["images"] == ref["images"]  # nothing regenerated
    pd.testing.assert_frame_equal(snap["predictions"], ref["predictions"], check_exact=False, rtol=1e-5)
    # A changed spec behind an existing name is refused.
    raw["classifiers"][0]["model_kwargs"]["stem_width"] = 16
    cfg.write_text(yaml.safe_dump(raw))
    res = run_build(cfg, out, "local")
    assert res.returncode == 2 and "classifiers.tiny-resnet.model_kwargs.stem_width" in res.stderr
