"""One writer per output: a second build is refused naming the first; a dead writer's lease is taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from buildproc import env_with, tiny_config

from pipeline.io import lease as L
from pipeline.io.store import OutputStore


def test_a_fresh_lease_refuses_a_second_writer_and_a_stale_one_is_taken_over(tmp_path, monkeypatch):
    monkeypatch.setenv("CNSBENCH_LEASE_TIMEOUT", "30")
    store = OutputStore(str(tmp_path / "out"))
    lines: list[str] = []
    first = L.OutputLease(store, "cnsbench build", echo=lines.append).acquire()
    try:
        with pytest.raises(L.LeaseHeld, match=rf"being written by cnsbench build on .*pid {os.getpid()}"):
            L.OutputLease(store, "cnsbench evaluate").acquire()
        assert L.describe(store).startswith("held by cnsbench build")
    finally:
        first.release()
    assert not store.exists(L.LEASE) and L.describe(store) == "none (no writer)"

    # A writer that died: its heartbeat is older than the timeout.
    dead = {"command": "cnsbench build", "host": "node-7", "pid": 4242, "started_at": "then", "token": "x",
            "heartbeat": time.time() - 31}
    store.write_text(L.LEASE, json.dumps(dead))
    assert L.describe(store).startswith("stale")
    with L.OutputLease(store, "cnsbench build", echo=lines.append) as taker:
        assert json.loads(store.read_text(L.LEASE))["token"] == taker.token
    assert any("taking over the lease of cnsbench build on node-7 (pid 4242" in line for line in lines)


def test_the_heartbeat_keeps_the_lease_fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("CNSBENCH_LEASE_TIMEOUT", "2")
    store = OutputStore(str(tmp_path / "out"))
    with L.OutputLease(store, "cnsbench build"):
        time.sleep(2.5)
        assert time.time() - L.read(store)["heartbeat"] < 2
        with pytest.raises(L.LeaseHeld):
            L.OutputLease(store, "cnsbench build").acquire()


@pytest.mark.slow
def test_a_second_build_exits_2_while_the_first_runs_then_takes_over_after_a_kill(tmp_path):
    from pipeline.cli import main

    cfg = tiny_config(tmp_path)
    out = tmp_path / "out"
    env = env_with(CNSBENCH_LEASE_TIMEOUT="4", CNSBENCH_FAULT_INJECT="write:before_manifest:*:pause",
                   CNSBENCH_FAULT_DIR=str(tmp_path / "faults"))
    (tmp_path / "faults").mkdir()
    first = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "build", str(cfg), "--output", str(out),
                              "--runner", "local"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while not list((tmp_path / "faults").glob("paused-*")):
            assert first.poll() is None and time.time() < deadline
            time.sleep(0.2)
        result = subprocess.run([sys.executable, "-m", "pipeline.cli", "build", str(cfg), "--output", str(out),
                                 "--runner", "local"], env=env_with(CNSBENCH_LEASE_TIMEOUT="4"),
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 2, result.stderr
        assert "is being written by cnsbench build on" in result.stderr and f"pid {first.pid}" in result.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    time.sleep(4.5)  # the dead writer's lease expires
    os.environ["CNSBENCH_LEASE_TIMEOUT"] = "4"
    try:
        assert main(["build", str(cfg), "--output", str(out), "--runner", "local"]) == 0
    finally:
        del os.environ["CNSBENCH_LEASE_TIMEOUT"]
    assert len(list((out / "manifest").glob("*.json"))) >= 1
    assert not (out / L.LEASE).exists()
