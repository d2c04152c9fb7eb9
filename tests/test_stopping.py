"""Ctrl-C / SIGTERM stop a build quickly, keep what was committed, and say how to resume."""

from __future__ import annotations

import signal
import time

import pytest
from buildproc import ForkedBuild, build_here, env_with, tiny_config

from pipeline.runtime.stopping import EXIT_INTERRUPTED, interrupted, stop_on_signals


def test_the_message_names_what_is_kept_and_the_resume_command():
    msg = interrupted("build", ["build", "cfg with space.yaml", "--output", "out"])
    assert "committed shards are kept" in msg
    assert msg.splitlines()[-1].strip() == "cnsbench build 'cfg with space.yaml' --output out"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_either_signal_unwinds_as_an_interrupt_and_handlers_are_restored(sig):
    before = signal.getsignal(sig)
    with pytest.raises(KeyboardInterrupt, match=sig.name):
        with stop_on_signals():
            signal.raise_signal(sig)
            time.sleep(5)  # not reached: the handler raises at once
    assert signal.getsignal(sig) is before


@pytest.mark.slow
def test_sigterm_stops_the_build_and_the_next_run_resumes(tmp_path, capsys):
    sig = signal.SIGTERM
    cfg = tiny_config(tmp_path, lambda raw: raw["output"].update(trajectories_per_shard=1))
    out = tmp_path / "out"
    # The build is a process of its own (forked from this one: see ForkedBuild) that gets the signal.
    logs = tmp_path / "stdout.log", tmp_path / "stderr.log"
    proc = ForkedBuild(["build", cfg, "--output", out, "--runner", "local"], logs[0], env=env_with(), err_log=logs[1])
    deadline = time.time() + 300
    while not list((out / "manifest").glob("*.json")) if (out / "manifest").is_dir() else True:
        assert proc.poll() is None, [p.read_text() for p in logs]
        assert time.time() < deadline, "no shard committed in time"
        time.sleep(0.1)
    proc.send_signal(sig)
    sent = time.time()
    proc.wait(timeout=60)
    assert time.time() - sent < 20, "the build took too long to stop"
    stdout, stderr = (p.read_text() for p in logs)
    assert proc.returncode == EXIT_INTERRUPTED, (stdout, stderr)
    assert "stopped; committed shards are kept" in stderr and "Run the same command again" in stderr
    kept = {p.name for p in (out / "manifest").glob("*.json")}
    assert kept, "the committed shard was lost"
    # The next run (in this process: the resume is the same code whoever runs it).
    capsys.readouterr()
    assert build_here(cfg, out) == 0
    text = capsys.readouterr().out
    assert kept <= {p.name for p in (out / "manifest").glob("*.json")}
    assert "already done" in text and " 0 already done" not in text
