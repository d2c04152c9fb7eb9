"""Outputs: foreign directories are refused, crafted manifests cannot delete outside files,
corrupt and overlapping manifests are reported, quarantined and never counted."""

from __future__ import annotations

import json
import os

import pytest
from hostile import (  # noqa: F401 (built: a fixture)
    VICTIM_TEXT,
    built,
    crafted_manifest,
    foreign_directory,
    manifest_paths,
    synthetic_output,
    tamper_manifest,
    tiny_cfg_path,
    tree_digest,
    victim,
)

from pipeline.output_run import clean_uncommitted, committed_trajectories
from pipeline.cli import main
from pipeline.io.store import OutputStore


def test_manifest_pointing_outside_deletes_nothing_outside(built, tmp_path):
    cfg, out = built
    secret = victim(tmp_path)
    before = tree_digest(tmp_path, skip=out)
    first = manifest_paths(out)[0]
    data = json.loads(first.read_text())
    # the attack: an entry outside the output with a wrong size, so "repair" would delete it
    tamper_manifest(first, files={**data["files"], "../../victim/x": {"size": 1, "sha256": "0" * 64}})
    tamper_manifest(manifest_paths(out)[1], files={str(secret): {"size": 1, "sha256": "0" * 64}})
    messages: list[str] = []
    done, _ = committed_trajectories(OutputStore(str(out)), repair=True, echo=messages.append)
    clean_uncommitted(OutputStore(str(out)), messages.append)
    assert secret.read_bytes() == VICTIM_TEXT
    assert tree_digest(tmp_path, skip=out) == before
    assert len(done) == 4  # the two tampered shards are not counted; they will be redone
    assert sum("moved it to previous/quarantine/" in m for m in messages) == 2
    assert len(list((out / "previous" / "quarantine").rglob("*.json"))) == 2


def test_build_with_a_crafted_manifest_exits_0_and_leaves_the_outside_alone(built, tmp_path, capsys):
    cfg, out = built
    secret = victim(tmp_path)
    before = tree_digest(tmp_path, skip=out)
    crafted_manifest(out, "shard-00000000000000aa", {"../../victim/x": {"size": 1, "sha256": "0" * 64}})
    crafted_manifest(out, "shard-00000000000000bb", {str(secret): {"size": 1, "sha256": "0" * 64}})
    assert main(["build", str(cfg), "--output", str(out), "--runner", "local"]) == 0
    text = capsys.readouterr().out
    assert "8 already done, 0 to make" in text and "quarantine" in text
    assert secret.read_bytes() == VICTIM_TEXT and tree_digest(tmp_path, skip=out) == before
    assert (out / "report" / "index.html").is_file()


def test_foreign_directory_is_refused_and_untouched(tmp_path, capsys):
    cfg = tiny_cfg_path(tmp_path)
    foreign = tmp_path / "theirs"
    before = foreign_directory(foreign)
    assert main(["build", str(cfg), "--output", str(foreign), "--runner", "local"]) == 2
    err = capsys.readouterr().err
    assert "not a cnsbench output" in err
    assert str(foreign) in err and "images" in err and "notes.txt" in err
    assert tree_digest(foreign) == before
    # evaluate refuses it the same way
    from hostile import cns_entry, cns_source, png_bytes

    src = cns_source(tmp_path / "CNS", [cns_entry("snow/001_goldfish/a.png")], {"snow/001_goldfish/a.png": png_bytes(1)})
    assert main(["evaluate", str(src), "--config", str(cfg), "--output", str(foreign), "--runner", "local"]) == 2
    assert "not a cnsbench output" in capsys.readouterr().err
    assert tree_digest(foreign) == before


def test_cleanup_deletes_only_our_own_names(built):
    _, out = built
    (out / "images" / "holiday.tar").write_bytes(b"theirs")
    (out / "samples" / "notes.parquet").write_bytes(b"theirs")
    orphan = out / "images" / "shard-00000000000000cc.tar"
    orphan.write_bytes(b"ours, uncommitted")
    clean_uncommitted(OutputStore(str(out)), print)
    assert (out / "images" / "holiday.tar").exists() and (out / "samples" / "notes.parquet").exists()
    assert not orphan.exists()


