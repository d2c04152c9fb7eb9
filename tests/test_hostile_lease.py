"""One writer per output: a second build is refused naming the holder; a dead holder's lease is taken over."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from hostile import start_holder, synthetic_output, tiny_cfg_path

from pipeline.cli import main
from pipeline.io.lease import LeaseHeld, acquire, hold_lease, read_lease
from pipeline.io.store import OutputStore


def test_second_writer_is_refused_then_takes_over_a_dead_holder(tmp_path, capsys):
    cfg = tiny_cfg_path(tmp_path)
    out = tmp_path / "out"
    synthetic_output(out, cfg)
    holder = start_holder(out)
    try:
        assert main(["build", str(cfg), "--output", str(out), "--runner", "local"]) == 2
        err = capsys.readouterr().err
        assert f"pid {holder.pid}" in err and "being written by" in err
        assert main(["status", str(out)]) == 0
        assert "held: cnsbench build on host" in capsys.readouterr().out
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the holder died without releasing: same host, dead pid -> stale, taken over with a warning
    assert "STALE" in (main(["status", str(out)]) == 0 and capsys.readouterr().out)
    assert main(["build", str(cfg), "--output", str(out), "--runner", "local"]) == 0
    text = capsys.readouterr().out
    assert "taking over the stale lease" in text and f"pid {holder.pid}" in text
    assert read_lease(OutputStore(str(out))) is None  # released at the end


def test_expired_heartbeat_from_another_host_is_taken_over(tmp_path, monkeypatch):
    out = tmp_path / "out"
    store = OutputStore(str(out))
    now = time.time()
    lease = {"host": "elsewhere", "pid": 1, "command": "build", "started": now - 500, "heartbeat": now - 5, "token": "t"}
    out.mkdir()
    (out / "lease.json").write_text(json.dumps(lease))
    monkeypatch.setenv("CNSBENCH_LEASE_TIMEOUT_S", "60")
    with pytest.raises(LeaseHeld, match="host elsewhere, pid 1"):
        acquire(store, "build")
    monkeypatch.setenv("CNSBENCH_LEASE_TIMEOUT_S", "2")
    msgs: list[str] = []
    held = acquire(store, "build", msgs.append)
    try:
        assert "stale lease" in msgs[0] and read_lease(store).token == held.info.token
    finally:
        held.release()


def test_heartbeat_refreshes_and_release_removes(tmp_path, monkeypatch):
    monkeypatch.setenv("CNSBENCH_LEASE_TIMEOUT_S", "2")
    out = tmp_path / "out"
    with hold_lease(str(out), "evaluate") as lease:
        first = read_lease(lease.store).heartbeat
        time.sleep(1.5)
        assert read_lease(lease.store).heartbeat > first
    assert not (out / "lease.json").exists()


def test_no_lease_is_written_into_a_foreign_directory(tmp_path):
    d = tmp_path / "theirs"
    d.mkdir()
    (d / "data.csv").write_text("1,2")
    with pytest.raises(ValueError, match="not a cnsbench output"):
        with hold_lease(str(d), "build"):
            pass
    assert sorted(os.listdir(d)) == ["data.csv"]


@pytest.mark.slow
def test_second_cli_build_exits_2_while_the_first_runs(tmp_path):
    """Two real `cnsbench build` processes on one output: the second exits 2 naming the first."""
    from buildproc import ForkedBuild, env_with

    cfg = tiny_cfg_path(tmp_path)
    out = tmp_path / "out"
    argv = ["build", cfg, "--output", out, "--runner", "local"]
    # Each build a process of its own, forked from this one (ForkedBuild: no new interpreter).
    first = ForkedBuild(argv, tmp_path / "first.log", env=env_with())
    try:
        deadline = time.time() + 120
        while not (out / "lease.json").exists():
            assert first.poll() is None and time.time() < deadline
            time.sleep(0.2)
        second = ForkedBuild(argv, tmp_path / "second.log", env=env_with(), err_log=tmp_path / "second.err")
        second.wait(timeout=120)
        err = (tmp_path / "second.err").read_text()
        assert second.returncode == 2, err
        assert f"pid {first.pid}" in err and "Traceback" not in err
        assert first.poll() is None  # the first goes on
    finally:
        first.kill()
        first.wait()


def test_a_reused_pid_does_not_keep_a_dead_holders_lease(tmp_path):
    """Same host, same pid number, another process (pid reuse, another PID namespace): stale."""
    import platform

    from pipeline.io.lease import LeaseInfo, process_start

    now = time.time()
    mine = process_start(os.getpid())
    alive = LeaseInfo(platform.node(), os.getpid(), "build", now, now, "t", mine)
    assert not alive.is_stale(60, now)
    if mine:  # /proc is there: a different start time is a different process
        assert LeaseInfo(platform.node(), os.getpid(), "build", now, now, "t", "1").is_stale(60, now)
