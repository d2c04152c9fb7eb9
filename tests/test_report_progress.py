"""Progress lines (pipeline.runtime.progress): live on a terminal, periodic plain lines otherwise."""

from __future__ import annotations

import io

from pipeline.output_run import ShardTally
from pipeline.runtime.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_are_periodic_and_carry_rate_eta_and_failures():
    clock, lines = Clock(), []
    p = Progress("build", 60, done=10, echo=lines.append, interval=10, clock=clock)
    clock.t += 5
    p.update(done=4, images=24)  # the first update prints at once
    assert lines == ["[cnsbench] build: 14/60 trajectories (23%), 4.8 images/s, ETA 0:00:58, 0 failed"]
    clock.t += 5
    p.update(done=4, images=24, failed=1)  # 5 s later: within the interval, nothing printed
    assert len(lines) == 1
    clock.t += 10
    p.update(done=4, images=24)
    # 12 done + 1 failed in 20 s this run: 37 left at 0.65 per s -> 57 s
    assert lines[-1] == "[cnsbench] build: 23/60 trajectories (38%), 3.6 images/s, ETA 0:00:57, 1 failed"
    p.log("a message")
    assert lines[-1] == "a message"
    p.close()
    assert lines[-1] == "[cnsbench] build: 23/60 trajectories (38%), 3.6 images/s, 0:00:20 elapsed, 1 failed"
    p.close()  # once only
    assert len(lines) == 4


def test_terminal_gets_one_line_redrawn_in_place():
    clock, term = Clock(), Terminal()
    p = Progress("train-sliders", 4, unit="sliders", stream=term, clock=clock)
    assert p.live
    for _ in range(3):
        clock.t += 1
        p.update(done=1)
    p.log("[train-sliders] 3/4 snow/001: final loss 0.1")
    clock.t += 1
    p.update(done=1)
    p.close()
    text = term.getvalue()
    assert text.count("\n") == 2  # the kept message and the final line; progress redrawn with \r
    assert "\r\x1b[K[cnsbench] train-sliders: 3/4 sliders (75%), ETA 0:00:01, 0 failed" in text
    assert text.endswith("\r\x1b[K[cnsbench] train-sliders: 4/4 sliders (100%), 0:00:04 elapsed, 0 failed\n")
    assert "[train-sliders] 3/4 snow/001: final loss 0.1\n" in text


def test_not_a_terminal_never_gets_control_characters():
    p = Progress("compare", 3, unit="steps", stream=io.StringIO(), interval=0)
    assert not p.live
    p.advance()
    p.close()
    assert "\r" not in p.stream.getvalue() and p.stream.getvalue().count("\n") == 2


def test_build_tally_feeds_the_progress_line():
    lines: list[str] = []
    tally = ShardTally(8, 2, lines.append)
    tally.progress.interval = 0
    tally({"shard": "s1", "n_trajectories": 3, "n_samples": 18, "n_failed": 1, "unet_evals": 0.0, "gen_seconds": 0.0})
    assert (tally.traj, tally.images, tally.failed) == (3, 18, 1)
    assert lines[0] == "[cnsbench] shard s1: 1 trajectories failed"
    assert lines[1].startswith("[cnsbench] build: 6/8 trajectories (75%)") and lines[1].endswith("1 failed")
