"""Storage faults: transient errors retried with a bounded budget, a full disk leaves nothing
half written, and an S3 output read and written through a fault-injecting proxy stays exact."""

from __future__ import annotations

import errno
import hashlib

import pytest
from faultproxy import FaultProxy
from s3server import S3Server, clear_s3_clients

from pipeline.io import retry
from pipeline.io.retry import StorageError, is_transient
from pipeline.io.store import OutputStore


@pytest.fixture(autouse=True)
def fast_budget(monkeypatch):
    monkeypatch.setenv("CNSBENCH_STORAGE_RETRIES", "4")
    monkeypatch.setenv("CNSBENCH_STORAGE_RETRY_SECONDS", "5")
    monkeypatch.setattr(retry.time, "sleep", lambda s: None)


class SlowDown(Exception):
    pass


def test_transient_errors_are_told_from_permanent_ones():
    assert is_transient(ConnectionResetError())
    assert is_transient(TimeoutError())
    assert is_transient(OSError(errno.ECONNRESET, "reset"))
    assert is_transient(SlowDown("An error occurred (SlowDown) when calling the PutObject operation"))
    assert is_transient(RuntimeError("upstream answered 503 Service Unavailable"))
    try:  # the cause of a wrapped error counts
        try:
            raise ConnectionResetError()
        except ConnectionResetError as inner:
            raise ValueError("could not write") from inner
    except ValueError as outer:
        assert is_transient(outer)
    assert not is_transient(FileNotFoundError("images/x.tar"))
    assert not is_transient(PermissionError("denied"))
    assert not is_transient(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_transient(ValueError("malformed manifest"))


def test_a_transient_failure_is_retried_until_it_passes():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset by peer")
        return "ok"

    assert retry.call("read", "s3://b/x", flaky) == "ok" and len(calls) == 3


def test_a_permanent_failure_is_not_retried_and_a_spent_budget_names_the_call():
    calls = []

    def missing():
        calls.append(1)
        raise FileNotFoundError("s3://b/x")

    with pytest.raises(FileNotFoundError):
        retry.call("read", "s3://b/x", missing)
    assert len(calls) == 1

    def always():
        calls.append(1)
        raise TimeoutError("read timed out")

    calls.clear()
    with pytest.raises(StorageError, match=r"storage: write s3://b/y still failing after 5 attempt\(s\)"):
        retry.call("write", "s3://b/y", always)
    assert len(calls) == 5


def test_a_full_disk_leaves_no_partial_file_and_says_so(tmp_path, monkeypatch):
    store = OutputStore(str(tmp_path / "out"))
    store.write_bytes("samples/a.parquet", b"old")
    real_open = store.fs.open

    class Full:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, data):
            self.fh.write(data[:3])
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store.fs, "open", lambda path, mode="rb", **kw: Full(real_open(path, mode, **kw)) if "w" in mode else real_open(path, mode, **kw))
    with pytest.raises(StorageError, match=r"no space left on the device writing .*samples/a.parquet.*run the same command again"):
        store.write_bytes("samples/a.parquet", b"new contents")
    monkeypatch.undo()
    assert (tmp_path / "out" / "samples" / "a.parquet").read_bytes() == b"old"
    assert not [p for p in (tmp_path / "out").rglob(".tmp-*")]


@pytest.fixture(scope="module")
def s3_server():
    pytest.importorskip("s3fs")
    server = S3Server()
    yield server
    server.stop()


def test_an_s3_output_through_a_faulty_network_reads_and_writes_exactly(s3_server, monkeypatch):
    monkeypatch.setenv("CNSBENCH_STORAGE_RETRIES", "8")
    s3_server.create_bucket("faults")
    with FaultProxy(s3_server.url, rate=0.25, kinds=("503", "drop", "truncate"), seed=3) as proxy:
        for k, v in s3_server.env(proxy.url).items():
            monkeypatch.setenv(k, v)
        clear_s3_clients()
        store = OutputStore("s3://faults/out")
        blobs = {f"images/{i:03d}.tar": hashlib.sha256(str(i).encode()).digest() * (50 + i) for i in range(20)}
        for rel, data in blobs.items():
            info = store.write_bytes(rel, data)
            assert info["sha256"] == hashlib.sha256(data).hexdigest()
        assert store.list("images", ".tar") == sorted(blobs)
        for rel, data in blobs.items():
            assert store.read_bytes(rel) == data
        injected = sum(proxy.counts.values())
    assert injected >= 5, proxy.counts
    clear_s3_clients()


def test_a_lease_over_a_faulty_network_is_taken_over_and_read_back(s3_server, monkeypatch):
    """A fresh client (no cached listing: sizes come from HEAD) reads each file whole, and a
    resumed build takes over the lease its killed predecessor left, through the same faults."""
    import json

    from pipeline.io import lease

    monkeypatch.setenv("CNSBENCH_STORAGE_RETRIES", "8")
    s3_server.create_bucket("leases")
    monkeypatch.setattr(lease, "SETTLE_S", 0.01)
    with FaultProxy(s3_server.url, rate=0.2, kinds=("503", "drop", "truncate"), seed=5) as proxy:
        for k, v in s3_server.env(proxy.url).items():
            monkeypatch.setenv(k, v)
        clear_s3_clients()
        dead = {"host": "gone", "pid": 999999, "command": "build", "started": 1.0, "heartbeat": 1.0,
                "token": "old", "proc_start": "1"}
        for i in range(6):
            store = OutputStore(f"s3://leases/out{i}")
            store.write_text(lease.LEASE, json.dumps(dead))
            store.fs.invalidate_cache()
            assert json.loads(store.read_bytes(lease.LEASE)) == dead
            held = lease.acquire(store, "build", echo=lambda msg: None)
            try:
                assert lease.read_lease(store).token == held.info.token != "old"
            finally:
                held.release()
            assert not store.exists(lease.LEASE)
        injected = sum(proxy.counts.values())
    assert injected >= 3, proxy.counts
    clear_s3_clients()


def test_retries_live_in_one_layer(s3_server, monkeypatch):
    """The output store's S3 client makes one attempt per request (s3fs's loop and botocore's off):
    a store read that fails every time costs the store's budget of attempts, not that budget
    times s3fs's 5 times botocore's 5."""
    monkeypatch.setenv("CNSBENCH_STORAGE_RETRIES", "2")
    s3_server.create_bucket("layers")
    for k, v in s3_server.env(s3_server.url).items():
        monkeypatch.setenv(k, v)
    clear_s3_clients()
    OutputStore("s3://layers/out").write_bytes("images/a.tar", b"x" * 10)
    with FaultProxy(s3_server.url, rate=1.0, kinds=("503",), seed=1) as proxy:
        for k, v in s3_server.env(proxy.url).items():
            monkeypatch.setenv(k, v)
        clear_s3_clients()
        store = OutputStore("s3://layers/out")
        assert store.fs.retries == 1
        assert store.fs.config_kwargs["retries"] == {"total_max_attempts": 1, "mode": "standard"}
        with pytest.raises(StorageError, match="still failing after 3 attempt"):
            store.read_bytes("images/a.tar")
        requests = proxy.counts["503"]
    assert 3 <= requests <= 6, requests  # 3 attempts, each one or two requests (a HEAD, then the GET)
    clear_s3_clients()
