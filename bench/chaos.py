"""A randomised fault campaign: builds under injected faults must end identical to a clean build.

    python bench/chaos.py --runs 30 --seed 1 --json --runner cluster --s3   # the recorded campaign
    python bench/chaos.py --runs 3 --seed 1 --json --runner local   # the short one of the tests

The recorded campaigns: BENCHMARKS.md, "Fault campaigns: 30 randomised faulted builds each, 0
outputs differing".

``--runner`` says where the build runs: ``local`` (the in-process executor, in a child
process forked from the campaign's after its clean build, so that every attempt starts with
the libraries imported and the models loaded, as a long-lived driver would; the kill is a
SIGKILL of that child), ``ray`` (a fresh interpreter with a local Ray the build starts
itself) or ``cluster`` (a two-node Ray cluster of ``ray start`` nodes, each in its own PID
namespace, started once for the campaign: ``tests/raycluster.py``; the build connects to it
with ``--address``).

Every run builds ``configs/tiny.yaml`` (random-weight components, 48 images) into a fresh
output.  A scheduler seeded from ``--seed`` and the run's number picks, per attempt, a
fault and a moment:

``kill_driver``   SIGKILL of the build's driver at a random time (with ``ray`` the build
                  runs in its own PID namespace, so every Ray process dies with it);
``kill_worker``   SIGKILL of one Ray worker process of the build at a random time (Ray
                  restarts the actor and retries its batch; ``ray`` and ``cluster``);
``kill_node``     SIGKILL of the whole worker node (its PID namespace: raylet, agents, the
                  actors on it) at a random time; a replacement node joins (``cluster``);
``actor_raise``   a stage raises in the middle of a batch for some trajectories (they are
                  recorded as failed; the next run redoes them);
``crash_actor``   a stage's worker process exits hard once (an OOM kill);
``storage``       (``--s3``) the output lives on an S3 test server behind a proxy that
                  answers 503, drops connections and truncates bodies at random;
``corrupt_shard`` / ``delete_shard``  between attempts, a committed shard file is
                  truncated or deleted (the next run detects it by size and redoes it).

After each faulted attempt the build is run again, without faults, until it exits 0;
then the output's digest (sample ids and coordinates, predictions, image bytes:
:mod:`pipeline.io.digest`) is compared with the clean build's.  The JSON printed at the
end has ``runs``, ``faults`` (injected, by kind), ``resumes`` (clean re-runs needed),
``outputs_differing`` (the target is 0), ``wall_overhead`` (total wall time of the faulted
runs over ``runs`` x the clean build's) and one entry per run.

A build's lease outlives a SIGKILLed driver; the campaign sets the lease timeout to 10 s, and
a resume refused with exit 2 (the lease still held) waits that long and runs again.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from buildproc import HAS_UNSHARE, ForkedBuild, tiny_config  # noqa: E402
from raycluster import Cluster, small_pools  # noqa: E402

from pipeline.io.digest import output_digest  # noqa: E402

TIMEOUT = 900


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNSBENCH_FAULT")}
    # A killed build's lease expires after 10 s (its pid may live on in another namespace).
    env.update(HF_HUB_OFFLINE="1", RAY_DATA_DISABLE_PROGRESS_BARS="1", OMP_NUM_THREADS="1", CNSBENCH_LEASE_TIMEOUT_S="10")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def _cmd(cfg: Path, out: str, runner: str, address: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "pipeline.cli", "build", str(cfg), "--output", out, "--runner",
           "ray" if runner == "cluster" else runner, *(["--address", address] if address else [])]
    # A build that starts its own Ray runs in its own PID namespace (a kill takes every Ray
    # process with it); a driver joining the cluster must not (the raylets check its pid).
    return ["unshare", "-p", "-f", "--mount-proc", *cmd] if HAS_UNSHARE and not address else cmd


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = subprocess.run(["pgrep", "-P", str(p)], capture_output=True, text=True).stdout.split()
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _kill_all(proc: subprocess.Popen) -> None:
    for pid in _descendants(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.kill()
    proc.wait(timeout=60)


def map_workers(roots: list[int]) -> list[int]:
    """The Ray Data actor processes (``ray::MapWorker``) among the descendants of ``roots``."""
    return [p for root in roots for p in _descendants(root) if "ray::MapWorker" in _cmdline(p)]


def attempt(cfg: Path, out: str, runner: str, env: dict, kill_after: float | None = None,
            strike: tuple[float, Callable[[subprocess.Popen], bool]] | None = None,
            address: str | None = None) -> tuple[int | None, float]:
    """One build; SIGKILL it all after ``kill_after`` s.  ``strike`` = (t, fault): from t seconds
    on, ``fault(build process)`` is called until it reports done (a worker or node killed).
    Returns (exit code or None when killed, wall seconds)."""
    start = time.monotonic()
    log_path = Path(tempfile.mkstemp(prefix="attempt-", suffix=".log", dir=cfg.parent)[1])
    if runner == "local":
        proc = ForkedBuild(["build", cfg, "--output", out, "--runner", "local"], log_path, env=env)
    else:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(_cmd(cfg, out, runner, address), env=env, stdout=log, stderr=subprocess.STDOUT)
    struck = strike is None
    while True:
        code = proc.poll()
        elapsed = time.monotonic() - start
        if code is not None:
            return code, elapsed
        if kill_after is not None and elapsed >= kill_after:
            _kill_all(proc)
            return None, elapsed
        if not struck and elapsed >= strike[0]:
            struck = strike[1](proc)
        if elapsed > TIMEOUT:
            _kill_all(proc)
            raise RuntimeError(f"build of {out} did not finish in {TIMEOUT} s")
        time.sleep(0.1)


def damage(out: Path, rng: random.Random, kind: str) -> bool:
    """Truncate or delete one committed shard file; False when nothing is committed yet."""
    files = sorted(p for d in ("images", "samples", "predictions") for p in (out / d).glob("*") if p.is_file())
    if not files:
        return False
    victim = rng.choice(files)
    if kind == "delete_shard":
        victim.unlink()
    else:
        data = victim.read_bytes()
        victim.write_bytes(data[: max(0, len(data) // 2)])
    return True


def s3_behind_a_faulty_proxy(seed: int, rate: float = 0.05):
    """Start an S3 test server and a fault-injecting proxy in front of it; point AWS_* at the proxy."""
    from faultproxy import FaultProxy
    from s3server import S3Server

    server = S3Server("chaos")
    proxy = FaultProxy(server.url, rate=rate, kinds=("503", "drop", "truncate", "delay"), seed=seed,
                       delay_s=0.2).__enter__()
    os.environ.update(server.env(proxy.url))
    return server, proxy


class Where:
    """Where the campaign's builds run: how to start one, and how to kill a worker or a node."""

    def __init__(self, runner: str) -> None:
        self.runner, self.cluster, self.address = runner, None, None
        self.replacing: threading.Thread | None = None
        self.nodes_added = 0
        if runner == "cluster":
            # A short path: Ray's unix sockets live under the nodes' temp dirs (108-byte limit).
            self.cluster = Cluster(Path(tempfile.mkdtemp(prefix="cnsx-", dir="/tmp")))
            self.cluster.start()
            self.address = f"127.0.0.1:{self.cluster.gcs_port}"

    def kinds(self) -> list[str]:
        kinds = ["kill_driver", "actor_raise", "crash_actor", "corrupt_shard", "delete_shard"]
        if self.runner in ("ray", "cluster"):
            kinds.append("kill_worker")
        if self.cluster is not None:
            kinds.append("kill_node")
        return kinds

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return _env({**(self.cluster.env if self.cluster else {}), **(extra or {})})

    def _node_roots(self, proc: subprocess.Popen) -> list[int]:
        if self.cluster is None:
            return [proc.pid]
        return [n.proc.pid for n in self.cluster.nodes if n.alive()]

    def kill_worker(self, proc: subprocess.Popen) -> bool:
        workers = map_workers(self._node_roots(proc))
        if workers:
            os.kill(random.Random(len(workers) * 7919 + proc.pid).choice(workers), signal.SIGKILL)
        return bool(workers)

    def kill_node(self, proc: subprocess.Popen) -> bool:
        """SIGKILL the worker node's namespace; a replacement joins in the background."""
        self.cluster.worker.kill()
        self.nodes_added += 1
        self.replacing = threading.Thread(target=self.cluster.add_worker, args=(f"w{self.nodes_added}",), daemon=True)
        self.replacing.start()
        return True

    def settle(self) -> None:
        """Wait for a replacement node before the next attempt."""
        if self.replacing is not None:
            self.replacing.join(timeout=300)
            self.replacing = None

    def stop(self) -> None:
        if self.cluster is not None:
            self.settle()
            self.cluster.stop()
            shutil.rmtree(self.cluster.base, ignore_errors=True)


