"""CPU-seconds of a command's whole process tree, per process kind (a measuring tool, not a test).

    python tests/proc_cpu.py unshare -p -f --mount-proc python -m pipeline.cli build CFG --output OUT --runner ray

Every 0.3 s it reads the user+system CPU of the command and of every process under it;
each process is named by its Ray title (``ray::MapWorker(MapBatches(GenerateStage))``,
``ray::IDLE``, ...) or its command line.  Prints the wall time, the total, and the CPU per
kind.  The CPU a process spends in its last 0.3 s is missed.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import time

import psutil


def kind(cmdline: str) -> str:
    if cmdline.startswith("ray::"):
        return cmdline.split()[0]
    for part in ("gcs_server", "raylet", "log_monitor", "dashboard", "runtime_env"):
        if part in cmdline:
            return part
    return cmdline[:80]


def main(cmd: list[str]) -> None:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = psutil.Process(proc.pid)
    cpu: dict[tuple, float] = {}
    names: dict[tuple, str] = {}
    t0 = time.time()
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                times, key = p.cpu_times(), (p.pid, p.create_time())
                cpu[key] = times.user + times.system
                line = " ".join(p.cmdline())
                if line:  # a process's title can change (Ray workers become their actor)
                    names[key] = line[:200]
            except psutil.Error:
                pass
        time.sleep(0.3)
    wall = time.time() - t0
    total, count = collections.Counter(), collections.Counter()
    for key, seconds in cpu.items():
        name = kind(names.get(key, "?"))
        total[name] += seconds
        count[name] += 1
    print(f"exit {proc.returncode}, wall {wall:.1f} s, CPU {sum(total.values()):.1f} s")
    for name, seconds in total.most_common():
        print(f"{seconds:7.1f} s  {count[name]:3d}  {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
