"""Where the test suite's time goes: ``./scripts/test`` (or pytest on the given tests) with the
machine's CPU measured beside it.

    .venv/bin/python scripts/suite_profile.py                          # the whole suite, as CI runs it
    .venv/bin/python scripts/suite_profile.py tests/test_cluster.py -n 0   # one module alone
    .venv/bin/python scripts/suite_profile.py unit                     # one tier (docs/testing.md)

Prints one JSON object: ``wall_s``; ``busy_cpu_s``, the CPU-seconds the whole machine worked
meanwhile (every process, Ray's included, from ``/proc/stat``); ``busy_share`` (of all cores
over the wall time); ``intervals_90_busy``, the share of 5-second intervals in which the cores
were at least 90 % busy; ``worker_s``, the tests' own seconds summed over the test workers
(setup, call and teardown, from pytest's JUnit report); ``by_tier``, those seconds and the
number of tests per tier (tests/tiers.py); ``by_module``, those seconds per test module, largest
first; and pytest's exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INTERVAL_S = 5.0


def busy_and_total() -> tuple[float, float]:
    """(busy, total) jiffies of all cores since boot: busy is user, nice, system, irq and softirq."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:8]]
    user, nice, system, idle, iowait, irq, softirq = fields
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait


def by_module(junit: Path) -> Counter:
    """Seconds per test module from a JUnit report (each case's time: setup + call + teardown)."""
    seconds: Counter = Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        # The module is the last dotted part named test_*: a class name follows it, folders precede it.
        name = next((part for part in reversed(module) if part.startswith("test_")), ".".join(module))
        seconds[name] += float(case.get("time", 0.0))
    return seconds


def by_tier(junit: Path) -> dict[str, dict[str, float]]:
    """Tests and seconds per tier, from the ``tier`` property tests/conftest.py gives each test."""
    tiers: dict[str, dict[str, float]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        tier = next((p.get("value") for p in case.iter("property") if p.get("name") == "tier"), "unknown")
        entry = tiers.setdefault(tier, {"tests": 0, "seconds": 0.0})
        entry["tests"] += 1
        entry["seconds"] = round(entry["seconds"] + float(case.get("time", 0.0)), 1)
    return tiers


def main(argv: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="suite-profile-") as tmp:
        junit = Path(tmp) / "junit.xml"
        # The test script (its environment, its workers), with the given pytest arguments.
        cmd = [str(ROOT / "scripts" / "test"), *argv, f"--junitxml={junit}", "-p", "no:cacheprovider"]
        samples: list[float] = []
        stop = threading.Event()

        def sample() -> None:
            last = busy_and_total()
            while not stop.wait(INTERVAL_S):
                now = busy_and_total()
                samples.append((now[0] - last[0]) / max(1, now[1] - last[1]))
                last = now

        sampler = threading.Thread(target=sample, daemon=True)
        (busy0, total0), t0 = busy_and_total(), time.time()
        sampler.start()
        rc = subprocess.run(cmd, cwd=ROOT).returncode
        stop.set()
        sampler.join()
        busy1, total1 = busy_and_total()
        wall, busy = time.time() - t0, (busy1 - busy0) / os.sysconf("SC_CLK_TCK")
        # The share from the jiffies alone: the kernel's busy and total ticks of one span, where
        # the wall clock and the tick counters can disagree by a tick or two.
        share = (busy1 - busy0) / max(1, total1 - total0)
        modules = by_module(junit) if junit.is_file() else Counter()
        tiers = by_tier(junit) if junit.is_file() else {}
    cores = os.cpu_count() or 1
    result = {
        "command": "scripts/suite_profile.py " + " ".join(argv),
        "cores": cores,
        "wall_s": round(wall, 1),
        "busy_cpu_s": round(busy, 1),
        "busy_share": round(share, 3),
        "intervals_90_busy": round(sum(s >= 0.9 for s in samples) / len(samples), 3) if samples else None,
        "worker_s": round(sum(modules.values()), 1),
        "by_tier": tiers,
        "by_module": {name: round(s, 1) for name, s in modules.most_common()},
        "pytest_exit": rc,
    }
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:])["pytest_exit"])
