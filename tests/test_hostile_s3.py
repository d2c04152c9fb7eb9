"""The same promises on object storage (an S3-compatible server on 127.0.0.1): crafted
manifests are quarantined, foreign prefixes refused, the lease held and released."""

from __future__ import annotations

import json

import pytest
from hostile import synthetic_output, tiny_cfg_path
from s3server import s3_environment

from pipeline.cli import main

BUCKET = "cnsbench-hostile"


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    with s3_environment(BUCKET):
        yield f"s3://{BUCKET}"


def upload(local_dir, uri: str) -> None:
    import fsspec

    fs, root = fsspec.core.url_to_fs(uri)
    for path in sorted(local_dir.rglob("*")):
        if path.is_file():
            fs.pipe(f"{root}/{path.relative_to(local_dir).as_posix()}", path.read_bytes())


def test_crafted_manifest_on_s3_is_quarantined_and_nothing_else_deleted(s3, tmp_path, capsys):
    import fsspec

    from pipeline.output_run import clean_uncommitted, committed_trajectories
    from pipeline.io.store import OutputStore

    local = tmp_path / "out"
    synthetic_output(local, tiny_cfg_path(tmp_path))
    uri = f"{s3}/builds/a"
    upload(local, uri)
    fs, _ = fsspec.core.url_to_fs(uri)
    fs.pipe(f"{BUCKET}/victim/x", b"precious")
    fs.pipe(f"{BUCKET}/builds/a/images/holiday.tar", b"theirs")
    doc = {
        "shard": "shard-00000000000000aa",
        "trajectories": [],
        "files": {"../../victim/x": {"size": 1, "sha256": "0" * 64}},
        "n_samples": 0,
        "failed": {},
        "stats": {},
    }
    fs.pipe(f"{BUCKET}/builds/a/manifest/shard-00000000000000aa.json", json.dumps(doc).encode())
    assert main(["status", uri]) == 3
    assert "shard-00000000000000aa.json" in capsys.readouterr().out
    store = OutputStore(uri)
    done, _ = committed_trajectories(store, repair=True, echo=print)
    clean_uncommitted(store, print)
    fs.invalidate_cache()
    assert len(done) == 8
    assert fs.cat(f"{BUCKET}/victim/x") == b"precious"
    assert fs.cat(f"{BUCKET}/builds/a/images/holiday.tar") == b"theirs"
    assert fs.glob(f"{BUCKET}/builds/a/previous/quarantine/*/manifest/shard-00000000000000aa.json")
    assert main(["status", uri]) == 0


def test_foreign_prefix_is_refused_and_lease_round_trip(s3, tmp_path, capsys):
    import fsspec

    from pipeline.io.lease import LeaseHeld, acquire, hold_lease, read_lease
    from pipeline.io.store import OutputStore

    fs, _ = fsspec.core.url_to_fs(s3)
    fs.pipe(f"{BUCKET}/theirs/data.csv", b"1,2")
    cfg = tiny_cfg_path(tmp_path)
    assert main(["build", str(cfg), "--output", f"{s3}/theirs", "--runner", "local"]) == 2
    assert "not a cnsbench output" in capsys.readouterr().err
    fs.invalidate_cache()
    assert fs.ls(f"{BUCKET}/theirs", detail=False) == [f"{BUCKET}/theirs/data.csv"]

    uri = f"{s3}/builds/leased"
    with hold_lease(uri, "build") as lease:
        assert read_lease(OutputStore(uri)).token == lease.info.token
        with pytest.raises(LeaseHeld, match="being written by"):
            acquire(OutputStore(uri), "evaluate")
    assert read_lease(OutputStore(uri)) is None


def test_a_lease_renewed_between_open_and_read_is_read_again(s3, monkeypatch):
    """The lease is rewritten while a worker reads it (its heartbeat): s3fs then refuses the
    read of the object it opened (PreconditionFailed on the old ETag).  That is a race, not a
    fault: the read is retried and returns the new lease whole."""
    from pipeline.io import retry
    from pipeline.io.store import OutputStore

    monkeypatch.setattr(retry.time, "sleep", lambda s: None)
    store = OutputStore(f"{s3}/builds/renewed")
    store.write_bytes("lease.json", b'{"renewal": 1}')
    opened = store.fs.open
    replaced = []

    def open_then_renew(path, mode="rb", **kwargs):
        fh = opened(path, mode, **kwargs)
        if not replaced:  # the heartbeat's write lands after the open took the old ETag
            replaced.append(1)
            store.fs.pipe(path, b'{"renewal": 2}')
        return fh

    monkeypatch.setattr(store.fs, "open", open_then_renew)
    assert store.read_bytes("lease.json") == b'{"renewal": 2}'
    assert replaced == [1]
