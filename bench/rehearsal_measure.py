"""What a rehearsal measures from outside the build: actor processes, their peak RSS and CPU
time, and the parameters of the model files a stage loads.

The build runs unchanged (``cnsbench build`` in a subprocess); :class:`ActorWatch` samples
the build's process tree, recognises each Ray actor by the stage class in its process
title (``ray::MapWorker(MapBatches(GenerateStage))``) and keeps, per actor, the kernel's
peak resident set (``VmHWM``), its CPU seconds and when it was last busy.
"""

from __future__ import annotations

import json
import re
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

STAGE_CLASS = re.compile(r"\b(\w+Stage)\b")


@dataclass
class Actor:
    pid: int
    stage: str
    peak_rss: int = 0
    cpu_seconds: float = 0.0
    first_busy: float | None = None
    last_busy: float | None = None


@dataclass
class ActorWatch:
    """Samples the descendants of ``root_pid`` every ``interval`` seconds until stopped."""

    root_pid: int
    interval: float = 0.5
    actors: dict[int, Actor] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "ActorWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        try:
            procs = psutil.Process(self.root_pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        now = time.monotonic()
        for proc in procs:
            try:
                title = " ".join(proc.cmdline())
                match = STAGE_CLASS.search(title)
                if not match:
                    continue
                actor = self.actors.setdefault(proc.pid, Actor(proc.pid, match.group(1)))
                actor.peak_rss = max(actor.peak_rss, _vm_hwm(proc.pid) or proc.memory_info().rss)
                times = proc.cpu_times()
                cpu = times.user + times.system
                if cpu > actor.cpu_seconds + 0.2:  # busy since the last sample
                    actor.first_busy = actor.first_busy or now
                    actor.last_busy = now
                actor.cpu_seconds = max(actor.cpu_seconds, cpu)
            except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
                continue

    def by_stage(self) -> dict[str, list[Actor]]:
        out: dict[str, list[Actor]] = {}
        for actor in self.actors.values():
            out.setdefault(actor.stage, []).append(actor)
        return out


def _vm_hwm(pid: int) -> int:
    """The process's peak resident set in bytes (0 when unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def safetensors_params(path: str | Path, prefix: str = "") -> int:
    """Elements of the tensors named ``prefix...`` in a safetensors file, read from its header only."""
    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
    total = 0
    for name, entry in header.items():
        if name == "__metadata__" or not name.startswith(prefix):
            continue
        n = 1
        for d in entry["shape"]:
            n *= d
        total += n
    return total