def campaign(runs: int, seed: int, runner: str, workdir: Path, s3_url: str | None = None, echo=print,
             proxy=None) -> dict:
    import contextlib

    with contextlib.redirect_stdout(sys.stderr):  # asset notes must not mix into --json's stdout
        cfg = tiny_config(workdir, small_pools if runner == "cluster" else None)
    where = Where(runner)
    try:
        return _campaign(runs, seed, where, cfg, workdir, s3_url, echo, proxy)
    finally:
        where.stop()


def warm_up(cfg: Path, out: Path, env: dict[str, str]) -> None:
    """The clean build in this process, under the attempts' environment (restored after)."""
    import contextlib

    from pipeline.cli import main

    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # its progress must not mix into --json's stdout
            code = main(["build", str(cfg), "--output", str(out), "--runner", "local"])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if code != 0:
        raise RuntimeError(f"the clean build in this process failed (exit {code})")


def _campaign(runs: int, seed: int, where: Where, cfg: Path, workdir: Path, s3_url: str | None, echo,
              proxy) -> dict:
    runner, kinds, env = where.runner, where.kinds(), where.env()

    clean_out = workdir / "clean"
    if runner == "local":
        # The clean build in this process: the attempts forked from it start with its imports
        # and loaded models.  Its wall time would include them, so the kill moments are drawn
        # from a second clean build's, run as the attempts are.
        warm_up(cfg, workdir / "clean-in-process", env)
    code, clean_wall = attempt(cfg, str(clean_out), runner, env, address=where.address)
    if code != 0:
        raise RuntimeError(f"the clean build failed (exit {code}); its log is the newest attempt-*.log in {workdir}")
    reference = output_digest(str(clean_out))
    if runner == "local" and output_digest(str(workdir / "clean-in-process")) != reference:
        raise RuntimeError("the clean builds in this process and in a forked one differ")
    echo(f"[chaos] clean build: {clean_wall:.1f} s")

    faults = {k: 0 for k in kinds + (["storage"] if s3_url else [])}
    per_run, differing, resumes, faulted_wall = [], 0, 0, 0.0
    for run in range(runs):
        rng = random.Random(seed * 100_003 + run)
        out_local = workdir / f"run{run:03d}"
        out = f"{s3_url}/run{run:03d}" if s3_url else str(out_local)
        run_faults, run_resumes, wall = [], 0, 0.0
        for _ in range(rng.randint(1, 3)):  # faulted attempts in this run
            kind = rng.choice(kinds)
            if kind in ("corrupt_shard", "delete_shard"):
                if s3_url or not damage(out_local, rng, kind):
                    kind = "kill_driver"  # nothing to damage yet (or not on local disk): kill instead
                else:
                    run_faults.append(kind)
                    continue
            fault_dir = Path(tempfile.mkdtemp(dir=workdir))
            extra: dict[str, str] = {"CNSBENCH_FAULT_DIR": str(fault_dir)}
            kill_after = strike = None
            stage = rng.choice(["generate", "filter", "classify", "write"])
            if kind == "kill_driver":
                kill_after = rng.uniform(0.1, 0.9) * clean_wall
            elif kind == "kill_worker":
                strike = (rng.uniform(0.3, 0.8) * clean_wall, where.kill_worker)
            elif kind == "kill_node":
                strike = (rng.uniform(0.2, 0.8) * clean_wall, where.kill_node)
            elif kind == "actor_raise":
                extra["CNSBENCH_FAULT_INJECT"] = f"{stage if stage != 'write' else 'classify'}:start:{rng.choice(['painting', 'heavy'])}:raise"
            elif kind == "crash_actor":
                extra["CNSBENCH_FAULT_INJECT"] = f"{stage}:start:*:crash_once"
            code, seconds = attempt(cfg, out, runner, where.env(extra), kill_after, strike, where.address)
            where.settle()
            wall += seconds
            run_faults.append(kind)
        # Resume without faults (storage faults stay: the network stays bad) until the build completes.
        while True:
            code, seconds = attempt(cfg, out, runner, env, address=where.address)
            wall += seconds
            run_resumes += 1
            if code == 0:
                break
            if code == 2:  # most likely the lease of the build killed a moment ago: wait for it to expire
                time.sleep(11)
            if run_resumes > 6:
                raise RuntimeError(f"run {run}: the build still fails after {run_resumes} resumes (exit {code})")
        digest = output_digest(out)
        same = digest == reference
        differing += not same
        resumes += run_resumes
        faulted_wall += wall
        for k in run_faults:
            faults[k] += 1
        if proxy is not None:  # the proxy counts over the whole campaign: this run's share
            injected = sum(proxy.counts.values()) - faults["storage"]
            faults["storage"] += injected
            run_faults.append(f"storage x{injected}")
        per_run.append({"run": run, "faults": run_faults, "resumes": run_resumes, "wall_s": round(wall, 1), "same": same})
        echo(f"[chaos] run {run}: faults {run_faults}, {run_resumes} resume(s), {wall:.1f} s, "
             f"{'same output' if same else 'OUTPUT DIFFERS'}")
        if not s3_url:
            shutil.rmtree(out_local, ignore_errors=True)
        # What is known so far, for a campaign stopped early.
        (workdir / "partial.json").write_text(json.dumps({"runs_done": run + 1, "faults": faults, "resumes": resumes,
                                                         "outputs_differing": differing, "per_run": per_run}))
    return {
        "runs": runs,
        "seed": seed,
        "runner": runner,
        "storage": "s3 behind a faulty proxy" if s3_url else "local disk",
        "faults": faults,
        "resumes": resumes,
        "outputs_differing": differing,
        "clean_wall_s": round(clean_wall, 1),
        "wall_overhead": round(faulted_wall / (runs * clean_wall), 2) if runs else None,
        "per_run": per_run,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runner", choices=("cluster", "ray", "local"), default="cluster")
    p.add_argument("--json", action="store_true", help="print one JSON object (progress goes to stderr)")
    p.add_argument("--workdir", help="where outputs go (default: a temporary directory, removed after)")
    p.add_argument("--s3", action="store_true", help="faulted outputs on an S3 test server behind a faulty proxy")
    args = p.parse_args(argv)
    echo = (lambda m: print(m, file=sys.stderr)) if args.json else print
    if args.runner == "cluster" and not HAS_UNSHARE:
        echo("[chaos] no `unshare -p -f --mount-proc` here (root or user namespaces): a cluster's nodes "
             "cannot be killed one by one; running with --runner ray instead")
        args.runner = "ray"
    tmp = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="cnsbench-chaos-"))
    tmp.mkdir(parents=True, exist_ok=True)
    server = proxy = None
    try:
        if args.s3:
            server, proxy = s3_behind_a_faulty_proxy(args.seed)
        result = campaign(args.runs, args.seed, args.runner, tmp, echo=echo, proxy=proxy,
                          s3_url="s3://chaos" if args.s3 else None)
    finally:
        if proxy is not None:
            proxy.__exit__()
        if server is not None:
            server.stop()
        if not args.workdir:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            if k != "per_run":
                print(f"{k}: {v}")
    return 0 if result["outputs_differing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
