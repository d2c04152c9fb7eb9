"""Stopping a long command on Ctrl-C or SIGTERM: committed work is kept, the user is told how to resume.

Everything a build, evaluate or train-sliders run has committed is on disk (a shard is
committed when its manifest is written, a slider when its metadata JSON is), so stopping
is only a matter of unwinding quickly: SIGTERM (a scheduler, ``kill``, a Kubernetes pod
stop) is turned into the same ``KeyboardInterrupt`` as Ctrl-C, the command's ``finally``
blocks and Ray's exit handlers run, and :func:`interrupted` prints the resume command.
A second signal while unwinding exits at once.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise ``KeyboardInterrupt`` once; a second one exits."""
    if not _main_thread():
        yield
        return
    received: list[int] = []

    def handler(signum, frame):  # noqa: ARG001 - the signal module's signature
        if received:
            os._exit(EXIT_INTERRUPTED)  # the user insists: no more unwinding
        received.append(signum)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def interrupted(command: str, argv: Sequence[str] | None) -> str:
    """The message after a stop: what is kept and the command that resumes."""
    again = shlex.join(["cnsbench", *(argv if argv is not None else sys.argv[1:])])
    kept = {
        "build": "committed shards are kept",
        "evaluate": "committed shards are kept",
        "train-sliders": "trained sliders are kept",
        "demo": "committed shards are kept",
    }.get(command, "nothing committed is lost")
    return f"cnsbench {command}: stopped; {kept}. Run the same command again to resume:\n  {again}"


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
