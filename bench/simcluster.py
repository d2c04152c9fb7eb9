"""The simulated cluster of ``bench/scale.py``: ``ray start`` nodes on this machine declaring GPUs
they do not have, each in its own PID namespace (``tests/raycluster.py``'s ``Node``), and a
meter of the CPU its processes use.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class SimCluster:
    """Two or more ``ray start`` nodes in their own PID namespaces, declaring GPUs."""

    def __init__(self, nodes: int, gpus: int, cpus_per_node: int, object_store_bytes: int = 1_000_000_000) -> None:
        sys.path.insert(0, str(ROOT / "tests"))
        from raycluster import Cluster, Node, _free_ports

        self.base = Path(tempfile.mkdtemp(prefix="cnss-", dir="/tmp"))
        helper = Cluster(self.base)  # its token and environment; its node start is sized for tests
        # A loaded machine starts a node's agents slowly: the raylet waits for them longer.
        self.env = {**helper.env, "PYTHONPATH": str(ROOT), "RAY_agent_register_timeout_ms": "600000",
                    "RAY_raylet_start_wait_time_s": "600",
                    # No idle workers started ahead (one per logical CPU): only the pools' actors.
                    "RAY_prestart_worker_first_driver": "0", "RAY_enable_worker_prestart": "0"}
        self.nodes: list = []
        per_node = [gpus // nodes + (1 if i < gpus % nodes else 0) for i in range(nodes)]
        ports = _free_ports(9)
        self.address = f"127.0.0.1:{ports[0]}"

        def node_args(p: list[int], n_gpus: int) -> list[str]:
            return [
                f"--node-manager-port={p[0]}", f"--object-manager-port={p[1]}",
                f"--dashboard-agent-listen-port={p[2]}", f"--dashboard-agent-grpc-port={p[3]}",
                f"--runtime-env-agent-port={p[4]}", f"--metrics-export-port={p[5]}",
                "--min-worker-port=0", "--max-worker-port=0", f"--num-gpus={n_gpus}",
                f"--num-cpus={cpus_per_node}", f"--object-store-memory={object_store_bytes}", "--disable-usage-stats",
            ]

        head = ["--head", f"--port={ports[0]}", "--include-dashboard=false", f"--ray-client-server-port={ports[1]}"]
        self.gpus, self.per_node = gpus, per_node
        try:
            self._start(lambda: Node("h", head + node_args(ports[2:8], per_node[0]), self.env, self.base))
            for i, n in enumerate(per_node[1:], 1):
                self._start(lambda: Node(f"w{i}", [f"--address={self.address}", *node_args(_free_ports(6), n)],
                                         self.env, self.base))
        except BaseException:
            self.stop()
            raise

    def _start(self, make, tries: int = 8, timeout: float = 240) -> None:
        """Start a node and wait for `ray start` to say it runs; on a loaded machine a node
        may miss the raylet's fixed 15 s wait for its agents (ray-project/ray#65983) or the 30 s
        registration window of `ray start`, so a node that exits is started again."""
        for attempt in range(tries):
            started = time.time()
            node = _boosted(make)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if "Ray runtime started" in node.log_tail(100000):
                    self.nodes.append(node)
                    _renice(descendants([node.proc.pid]), 0)  # started: back to everyone's priority
                    return
                if not node.alive() or _raylet_died(node, started):
                    break
                time.sleep(1)
            node.kill()
        raise RuntimeError(f"ray node {node.name} did not start in {tries} tries:\n{node.log_tail()}")

    def our_pids(self) -> list[int]:
        """Every process of the cluster: the nodes' namespaces and all their descendants."""
        return descendants([n.proc.pid for n in self.nodes])

    def stop(self) -> None:
        from raycluster import _procs_under

        for node in reversed(self.nodes):
            try:
                node.kill()
            except Exception:  # noqa: BLE001 - go on with the others
                pass
        for pid in _procs_under(str(self.base)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.base, ignore_errors=True)


