"""Crash bookkeeping and fault injection for the stages.

**Attempts.**  Before a stage processes a batch it records an attempt marker in the
output store (``attempts/<stage>/<key>/<uuid>``).  If a worker dies mid-batch (OOM kill,
segfault, preemption) Ray restarts the actor and retries the batch; the markers survive
the crash, so once a batch has been attempted ``max_retries + 1`` times the stage stops
trying and returns its items as failed (``error`` set, starting with ``[stage]``).  The
build then completes and reports them, and the next build run retries them afresh
(markers are cleared at the start of every run).  The writer cannot commit half a shard:
it stops the run instead (``WriteStage.give_up``), keeping what was committed.

**Fault injection** (tests only).  ``CNSBENCH_FAULT_INJECT`` holds ``;``-separated rules
``stage:point:key:action``; ``key`` matches a unit or trajectory id prefix (``*`` = any);
at ``start`` a rule fires for the items the stage processes, not for failed items it passes on.
Actions: ``crash`` (hard exit of the worker process, as an OOM kill would), ``crash_once``
(crash the first time only; needs ``CNSBENCH_FAULT_DIR``), ``raise`` (a Python error),
``pause`` (write ``$CNSBENCH_FAULT_DIR/paused-<stage>-<point>`` and block, so a test can
kill -9 the whole build at that point), ``hold`` (the same marker, then wait until the
test creates ``$CNSBENCH_FAULT_DIR/release``, so it can act while the build is mid-run).
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid

from pipeline.errors import CnsbenchError

ENV = "CNSBENCH_FAULT_INJECT"
DIR_ENV = "CNSBENCH_FAULT_DIR"


def fault_env() -> dict[str, str]:
    """This process's fault-injection variables, for the Ray workers of a build to inherit."""
    return {k: v for k, v in os.environ.items() if k.startswith("CNSBENCH_FAULT_")}


def _rules() -> list[tuple[str, str, str, str]]:
    spec = os.environ.get(ENV, "").strip()
    rules = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        fields = part.split(":")
        if len(fields) != 4:
            raise CnsbenchError(f"{ENV}: rule {part!r} must be stage:point:key:action")
        rules.append(tuple(fields))
    return rules


def inject(stage: str, point: str, keys: list[str]) -> None:
    """Apply a matching fault-injection rule, if any (no-op unless the env var is set)."""
    if ENV not in os.environ:
        return
    for r_stage, r_point, r_key, action in _rules():
        if r_stage != stage or r_point != point:
            continue
        if r_key != "*" and not any(k.startswith(r_key) for k in keys):
            continue
        fault_dir = os.environ.get(DIR_ENV, "")
        if action == "crash":
            os._exit(137)
        elif action == "crash_once":
            marker = os.path.join(fault_dir, f"crashed-{stage}-{point}-{r_key.replace('/', '_')}")
            if not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(137)
        elif action == "raise":
            raise RuntimeError(f"injected fault at {stage}:{point} for {keys[:3]}")
        elif action == "pause":
            with open(os.path.join(fault_dir, f"paused-{stage}-{point}"), "w") as fh:
                fh.write(",".join(keys))
            while True:  # the test kills the whole build now
                time.sleep(1)
        elif action == "hold":
            with open(os.path.join(fault_dir, f"paused-{stage}-{point}"), "w") as fh:
                fh.write(",".join(keys))
            deadline = time.time() + 600
            while not os.path.exists(os.path.join(fault_dir, "release")) and time.time() < deadline:
                time.sleep(0.2)
        else:
            raise CnsbenchError(f"{ENV}: unknown action {action!r}")


def attempt_key(keys: list[str]) -> str:
    """A short, filesystem-safe key for a batch identified by its unit/trajectory ids."""
    return hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()[:20]


class Attempts:
    """Attempt markers of one stage in the output store."""

    def __init__(self, store, stage: str) -> None:
        self.store = store
        self.stage = stage

    def record(self, key: str) -> int:
        """Add a marker for this attempt; returns how many attempts came before it."""
        rel = f"attempts/{self.stage}/{key}"
        before = len(self.store.list(rel))
        self.store.write_bytes(f"{rel}/{uuid.uuid4().hex}", b"")
        return before
