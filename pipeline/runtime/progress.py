"""Progress of long commands: one live line on a terminal, plain periodic lines otherwise.

Role: what ``build``, ``evaluate``, ``train-sliders`` and ``compare`` tell the user while
they run.  A :class:`Progress` counts items done of items planned (trajectories,
sliders, steps), images, and failures, and renders

    [cnsbench] build: 24/60 trajectories (40%), 3.1 images/s, ETA 0:01:52, 1 failed

On a terminal the line is redrawn in place (at most every 0.2 s); messages that must
stay (a failure, a trained slider's loss) go through :meth:`Progress.log`, printed above
the line.  When output is not a terminal (CI logs, a file, a test's ``echo``) a plain
line is written at most every ``interval`` seconds (``CNSBENCH_PROGRESS_INTERVAL``,
default 10) and once at the end, so logs stay short at any benchmark size.

Verbosity: Ray Data's own per-operator progress bars and its execution logs, the tqdm
bars of model libraries, Ray's notices about a new local cluster (token authentication,
Ray Data's reservation warning: :func:`quiet_local_ray`) and the error-level line Ray's core worker writes for every actor
pool (:data:`NATIVE_NOISE`, :func:`native_stderr_filtered`) are noise next to this line;
they stay quiet unless ``cnsbench -v`` (:func:`set_verbose`).  This is the one place that
decides what third-party output a command shows.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import time
from typing import Callable, Iterator, TextIO

PREFIX = "[cnsbench]"
_VERBOSE = False


def set_verbose(value: bool) -> None:
    """``cnsbench -v``: let Ray Data show its own progress bars and logs."""
    global _VERBOSE
    _VERBOSE = bool(value)
    if not _VERBOSE:
        # Model libraries' own tqdm bars (weights loading, pipeline components, transformers'
        # "Writing model shards") would break the one progress line; Ray workers started from
        # here inherit the settings.
        os.environ.setdefault("TQDM_DISABLE", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def verbose() -> bool:
    return _VERBOSE


def quiet_unless_verbose() -> None:
    """What a verb of the Python API does first: without ``set_verbose(True)`` (``-v``) no model
    library shows a bar of its own, also when a notebook imported transformers before."""
    import sys

    set_verbose(_VERBOSE)
    if not _VERBOSE and "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()


def quiet_model_libraries() -> None:
    """Before models load in this process: diffusers' own bars ("Loading pipeline components")
    off unless verbose.  Its switch is a module flag, not the environment, and tqdm reads
    ``TQDM_DISABLE`` only when first imported (in the CLI, before :func:`set_verbose`)."""
    if not _VERBOSE:
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.disable_progress_bar()


def quiet_ray_data() -> None:
    """Turn Ray Data's progress bars and INFO logs off (on with :func:`set_verbose`)."""
    import logging

    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "0" if _VERBOSE else "1")
    try:
        import ray.data  # configures Ray Data's loggers on first import: quieten them after

        if not _VERBOSE:
            logging.getLogger("ray.data").setLevel(logging.WARNING)
            # Its only message is "Progress bars disabled. To enable, ...": that is the point.
            logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)
        _hide_unless_verbose(RAY_DATA_TASK_ERRORS)
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = _VERBOSE
        if hasattr(ctx, "enable_operator_progress_bars"):
            ctx.enable_operator_progress_bars = _VERBOSE
        if hasattr(ctx, "print_on_execution_start"):
            ctx.print_on_execution_start = _VERBOSE
    except ImportError:  # pragma: no cover - Ray is a dependency; tolerate its absence here
        pass


class _DropMessages(logging.Filter):
    """A logger filter that drops the records whose message contains one of ``fragments``."""

    def __init__(self, *fragments: str) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(f in record.getMessage() for f in self.fragments)


# What Ray's Python loggers say about every new local cluster that init_ray starts, shown
# only with -v: (logger, message start).  Token authentication is on for such a cluster (the
# protection stays; Ray's other authentication messages still show).  The cluster is sized
# for one actor of every pool, so Ray Data's starvation warning there comes from its
# reservation policy (a share of the CPUs per operator), not from a pool that cannot start.
LOCAL_RAY_NOTICES = (
    ("ray._private.authentication.authentication_token_setup", "Token authentication is enabled for this Ray cluster"),
    ("ray.data._internal.execution.resource_manager", "Cluster resources are not enough to run any task from"),
)


# What Ray Data logs, with the driver-side traceback, when a stage raised: the executor re-raises
# a user's error (a full disk) as the stage raised it, one line as on the local runner, and any
# other with the actor's traceback (pipeline/executors/ray_data.py), so these show only with -v.
RAY_DATA_TASK_ERRORS = (
    ("ray.data._internal.execution.streaming_executor_state", "An exception was raised from a task of operator"),
    ("ray.data.exceptions", "Exception occurred in "),
    ("ray.data.exceptions", "Full stack trace"),
)


def _hide_unless_verbose(notices) -> None:
    """Without ``-v``, the ``(logger, message start)`` records of ``notices`` are not shown."""
    fragments: dict[str, list[str]] = {}
    for name, notice in notices:
        fragments.setdefault(name, []).append(notice)
    for name, each in fragments.items():
        logger = logging.getLogger(name)
        for f in [f for f in logger.filters if isinstance(f, _DropMessages)]:
            logger.removeFilter(f)
        if not _VERBOSE:
            logger.addFilter(_DropMessages(*each))


def quiet_local_ray() -> None:
    """Before a new local ``ray.init()``: without ``-v``, the :data:`LOCAL_RAY_NOTICES` are not shown."""
    _hide_unless_verbose(LOCAL_RAY_NOTICES)