def descendants(roots: list[int]) -> list[int]:
    """``roots`` and every process below them (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _raylet_died(node, since: float) -> bool:
    """The node's raylet gave up waiting for its agents (its `ray start` may wait on for minutes)."""
    for log in Path(node.temp_dir).glob("session_*/logs/raylet*.out"):
        try:
            if log.stat().st_mtime >= since and "Timed out waiting for file" in log.read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False


def _boosted(make):
    """``make()`` with its processes at a raised priority (root only; else as is): a node's
    start-up races fixed timeouts, and once it runs it is put back (:func:`_renice`)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    except OSError:
        return make()
    try:
        return make()
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, 0)


def _renice(pids: list[int], value: int) -> None:
    for pid in pids:
        try:
            os.setpriority(os.PRIO_PROCESS, pid, value)
        except OSError:
            pass


class CpuMeter:
    """This machine's CPU and the CPU time of our own processes, sampled every second; windows
    between marks (:meth:`mark`) give each its utilisation."""

    def __init__(self, pids, interval: float = 1.0) -> None:
        self.pids = pids  # callable -> our pids now
        self.interval = interval
        self.seen: dict[int, float] = {}
        self.first: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self.snapshots: dict[str, dict[int, float]] = {}
        self.marks: dict[str, tuple[float, float, float, float]] = {}
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.tick = os.sysconf("SC_CLK_TCK")
        self.mark("start")
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    @staticmethod
    def _stat() -> tuple[float, float]:
        f = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = f[3] + f[4]
        return sum(f) - idle, sum(f)

    def _sample(self) -> None:
        for pid in [os.getpid(), *self.pids()]:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                cpu = (float(fields[11]) + float(fields[12])) / self.tick
            except (OSError, IndexError):
                continue
            with self.lock:
                if pid not in self.first:
                    self.first[pid] = cpu
                    self.names[pid] = _name(pid)
                self.seen[pid] = max(self.seen.get(pid, 0.0), cpu)

    def _loop(self) -> None:
        while not self.stop_event.wait(self.interval):
            self._sample()

    def ours(self) -> float:
        with self.lock:
            return sum(self.seen.values())

    def mark(self, name: str, at: float | None = None) -> None:
        """Remember now (our CPU seconds, the machine's counters) as ``name``."""
        self._sample()
        busy, total = self._stat()
        self.marks[name] = (at or time.time(), self.ours(), busy, total)
        with self.lock:
            self.snapshots[name] = dict(self.seen)

    def window(self, first: str, last: str) -> dict:
        """CPU between two marks: our processes' share of the machine and the machine's."""
        t0, ours0, busy0, total0 = self.marks[first]
        t1, ours1, busy1, total1 = self.marks[last]
        wall, cores = max(1e-9, t1 - t0), os.cpu_count() or 1
        return {
            "cpu_utilisation": (ours1 - ours0) / (wall * cores),
            "cpu_utilisation_machine": (busy1 - busy0) / max(1e-9, total1 - total0),
            "cpu_seconds": ours1 - ours0,
            "wall_s": wall,
            "cores": cores,
        }

    def by_process(self, first: str, last: str) -> dict[str, float]:
        """CPU seconds each kind of process used between two marks (named by its command line at the end)."""
        out: dict[str, float] = {}
        before, after = self.snapshots[first], self.snapshots[last]
        for pid, cpu in after.items():
            name = _name(pid) if Path(f"/proc/{pid}").exists() else self.names.get(pid, "?")
            out[name] = out.get(name, 0.0) + cpu - before.get(pid, self.first.get(pid, 0.0))
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join()


def _name(pid: int) -> str:
    """A process's kind: a Ray actor's stage class, else its program's name."""
    import re

    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"
    stage = re.search(r"\b(\w+Stage)\b", cmd)
    if stage:
        return stage.group(1)
    if "scale.py --driver" in cmd:
        return "driver"
    words = cmd.split()
    prog = Path(words[0]).name if words else "?"
    if prog.startswith("python") and len(words) > 1:
        prog = Path(words[1]).name if not words[1].startswith("-") else " ".join(words[1:3])
    return prog[:40]