@pytest.mark.parametrize("command", ["build", "status", "aggregate"])
def test_output_that_is_a_file(tmp_path, capsys, command):
    cfg = tiny_cfg_path(tmp_path)
    f = tmp_path / "a-file"
    f.write_text("x")
    argv = ["build", str(cfg), "--output", str(f), "--runner", "local"] if command == "build" else [command, str(f)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(f) in err and "not a directory" in err and "Traceback" not in err
    assert f.read_text() == "x"


@pytest.mark.parametrize("command", ["status", "aggregate"])
def test_readers_never_create_the_output(tmp_path, capsys, command):
    missing = tmp_path / "nope" / "out"
    assert main([command, str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err
    assert not (tmp_path / "nope").exists()


def test_marker_that_is_not_ours(built, tmp_path, capsys):
    cfg, out = built
    (out / "config.json").write_text("[1, 2, 3]")
    before = tree_digest(out)
    for argv in (["build", str(cfg), "--output", str(out), "--runner", "local"], ["status", str(out)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "config.json" in err and "Traceback" not in err
    assert tree_digest(out) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_read_only_output(tmp_path, capsys):
    cfg = tiny_cfg_path(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert main(["build", str(cfg), "--output", str(ro / "out"), "--runner", "local"]) == 2
        assert "not writable" in capsys.readouterr().err
    finally:
        ro.chmod(0o700)


# --------------------------------------------------------------------------- damaged bookkeeping
def test_corrupt_manifest_is_listed_skipped_and_quarantined(built, capsys):
    cfg, out = built
    bad = manifest_paths(out)[0]
    bad.write_text('{"shard": "trunc')
    assert main(["status", str(out)]) == 3
    text = capsys.readouterr().out
    assert "problems: 1 manifest" in text and bad.name in text and "6/8 trajectories" in text
    assert main(["aggregate", str(out)]) == 0  # the rest still aggregates
    metrics = json.loads((out / "report" / "metrics.json").read_text())
    assert metrics["counts"]["n_trajectories_total"] == 6
    done, _ = committed_trajectories(OutputStore(str(out)), repair=True, echo=print)
    assert len(done) == 6 and not bad.exists()
    assert len(list((out / "previous" / "quarantine").rglob(bad.name))) == 1
    assert OutputStore(str(out)).scan().problems == []


def test_overlapping_manifests_count_once_and_the_later_is_quarantined(built, capsys):
    cfg, out = built
    store = OutputStore(str(out))
    first = sorted(store.manifests(), key=lambda m: m.shard)[0]
    # a second writer committed a shard holding one of the same trajectories, later
    dup = crafted_manifest(out, "shard-00000000000000dd", {}, trajectories=[first.trajectories[0]])
    os.utime(dup, (2e9, 2e9))
    scan = store.scan()
    assert [p.file for p in scan.problems] == [f"manifest/{dup.name}"] and scan.problems[0].kind == "overlap"
    assert main(["status", str(out)]) == 3
    assert "already committed by" in capsys.readouterr().out
    assert main(["aggregate", str(out)]) == 0  # no "duplicated sample_id values"
    done, _ = committed_trajectories(store, repair=True, echo=print)
    assert len(done) == 8 and not dup.exists()


def test_trajectories_per_shard_cannot_change_on_resume(built, tmp_path):
    from pipeline.output_run import IncompatibleOutput, check_compatible
    from pipeline.config import load_config

    _, out = built
    cfg = load_config(tiny_cfg_path(tmp_path, lambda r: r["output"].update(trajectories_per_shard=3), name="b.yaml"))
    with pytest.raises(IncompatibleOutput, match="trajectories_per_shard"):
        check_compatible(OutputStore(str(out)), cfg)


def test_serve_index_skips_bad_manifests(built):
    from pipeline.serve.index import read_committed

    _, out = built
    paths = manifest_paths(out)
    paths[0].write_text("[]")
    crafted_manifest(out, "shard-00000000000000ee", {"../../victim/x": {"size": 1, "sha256": "0" * 64}})
    samples, _, skipped = read_committed(OutputStore(str(out)))
    assert samples["sample_id"].is_unique and len(samples) == 36
    assert {s["file"] for s in skipped} == {f"manifest/{paths[0].name}", "manifest/shard-00000000000000ee.json"}