# Lines that native code writes straight to this process's stderr (no logger to quieten),
# hidden unless verbose.  Ray Data hands every actor pool its constructor arguments (its map
# transformer and data context) through the object store, and the pools restart crashed
# actors (max_restarts > 0): Ray's core worker logs this at error level once per pool, for
# every build.  Those objects live as long as the dataset, so the restarts it warns about work.
NATIVE_NOISE = (re.compile(rb"has constructor arguments in the object store and max_restarts > 0"),)


@contextlib.contextmanager
def native_stderr_filtered() -> Iterator[None]:
    """Within the block, lines written to file descriptor 2 that match :data:`NATIVE_NOISE`
    are dropped (unless verbose); every other line passes through unchanged, in order."""
    if _VERBOSE:
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable stderr: nothing to filter
        yield
        return
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    thread = threading.Thread(target=_forward_lines, args=(read_fd, saved), name="stderr-filter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(saved, 2)  # this process's write end of the pipe closes; the reader drains it
        thread.join(timeout=2.0)
        if not thread.is_alive():
            os.close(saved)


def _forward_lines(read_fd: int, out_fd: int) -> None:
    def write(data: bytes) -> None:
        try:
            while data:
                data = data[os.write(out_fd, data):]
        except OSError:  # stderr went away: keep draining the pipe so writers never block
            pass

    pending = b""
    try:
        while chunk := os.read(read_fd, 65536):
            *lines, pending = (pending + chunk).split(b"\n")
            kept = [line + b"\n" for line in lines if not any(p.search(line) for p in NATIVE_NOISE)]
            if kept:
                write(b"".join(kept))
        if pending and not any(p.search(pending) for p in NATIVE_NOISE):
            write(pending)
    finally:
        os.close(read_fd)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """Done/planned, rate, ETA and failures of one command; see the module docstring.

    ``echo``: where plain lines go (default: print to ``stream``).  The live line is used
    only when ``echo`` is the default and ``stream`` is a terminal.
    """

    def __init__(
        self,
        what: str,
        total: int,
        *,
        unit: str = "trajectories",
        done: int = 0,
        echo: Callable[[str], None] | None = None,
        stream: TextIO | None = None,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        rate: bool = False,
        failures: bool = True,
        first_after: float = 0.0,
    ) -> None:
        """``rate``: show ``<unit>/s`` (when no images are counted); ``failures``: show the
        failed count; ``first_after``: no line before that many seconds (a short task prints
        nothing until :meth:`close`)."""
        self.what, self.total, self.unit = what, int(total), unit
        self.rate, self.failures = rate, failures
        self.done_before = int(done)
        self.done = self.images = self.failed = 0
        self.stream = stream if stream is not None else sys.stdout
        self.live = echo is None and bool(getattr(self.stream, "isatty", lambda: False)())
        self.echo = echo or (lambda line: print(line, file=self.stream, flush=True))
        if interval is None:
            interval = float(os.environ.get("CNSBENCH_PROGRESS_INTERVAL", "10"))
        self.interval = interval
        self.clock = clock
        self.start = clock()
        self._last = -float("inf")
        self._quiet_until = self.start + first_after
        self._drawn = False
        self.closed = False

    # ------------------------------------------------------------------ counting
    def update(self, done: int = 0, images: int = 0, failed: int = 0) -> None:
        """Add ``done`` items finished (failed ones included in ``failed`` only), images and failures."""
        self.done += int(done)
        self.images += int(images)
        self.failed += int(failed)
        self._maybe_render()

    def advance(self, n: int = 1) -> None:
        self.update(done=n)

    # ------------------------------------------------------------------ text
    def line(self) -> str:
        elapsed = max(self.clock() - self.start, 1e-9)
        reached = self.done_before + self.done + self.failed
        parts = [f"{PREFIX} {self.what}: {reached}/{self.total} {self.unit}"]
        if self.total:
            parts[0] += f" ({100.0 * reached / self.total:.0f}%)"
        progressed = self.done + self.failed
        if self.images:
            parts.append(f"{self.images / elapsed:.1f} images/s")
        elif self.rate and progressed:
            parts.append(f"{progressed / elapsed:.2f} {self.unit}/s")
        remaining = self.total - reached
        if progressed and remaining > 0 and not self.closed:
            parts.append(f"ETA {_duration(remaining * elapsed / progressed)}")
        elif self.closed:
            parts.append(f"{_duration(elapsed)} elapsed")
        if self.failures:
            parts.append(f"{self.failed} failed")
        return ", ".join(parts)

    def log(self, message: str) -> None:
        """A message that stays (above the live line on a terminal)."""
        if self.live:
            self.stream.write("\r\x1b[K" + message + "\n")
            self._drawn = False
            self._render(force=True)
        else:
            self.echo(message)

    def _maybe_render(self) -> None:
        self._render(force=False)

    def _render(self, force: bool) -> None:
        now = self.clock()
        if not force and now < self._quiet_until:
            return
        if self.live:
            if force or now - self._last >= 0.2:
                self.stream.write("\r\x1b[K" + self.line())
                self.stream.flush()
                self._drawn, self._last = True, now
        elif now - self._last >= self.interval:
            self.echo(self.line())
            self._last = now

    def close(self) -> None:
        """The final line (always written, also when nothing was done)."""
        if self.closed:
            return
        self.closed = True
        if self.live:
            self.stream.write("\r\x1b[K" + self.line() + "\n")
            self.stream.flush()
        else:
            self.echo(self.line())
