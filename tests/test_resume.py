"""Resume for real: local builds killed with SIGKILL at several points, then resumed,
match an uninterrupted build; damaged shards are redone; changed configs are refused or
extend the output.  (A Ray worker node killed: test_cluster.py; crashing Ray actors:
test_build_e2e.py.)

A build that is killed runs in a child forked from this process (see ``buildproc``), a
whole process that the kill takes at once; the runs that nothing kills (references,
resumes) run in this process.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from buildproc import assert_same, build_here, kill_at, snapshot, tiny_config

from pipeline.cli import main

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def cfg_path(tmp_path_factory) -> Path:
    return tiny_config(tmp_path_factory.mktemp("cfg"))


@pytest.fixture(scope="module")
def reference_out(tiny_reference) -> Path:
    """An uninterrupted in-process build of the same config (read-only: a test that changes
    it copies it)."""
    return tiny_reference


@pytest.fixture(scope="module")
def reference_local(reference_out):
    return snapshot(reference_out)


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
    assert build_here(cfg_path, out) == 0
    assert_same(snapshot(out), reference_local)
    assert not list(out.rglob(".tmp-*"))
    assert not (out / "attempts").exists()


def test_damaged_shards_are_detected_and_regenerated(cfg_path, reference_out, reference_local, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(reference_out, out)
    tars = sorted((out / "images").glob("*.tar"))
    tars[0].write_bytes(tars[0].read_bytes()[:1000])  # truncated
    data = bytearray(tars[1].read_bytes())
    data[700] ^= 0xFF  # corrupted, same size: only a deep check sees it
    tars[1].write_bytes(bytes(data))
    assert main(["status", str(out), "--verify"]) == 3  # damaged shards: exit 3, naming what to run
    text = capsys.readouterr().out
    assert f"{tars[0].stem} is damaged" in text and "truncated" in text
    assert f"{tars[1].stem} is damaged" in text and "sha256" in text
    assert build_here(cfg_path, out, "--verify") == 0
    assert "regenerating it" in capsys.readouterr().out
    assert_same(snapshot(out), reference_local)


def test_incompatible_config_is_refused_unless_new_version(cfg_path, tmp_path, capsys):
    out = tmp_path / "out"
    raw = yaml.safe_load(cfg_path.read_text())
    raw["benchmark"]["seeds"] = [1]
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump(raw))
    assert build_here(small, out) == 0
    # Extending the plan (a new seed) computes only the new trajectories.
    raw["benchmark"]["seeds"] = [1, 2]
    small.write_text(yaml.safe_dump(raw))
    capsys.readouterr()
    assert build_here(small, out) == 0
    assert "8 trajectories planned, 4 already done, 4 to make" in capsys.readouterr().out
    # Changing what existing rows mean is refused, naming the keys.
    raw["generator"]["steps"] = 20
    raw["filter"]["min_pass"] = 3
    small.write_text(yaml.safe_dump(raw))
    assert build_here(small, out) == 2
    err = capsys.readouterr().err
    assert "generator.steps: 10 -> 20" in err and "filter.min_pass: 2 -> 3" in err
    assert build_here(small, out, "--new-version") == 0
    previous = list((out / "previous").iterdir())
    assert len(previous) == 1 and len(list((previous[0] / "manifest").glob("*.json"))) == 4


def test_added_classifier_runs_only_on_committed_images(cfg_path, reference_local, tmp_path, capsys):
    raw = yaml.safe_load(cfg_path.read_text())
    all_classifiers = raw["classifiers"]
    raw["classifiers"] = all_classifiers[:2]
    cfg = tmp_path / "two.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    assert build_here(cfg, out) == 0
    assert set(snapshot(out)["predictions"]["classifier"]) == {c["name"] for c in all_classifiers[:2]}
    raw["classifiers"] = all_classifiers
    cfg.write_text(yaml.safe_dump(raw))
    capsys.readouterr()
    assert build_here(cfg, out) == 0
    text = capsys.readouterr().out
    assert "adding predictions of tiny-clip-zs to 4 committed shard(s)" in text
    assert "8 already done, 0 to make" in text
    snap, ref = snapshot(out), reference_local
    assert snap["images"] == ref["images"]  # nothing regenerated
    pd.testing.assert_frame_equal(snap["predictions"], ref["predictions"], check_exact=False, rtol=1e-5)
    # A changed spec behind an existing name is refused.
    raw["classifiers"][0]["model_kwargs"]["stem_width"] = 16
    cfg.write_text(yaml.safe_dump(raw))
    assert build_here(cfg, out) == 2
    assert "classifiers.tiny-resnet.model_kwargs.stem_width" in capsys.readouterr().err
