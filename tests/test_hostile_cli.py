"""Every path argument of the CLI, given the wrong kind of path, exits 2 naming it (no traceback)."""

from __future__ import annotations

import pytest
from hostile import cns_entry, cns_source, png_bytes, synthetic_output, tiny_cfg_path, tree_digest, victim

from pipeline.cli import main


@pytest.fixture
def paths(tmp_path):
    cfg = tiny_cfg_path(tmp_path)
    a_file = tmp_path / "a-file.txt"
    a_file.write_text("x")
    a_dir = tmp_path / "a-dir"
    a_dir.mkdir()
    return {"cfg": str(cfg), "file": str(a_file), "dir": str(a_dir), "missing": str(tmp_path / "missing" / "m.yaml")}


CASES = [
    # (argv template, which path to name)
    (["validate", "{dir}"], "dir"),
    (["validate", "{missing}"], "missing"),
    (["build", "{dir}", "--output", "{tmp}/o1", "--runner", "local"], "dir"),
    (["build", "{missing}", "--output", "{tmp}/o2", "--runner", "local"], "missing"),
    (["build", "{cfg}", "--output", "{file}", "--runner", "local"], "file"),
    (["build", "{cfg}", "--output", "{file}/sub", "--runner", "local"], "file"),
    (["build", "{cfg}", "--output", "{tmp}/o3", "--filter-thresholds", "{dir}", "--runner", "local"], "dir"),
    (["build", "{cfg}", "--output", "{tmp}/o4", "--filter-thresholds", "{missing}", "--runner", "local"], "missing"),
    (["status", "{file}"], "file"),
    (["status", "{missing}"], "missing"),
    (["aggregate", "{file}"], "file"),
    (["aggregate", "{dir}"], "dir"),
    (["evaluate", "{missing}", "--config", "{cfg}", "--output", "{tmp}/o5", "--runner", "local"], "missing"),
    (["evaluate", "{file}", "--config", "{cfg}", "--output", "{tmp}/o6", "--runner", "local"], "file"),
    (["evaluate", "{dir}", "--config", "{dir}", "--output", "{tmp}/o7", "--runner", "local"], "dir"),
    (["evaluate", "{dir}", "--config", "{cfg}", "--output", "{tmp}/o8", "--label-map", "{dir}", "--runner", "local"], "dir"),
    (["calibrate-filter", "{missing}", "--output", "{tmp}/t.yaml"], "missing"),
    (["calibrate-filter", "{dir}", "--output", "{tmp}/t.yaml"], "dir"),
    (["train-sliders", "{dir}", "--runner", "local"], "dir"),
    (["train-sliders", "{cfg}", "--output", "{file}", "--runner", "local"], "file"),
    (["serve", "--output", "{missing}"], "missing"),
    (["serve", "--output", "{file}"], "file"),
    (["serve", "--config", "{dir}"], "dir"),
    (["submit", "{missing}", "--output", "s3://b/x", "--address", "http://127.0.0.1:1"], "missing"),
    (["submit", "{cfg}", "--output", "s3://b/x", "--address", "http://127.0.0.1:1", "--token-file", "{dir}"], "dir"),
]


@pytest.mark.parametrize(("argv", "named"), CASES, ids=[" ".join(a[:1] + [n]) + str(i) for i, (a, n) in enumerate(CASES)])
def test_wrong_kind_of_path(paths, tmp_path, capsys, argv, named):
    if argv[0] == "evaluate" and "--label-map" in argv:  # a class-folder source, so the map is read
        (tmp_path / "a-dir" / "001_goldfish").mkdir()
        (tmp_path / "a-dir" / "001_goldfish" / "a.png").write_bytes(png_bytes(1))
    filled = [a.format(tmp=str(tmp_path), **paths) for a in argv]
    before = tree_digest(tmp_path)
    rc = main(filled)
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert "Traceback" not in err + out
    assert paths[named] in err or paths[named].rsplit("/", 1)[0] in err, err
    assert tree_digest(tmp_path) == before  # nothing created, nothing changed


def test_evaluate_of_traversing_annotations_copies_nothing(tmp_path, capsys):
    secret = victim(tmp_path)
    (secret.parent / "secret.png").write_bytes(png_bytes(9))
    src = cns_source(
        tmp_path / "CNS",
        [cns_entry("snow/001_goldfish/a.png"), cns_entry("snow/../../victim/secret.png", seed=1)],
        {"snow/001_goldfish/a.png": png_bytes(1)},
    )
    out = tmp_path / "eval"
    cfg = tiny_cfg_path(tmp_path)
    assert main(["evaluate", str(src), "--config", str(cfg), "--output", str(out), "--runner", "local"]) == 2
    assert "images[1]" in capsys.readouterr().err
    assert not out.exists()


def test_status_of_a_healthy_output_shows_no_lease(tmp_path, capsys):
    out = tmp_path / "out"
    synthetic_output(out, tiny_cfg_path(tmp_path))
    assert main(["status", str(out)]) == 0
    text = capsys.readouterr().out
    assert "lease       none" in text and "8/8 trajectories" in text
