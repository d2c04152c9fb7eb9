"""The lease document ``lease.json``: its fields, how it is parsed, and when its holder counts as gone.

Everything in it comes from a file someone else may have written, so :func:`parse_lease`
checks every field's type and bounds before anything trusts it, and times are bounded:
a heartbeat that is not a finite number, or lies in the future by more than
:data:`CLOCK_SKEW_S`, makes the lease *invalid* (stale, with the reason in every
message), never a lease that blocks the output forever.

Who is alive: a holder on this host whose process still runs (same pid, same process
start time) holds the lease whatever its heartbeat says; on this host a holder whose
process is gone is stale at once; elsewhere (or where the start time is not known) the
heartbeat decides (:meth:`LeaseInfo.stale_reason`).
"""

from __future__ import annotations

import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import ConfigDict, StrictFloat, StrictInt, StrictStr, ValidationError, field_validator

from pipeline.errors import CnsbenchError
from pipeline.io.safejson import loads
from pipeline.io.strict import Strict, errors_of_type, first_problem

LEASE = "lease.json"
CLOCK_SKEW_S = 30.0  # how far ahead of our clock another host's heartbeat may be
MAX_PID = 2**31 - 1
# The lease's fields and the type each refusal names (float: a finite number).
_FIELDS = {"host": str, "pid": int, "command": str, "started": float, "heartbeat": float, "token": str, "proc_start": str}


@dataclass
class LeaseInfo:
    host: str
    pid: int
    command: str
    started: float
    heartbeat: float
    token: str
    proc_start: str = ""  # start time of the holder process (/proc/<pid>/stat), to tell a reused pid
    unreadable: str = ""  # why the file could not be read as a lease ('' for a readable one)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc.pop("unreadable")
        return doc

    def age(self, now: float | None = None) -> float:
        return (now or time.time()) - self.heartbeat

    def time_problem(self, now: float | None = None) -> str | None:
        """Why the lease's times cannot be trusted, or None."""
        if self.unreadable:
            return f"unreadable lease file: {self.unreadable}"
        if not math.isfinite(self.heartbeat):
            return f"its heartbeat {self.heartbeat!r} is not a finite time"
        ahead = -self.age(now)
        if ahead > CLOCK_SKEW_S:
            return (
                f"its heartbeat is {ahead:.0f} s in the future (more than the {CLOCK_SKEW_S:.0f} s "
                "of clock skew tolerated)"
            )
        return None

    def describe(self, now: float | None = None) -> str:
        if self.unreadable:
            return f"an unreadable lease file ({self.unreadable})"
        try:
            started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        except (OverflowError, OSError, ValueError):
            started = "an unknown time"
        problem = self.time_problem(now)
        beat = f"INVALID: {problem}" if problem else f"last heartbeat {self.age(now):.0f} s ago"
        return f"cnsbench {self.command} on host {self.host}, pid {self.pid}, since {started} ({beat})"

    def alive_here(self) -> bool | None:
        """True: its process runs on this host; False: it ran here and is gone; None: cannot tell."""
        if self.unreadable or self.host != platform.node():
            return None
        if not _pid_alive(self.pid):
            return False
        if not self.proc_start or not process_start(os.getpid()):
            return None  # the start time is not known: the heartbeat decides
        return process_start(self.pid) == self.proc_start

    def stale_reason(self, timeout: float, now: float | None = None) -> str | None:
        """Why the next writer may take the lease over, or None while its holder counts as alive."""
        alive = self.alive_here()
        if alive is True:
            return None  # a live writer on this host is never taken over, whatever the timeout
        if alive is False:
            return "its holder process no longer runs on this host"
        problem = self.time_problem(now)
        if problem:
            return f"invalid: {problem}"
        if self.age(now) > timeout:
            return f"no heartbeat for more than {timeout:.0f} s"
        return None

    def is_stale(self, timeout: float, now: float | None = None) -> bool:
        return self.stale_reason(timeout, now) is not None


def unreadable(reason: str) -> LeaseInfo:
    """The stand-in for a lease file that exists but is not a lease: stale, and says why."""
    return LeaseInfo("?", 0, "?", math.nan, math.nan, "", "", reason[:300])


class LeaseDocument(Strict):
    """The schema of ``lease.json`` (what :func:`parse_lease` accepts).  Keys it does not know
    are ignored, so a newer writer's lease is still read (and its holder still respected)."""

    model_config = ConfigDict(extra="ignore")

    host: StrictStr
    pid: StrictInt
    command: StrictStr
    started: StrictInt | StrictFloat
    heartbeat: StrictInt | StrictFloat
    token: StrictStr
    proc_start: StrictStr = ""

    @field_validator("pid")
    @classmethod
    def _process_id(cls, value: int) -> int:
        if not 0 < value <= MAX_PID:
            raise CnsbenchError(f"lease field 'pid' must be a process id, got {value!r}"[:300])
        return value


def parse_lease(data: bytes | str, where: str) -> LeaseInfo:
    """A checked :class:`LeaseInfo` (:class:`LeaseDocument`); ValueError naming ``where`` and the field otherwise."""
    doc = loads(data, where)
    if not isinstance(doc, dict):
        raise CnsbenchError(f"{where}: a lease is a JSON object, got {type(doc).__name__}")
    try:
        lease = LeaseDocument.model_validate(doc)
    except ValidationError as err:
        missing = errors_of_type(err, "missing")
        if missing:
            raise CnsbenchError(f"{where}: missing lease fields {missing}") from None
        loc, kind, value, message = first_problem(err)
        if kind == "value_error":
            raise CnsbenchError(f"{where}: {message}") from None
        key = str(loc[0])
        what = "a finite number" if _FIELDS.get(key) is float else f"a {_FIELDS.get(key, str).__name__}"
        raise CnsbenchError(f"{where}: lease field {key!r} must be {what}, got {value!r}"[:300]) from None
    return LeaseInfo(lease.host, lease.pid, lease.command, float(lease.started), float(lease.heartbeat), lease.token,
                     lease.proc_start)


def process_start(pid: int) -> str:
    """The start time (clock ticks since boot) of process ``pid``, '' where /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
        return stat[stat.rindex(")") + 2 :].split()[19]
    except (OSError, ValueError, IndexError):
        return ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, OverflowError):
        return True
    return True
