"""One writer per output: a lease object next to the outputs, with a heartbeat.

``build``, ``evaluate`` (and the reclassification a build runs) hold the lease of their
output for as long as they write: ``lease.json`` at the output's root, written
atomically (a rename locally, one PUT on object stores), holding the holder's host, pid,
command, start time and a heartbeat refreshed every ``timeout / 4`` seconds by a
background thread.

A second writer is refused (:class:`LeaseHeld`, exit 2) with a message naming the
holder.  A writer on this host holds the lease for as long as its process runs (same pid,
same process start time), whatever the timeout; it is *stale* at once when that process
is gone.  A writer on another host is stale when its heartbeat is older than the timeout
(``CNSBENCH_LEASE_TIMEOUT_S``, default 120 s).  A lease file that cannot be read as a
lease, or whose heartbeat is not a finite time or lies in the future beyond a small clock
skew, is invalid and stale (:mod:`pipeline.io.lease_file`).  A stale lease is taken over
with a warning naming why.  Two writers starting in the same instant are separated by
writing, waiting a moment and reading back: the one whose token is not the one read back
gives way.  ``cnsbench status`` shows the lease.

A writer that finds its lease taken over stops: every commit (a shard's manifest, in
whichever process writes it, the config, the report) is preceded by
:func:`check_holder`, which raises :class:`LeaseLost`; the command then exits 1 saying
so, and the other writer's lease is left in place.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import platform
import threading
import time
import uuid
from typing import Any, Callable, Iterator

from pipeline.errors import CnsbenchError
from pipeline.io.lease_file import (
    LEASE,
    LeaseInfo,
    process_start,
    parse_lease,
    unreadable,
)
from pipeline.io.ownership import claim_output
from pipeline.io.safejson import dumps as strict_dumps

__all__ = ["LEASE", "Lease", "LeaseHeld", "LeaseInfo", "LeaseLost", "acquire", "check_holder", "hold_lease",
           "lease_status", "read_lease", "timeout_s"]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 120.0
SETTLE_S = 0.3  # wait between writing a lease and reading it back


class LeaseHeld(CnsbenchError):
    """Another live writer holds the output's lease; the message names it."""


class LeaseLost(RuntimeError):
    """This writer's lease was taken over: it stops without committing anything more."""


def timeout_s() -> float:
    try:
        value = float(os.environ.get("CNSBENCH_LEASE_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return max(1.0, value) if math.isfinite(value) else DEFAULT_TIMEOUT_S


def read_lease(store: Any) -> LeaseInfo | None:
    """The current lease of ``store``: None when absent; one that cannot be read as a lease
    comes back as an *unreadable* :class:`LeaseInfo` (stale, its message saying why)."""
    try:
        if not store.exists(LEASE):
            return None
        return parse_lease(store.read_bytes(LEASE), store.url(LEASE))
    except FileNotFoundError:
        return None
    except ValueError as err:
        log.warning("unreadable lease: %s", err)
        return unreadable(str(err))


def lease_status(store: Any) -> str:
    """One line for ``cnsbench status``."""
    info = read_lease(store)
    if info is None:
        return "none (no writer)"
    reason = info.stale_reason(timeout_s())
    state = f"STALE ({reason}), the next writer takes it over" if reason else "held"
    return f"{state}: {info.describe()}"


def check_holder(store: Any, token: str) -> None:
    """Raise :class:`LeaseLost` unless the lease of ``store`` still holds ``token``.

    Every commit of a writer (a shard's manifest, the config, the report) is preceded by
    this check, in whatever process the commit happens.
    """
    current = read_lease(store)
    if current is None or current.token != token:
        time.sleep(SETTLE_S)  # ride out a read racing a rewrite of the file
        current = read_lease(store)
    if current is not None and current.token == token:
        return
    who = "nobody (the lease file was removed)" if current is None else current.describe()
    raise LeaseLost(
        f"the lease of {store.uri} was taken over by {who}; this writer stopped without committing anything more. "
        f"See `cnsbench status {store.uri}`; run the command again once the other writer is done."
    )


class Lease:
    """A held lease: :meth:`release` (or leaving :func:`hold_lease`) gives it back."""

    def __init__(self, store: Any, info: LeaseInfo, interval: float) -> None:
        self.store, self.info, self.interval = store, info, interval
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="cnsbench-lease", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        self.store.write_text(LEASE, strict_dumps(self.info.to_json(), indent=1))

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                check_holder(self.store, self.info.token)
                self.info.heartbeat = time.time()
                self._write()
            except LeaseLost as err:
                self.lost = str(err)
                log.error(self.lost)
                return
            except Exception as err:  # noqa: BLE001 - a missed heartbeat is retried next time
                log.warning("lease heartbeat of %s failed: %s", self.store.uri, err)

    def ensure_held(self) -> None:
        """Raise :class:`LeaseLost` unless this writer still holds the lease (before each commit)."""
        if self.lost:
            raise LeaseLost(self.lost)
        check_holder(self.store, self.info.token)

    @contextlib.contextmanager
    def guarding(self) -> Iterator[None]:
        """Run work whose failure may come from a lost lease (a worker refusing to commit,
        its error wrapped by the runner): such a failure is raised as :class:`LeaseLost`."""
        try:
            yield
        except LeaseLost:
            raise
        except Exception:
            self.ensure_held()
            raise

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
        reason = current.stale_reason(timeout)
        if reason is None:
            raise LeaseHeld(
                f"{store.uri} is being written by {current.describe()}; one writer per output. "
                f"Wait for it to finish; a writer on this host holds it for as long as its process runs, one on "
                f"another host until {timeout:.0f} s after its last heartbeat."
            )
        msg = f"[cnsbench] warning: taking over the stale lease of {store.uri} ({reason}) from {current.describe()}"
        (echo or log.warning)(msg)
    now = time.time()
    info = LeaseInfo(platform.node(), os.getpid(), command, now, now, uuid.uuid4().hex, process_start(os.getpid()))
    store.write_text(LEASE, strict_dumps(info.to_json(), indent=1))
    time.sleep(SETTLE_S)
    back = None
    for _ in range(3):  # an object store may answer the read-back with a stale or cut response
        if not getattr(store, "local", True):
            store.fs.invalidate_cache()
        back = read_lease(store)
        if back is not None and not back.unreadable:
            break
        time.sleep(SETTLE_S)
    if back is None or back.token != info.token:
        holder = back.describe() if back and not back.unreadable else "another writer"
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
