"""One writer per output: a lease object next to the outputs, with a heartbeat.

``build`` and ``evaluate`` (and through them the reclassify stage) write an output only
while they hold its lease: ``lease.json`` at the output's root, written atomically (a
rename locally, a single PUT on object storage) with the holder's host, pid, command,
start time, a random token, and a heartbeat a thread refreshes every
``heartbeat_s`` seconds.  A second writer finds a fresh lease and is refused with a
message naming the holder (:class:`LeaseHeld`, exit code 2).  A lease whose heartbeat is
older than the timeout (``CNSBENCH_LEASE_TIMEOUT``, default 120 s) belongs to a writer that
died (SIGKILL, a lost node): it is taken over with a warning, and the new writer's resume
redoes whatever the dead one left uncommitted.

After writing its lease a writer reads it back: when two writers start at the same
moment, the one whose token is not there lost and backs off.  ``cnsbench status`` shows
the lease (:func:`describe`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any, Callable

from pipeline.io.store import OutputStore

log = logging.getLogger(__name__)
LEASE = "lease.json"


class LeaseHeld(ValueError):
    """Another writer holds the output's lease."""


def timeout_s() -> float:
    return float(os.environ.get("CNSBENCH_LEASE_TIMEOUT", "120"))


def read(store: OutputStore) -> dict[str, Any] | None:
    """The lease as stored, or None (no lease, or one that cannot be read: treated as absent)."""
    try:
        if not store.exists(LEASE):
            return None
        data = json.loads(store.read_text(LEASE))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("heartbeat"), (int, float)) else None


def _holder(lease: dict[str, Any]) -> str:
    return (f"{lease.get('command', 'a writer')} on {lease.get('host', '?')} (pid {lease.get('pid', '?')}, "
            f"started {lease.get('started_at', '?')})")


def describe(store: OutputStore, now: float | None = None) -> str:
    """One line for ``cnsbench status``."""
    lease = read(store)
    if lease is None:
        return "none (no writer)"
    age = (now or time.time()) - lease["heartbeat"]
    state = "held" if age < timeout_s() else "stale (its writer died; the next build takes it over)"
    return f"{state} by {_holder(lease)}, heartbeat {age:.0f} s ago"


class OutputLease:
    """Acquire with :meth:`acquire`, keep with the heartbeat thread, give back with :meth:`release`."""

    def __init__(self, store: OutputStore, command: str, echo: Callable[[str], None] = print,
                 heartbeat_s: float | None = None) -> None:
        self.store = store
        self.command = command
        self.echo = echo
        self.timeout = timeout_s()
        self.heartbeat_s = heartbeat_s or max(0.5, min(15.0, self.timeout / 4))
        self.token = uuid.uuid4().hex
        self.record = {
            "command": command,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "token": self.token,
        }
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False

    def _write(self) -> None:
        self.store.write_text(LEASE, json.dumps({**self.record, "heartbeat": time.time()}, indent=1))

    def acquire(self) -> "OutputLease":
        current = read(self.store)
        if current is not None and current.get("token") != self.token:
            age = time.time() - current["heartbeat"]
            if age < self.timeout:
                raise LeaseHeld(
                    f"{self.store.uri} is being written by {_holder(current)} (heartbeat {age:.0f} s ago); "
                    f"wait for it to finish, or stop it: its lease expires {self.timeout:.0f} s after its last heartbeat"
                )
            self.echo(f"[cnsbench] warning: taking over the lease of {_holder(current)}: no heartbeat for "
                      f"{age:.0f} s (its writer died); what it left uncommitted is redone")
        self._write()
        time.sleep(min(0.2, self.heartbeat_s / 4))
        back = read(self.store)
        if back is None or back.get("token") != self.token:
            raise LeaseHeld(f"{self.store.uri}: another writer took the lease at the same moment: "
                            f"{_holder(back) if back else 'unknown'}")
        self._thread = threading.Thread(target=self._beat, name="cnsbench-lease", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                current = read(self.store)
                if current is not None and current.get("token") != self.token:
                    self.lost = True
                    log.error("the lease of %s was taken over by %s", self.store.uri, _holder(current))
                    return
                self._write()
            except Exception as err:  # a missed heartbeat is retried at the next beat
                log.warning("lease heartbeat of %s failed: %s", self.store.uri, err)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            current = read(self.store)
            if current is not None and current.get("token") == self.token:
                self.store.remove(LEASE)
        except OSError as err:
            log.warning("could not remove the lease of %s: %s", self.store.uri, err)

    def __enter__(self) -> "OutputLease":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def leased(command: str) -> Callable:
    """Decorator for a writer ``fn(cfg, ..., output, ..., echo=...)``: holds ``output``'s lease while it runs."""

    def wrap(fn: Callable) -> Callable:
        import inspect

        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def inner(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            echo = bound.arguments.get("echo", print)
            with OutputLease(OutputStore(bound.arguments["output"]), command, echo=echo):
                return fn(*args, **kwargs)

        return inner

    return wrap
