"""One writer per output: a lease object next to the outputs, with a heartbeat.

``build``, ``evaluate`` (and the reclassification a build runs) hold the lease of their
output for as long as they write: ``lease.json`` at the output's root, written
atomically (a rename locally, one PUT on object stores), holding the holder's host, pid,
command, start time and a heartbeat refreshed every ``timeout / 4`` seconds by a
background thread.

A second writer is refused (:class:`LeaseHeld`, exit 2) with a message naming the
holder.  A lease is *stale*, and is taken over with a warning, when its heartbeat is
older than the timeout (``CNSBENCH_LEASE_TIMEOUT_S``, default 120 s), or at once when
its holder ran on this host and that process no longer exists.  Two writers starting
in the same instant are separated by writing, waiting a moment and reading back: the
one whose token is not the one read back gives way.  ``cnsbench status`` shows the lease.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

from pipeline.io.ownership import LEASE, claim_output
from pipeline.io.safejson import loads

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 120.0
SETTLE_S = 0.3  # wait between writing a lease and reading it back


class LeaseHeld(ValueError):
    """Another live writer holds the output's lease; the message names it."""


def timeout_s() -> float:
    try:
        return max(1.0, float(os.environ.get("CNSBENCH_LEASE_TIMEOUT_S", DEFAULT_TIMEOUT_S)))
    except ValueError:
        return DEFAULT_TIMEOUT_S


@dataclass
class LeaseInfo:
    host: str
    pid: int
    command: str
    started: float
    heartbeat: float
    token: str
    proc_start: str = ""  # start time of the holder process (/proc/<pid>/stat), to tell a reused pid


    def age(self, now: float | None = None) -> float:
        return (now or time.time()) - self.heartbeat

    def describe(self, now: float | None = None) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        return (
            f"cnsbench {self.command} on host {self.host}, pid {self.pid}, since {started} "
            f"(last heartbeat {self.age(now):.0f} s ago)"
        )

    def is_stale(self, timeout: float, now: float | None = None) -> bool:
        # On this host: a holder whose process is gone, or whose pid now names another
        # process (started at another time: pids are reused, across PID namespaces too), is dead.
        if self.host == platform.node() and not _same_process_alive(self.pid, self.proc_start):
            return True
        return self.age(now) > timeout


def _proc_start(pid: int) -> str:
    """The start time (clock ticks since boot) of process ``pid``, '' where /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
        return stat[stat.rindex(")") + 2 :].split()[19]
    except (OSError, ValueError, IndexError):
        return ""


def _same_process_alive(pid: int, proc_start: str) -> bool:
    """Whether the holder still runs: its pid is alive and (where known) started when it did.

    The start time tells a reused pid, or the same pid number in another PID namespace
    (containers, ``unshare``), from the holder itself.
    """
    if not _pid_alive(pid):
        return False
    return not proc_start or _proc_start(pid) == proc_start


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def read_lease(store: Any) -> LeaseInfo | None:
    """The current lease of ``store`` (None when absent; an unreadable one counts as absent)."""
    try:
        if not store.exists(LEASE):
            return None
        data = loads(store.read_bytes(LEASE), store.url(LEASE))
        return LeaseInfo(
            host=str(data["host"]),
            pid=int(data["pid"]),
            command=str(data["command"]),
            started=float(data["started"]),
            heartbeat=float(data["heartbeat"]),
            token=str(data["token"]),
            proc_start=str(data.get("proc_start", "")),
        )
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as err:
        log.warning("unreadable lease %s (%s): treating it as absent", store.url(LEASE), err)
        return None


def lease_status(store: Any) -> str:
    """One line for ``cnsbench status``."""
    info = read_lease(store)
    if info is None:
        return "none (no writer)"
    state = "STALE, the next writer takes it over" if info.is_stale(timeout_s()) else "held"
    return f"{state}: {info.describe()}"


class Lease:
    """A held lease: :meth:`release` (or leaving :func:`hold_lease`) gives it back."""

    def __init__(self, store: Any, info: LeaseInfo, interval: float) -> None:
        self.store, self.info, self.interval = store, info, interval
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="cnsbench-lease", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        self.store.write_text(LEASE, json.dumps(asdict(self.info), indent=1))

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                current = read_lease(self.store)
                if current is not None and current.token != self.info.token:
                    self.lost = f"the lease of {self.store.uri} was taken over by {current.describe()}"
                    log.error(self.lost)
                    return
                self.info.heartbeat = time.time()
                self._write()
            except Exception as err:  # noqa: BLE001 - a missed heartbeat is retried next time
                log.warning("lease heartbeat of %s failed: %s", self.store.uri, err)

    def release(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            current = read_lease(self.store)
            if current is not None and current.token == self.info.token:
                self.store.remove(LEASE)
        except Exception as err:  # noqa: BLE001 - an expired lease is harmless
            log.warning("could not release the lease of %s: %s", self.store.uri, err)


def acquire(store: Any, command: str, echo: Callable[[str], None] | None = None) -> Lease:
    """Take the lease of ``store`` (which must be ours: :func:`claim_output` first)."""
    timeout = timeout_s()
    current = read_lease(store)
    if current is not None:
        if not current.is_stale(timeout):
            raise LeaseHeld(
                f"{store.uri} is being written by {current.describe()}; one writer per output. "
                f"Wait for it to finish, or if it died, its lease expires {timeout:.0f} s after its last heartbeat."
            )
        msg = f"[cnsbench] warning: taking over the stale lease of {store.uri} from {current.describe()}"
        (echo or log.warning)(msg)
    now = time.time()
    info = LeaseInfo(platform.node(), os.getpid(), command, now, now, uuid.uuid4().hex, _proc_start(os.getpid()))
    store.write_text(LEASE, json.dumps(asdict(info), indent=1))
    time.sleep(SETTLE_S)
    back = None
    for _ in range(3):  # an object store may answer the read-back with a stale or cut response
        if not getattr(store, "local", True):
            store.fs.invalidate_cache()
        back = read_lease(store)
        if back is not None:
            break
        time.sleep(SETTLE_S)
    if back is None or back.token != info.token:
        holder = back.describe() if back else "another writer"
        raise LeaseHeld(f"{store.uri} is being written by {holder}; one writer per output")
    return Lease(store, info, interval=max(0.5, timeout / 4))


@contextlib.contextmanager
def hold_lease(output: str, command: str, echo: Callable[[str], None] | None = None) -> Iterator[Lease]:
    """Claim ``output`` as ours, hold its lease for the duration, and give it back."""
    from pipeline.io.store import OutputStore

    store = OutputStore(output)
    claim_output(store)
    lease = acquire(store, command, echo)
    try:
        yield lease
    finally:
        lease.release()
