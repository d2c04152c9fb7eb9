"""A real two-node Ray cluster with token auth: `cnsbench submit` builds through the Jobs API,
and a worker node SIGKILLed mid-build does not cost the build.

The cluster is two ``ray start`` nodes on this machine, each inside its own PID namespace
(``unshare -p -f --mount-proc``): the head (GCS, dashboard/Jobs API, 2 CPUs) and a worker
node (its own raylet, 2 CPUs, its own temp dir).  SIGKILLing a namespace's init takes every
process of that node with it, and nothing else: other Ray instances on the host are never
touched.  Every port is chosen free, and the temp dirs are the test's own.

* The demo build is submitted with ``cnsbench submit --token-file`` (working_dir: a temporary
  directory holding only the config, which uses absolute asset paths; the workers import the
  installed ``pipeline``) and must succeed with the full output.
* Without the token the Jobs API answers 401 (and 403 with a wrong one).
* For the second build the worker node is replaced by one whose actors pause in the write
  of the last work unit (``CNSBENCH_FAULT_INJECT``, set on that node only), and a "holder"
  job keeps the head's CPUs busy so every stage actor lands on the worker node.  When the
  pause is reached (three shards committed, the fourth written but not committed) the
  worker node is SIGKILLed and the head's CPUs are released (a replacement node, in
  effect).  The job must then finish in place, or fail and finish on resubmission of the
  same command (resume: only the uncommitted trajectories are made again); either way the
  output equals the first build's, images byte for byte.

Observed with Ray 2.60: the job fails in place (``ActorUnavailableError``: the actor-task
retries are spent while the dead node's actors are "temporarily unavailable", before the
GCS declares the node dead), and the resubmission completes it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
from buildproc import HAS_UNSHARE, tiny_config, snapshot

from pipeline import jobs
from pipeline.cli import main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAS_UNSHARE, reason="needs `unshare -p -f --mount-proc` (root or user namespaces) "
                       "to run each Ray node in its own PID namespace"),
]

RAY = str(Path(sys.executable).with_name("ray"))
HEAD_RESOURCE = "cnsbench_test_head"  # a custom resource only the head has (for the holder job)
CLASSIFIERS = {"tiny-resnet", "tiny-vit", "tiny-clip-zs"}
START_TIMEOUT = 240
JOB_TIMEOUT = 420


# --------------------------------------------------------------------------- helpers
def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _procs_under(marker: str) -> dict[int, str]:
    """pid -> command line of the processes whose command line mentions ``marker``
    (the test's own temp dirs: only this cluster's processes, never anyone else's)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            found[int(entry)] = cmd
    return found


def _raylets(marker: str) -> list[int]:
    return [pid for pid, cmd in _procs_under(marker).items() if cmd.split(" ", 1)[0].endswith("/raylet")]


class Node:
    """One ``ray start --block`` inside its own PID namespace."""

    def __init__(self, name: str, args: list[str], env: dict, base: Path) -> None:
        self.name = name
        self.temp_dir = base / name
        self.log = base / f"{name}.log"
        cmd = ["unshare", "-p", "-f", "--mount-proc", RAY, "start", *args, f"--temp-dir={self.temp_dir}", "--block"]
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, timeout: float = 60) -> None:
        """SIGKILL the namespace's init (the child of ``unshare``): the kernel then kills every
        process of the namespace: raylet, agents, workers, the actors of this node."""
        children = subprocess.run(["pgrep", "-P", str(self.proc.pid)], check=False, capture_output=True, text=True).stdout.split()
        for pid in children:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=timeout)
        deadline = time.monotonic() + timeout
        while _procs_under(str(self.temp_dir)) and time.monotonic() < deadline:
            time.sleep(0.2)


class Cluster:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.token_file = base / "auth_token"
        self.token_file.write_text(secrets.token_hex(32))
        self.token_file.chmod(0o600)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CNSBENCH_FAULT", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_"))
        }
        env.update(
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN_PATH=str(self.token_file),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            RAY_DATA_DISABLE_PROGRESS_BARS="1",
            RAY_USAGE_STATS_ENABLED="0",
        )
        self.env = env
        self.nodes: list[Node] = []
        self.head: Node | None = None
        self.worker: Node | None = None
        self.worker_node_id: str | None = None

    # Every port explicit and free: other Ray instances on this host use the defaults.
    @staticmethod
    def _node_ports(p: list[int]) -> list[str]:
        return [
            f"--node-manager-port={p[0]}",
            f"--object-manager-port={p[1]}",
            f"--dashboard-agent-listen-port={p[2]}",
            f"--dashboard-agent-grpc-port={p[3]}",
            f"--runtime-env-agent-port={p[4]}",
            f"--metrics-export-port={p[5]}",
            "--min-worker-port=0",
            "--max-worker-port=0",
            "--num-gpus=0",
            "--object-store-memory=200000000",
            "--disable-usage-stats",
        ]

    def start(self) -> None:
        p = _free_ports(9)
        self.gcs_port, self.dashboard_port = p[0], p[1]
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        self.head = Node(
            "h",
            [
                "--head",
                f"--port={p[0]}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={p[1]}",
                f"--ray-client-server-port={p[2]}",
                "--num-cpus=2",
                f"--resources={json.dumps({HEAD_RESOURCE: 1})}",
                *self._node_ports(p[3:]),
            ],
            self.env,
            self.base,
        )
        self.nodes.append(self.head)
        self._wait(lambda: self._jobs_api_up(), "the head's Jobs API", self.head)
        self.add_worker("w")

    def add_worker(self, name: str, **extra_env: str) -> Node:
        """Start a worker node (2 CPUs) in a new PID namespace; it becomes ``self.worker``."""
        known = {n.node_id for n in self.alive_nodes()}
        # The worker gets its own temp dir: two nodes sharing one would share the runtime-env
        # cache, and the worker's agent would delete the job's working_dir from under the driver.
        worker = Node(name, [f"--address=127.0.0.1:{self.gcs_port}", "--num-cpus=2", *self._node_ports(_free_ports(6))],
                      {**self.env, **extra_env}, self.base)
        self.nodes.append(worker)
        new = []

        def joined() -> bool:
            new[:] = [n.node_id for n in self.alive_nodes() if not n.is_head_node and n.node_id not in known]
            return bool(new)

        self._wait(joined, f"worker node {name} to join", worker)
        self.worker, self.worker_node_id = worker, new[0]
        return worker

    def _wait(self, ready, what: str, node: Node) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if not node.alive():
                raise RuntimeError(f"`ray start` for {what} exited:\n{node.log_tail()}")
            try:
                if ready():
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}:\n{node.log_tail()}")
            time.sleep(2)

    def _jobs_api_up(self) -> bool:
        self.client().list_jobs()
        return True

    def client(self):
        return jobs.make_client(self.address, token_file=self.token_file)

    def _state(self):
        from ray.util.state.api import StateApiClient

        return StateApiClient(address=self.address, headers=jobs.auth_headers(self.token_file))

    def alive_nodes(self) -> list:
        from ray.util.state.common import ListApiOptions, StateResource

        nodes = self._state().list(StateResource.NODES, options=ListApiOptions(detail=True),
                                   raise_on_missing_output=False)
        return [n for n in nodes if n.state == "ALIVE"]

    def actors_on(self, node_id: str) -> list[str]:
        from ray.util.state.common import ListApiOptions, StateResource

        actors = self._state().list(
            StateResource.ACTORS, options=ListApiOptions(filters=[("state", "=", "ALIVE")], detail=True),
            raise_on_missing_output=False,
        )
        return sorted(a.repr_name or a.class_name for a in actors if a.node_id == node_id)

    def stop(self) -> dict[int, str]:
        """Kill every node's namespace; returns the processes that outlived that (then killed)."""
        for node in reversed(self.nodes):
            try:
                node.kill()
            except Exception:  # noqa: BLE001 - go on with the others; leftovers are reported
                pass
        left = _procs_under(str(self.base))
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left


@pytest.fixture(scope="module")
def cluster():
    # A short path: Ray's unix sockets live under the temp dirs (108-byte limit).
    base = Path(tempfile.mkdtemp(prefix="cnsc-", dir="/tmp"))
    c = Cluster(base)
    try:
        c.start()
        assert len(_raylets(str(base))) == 2, _procs_under(str(base))
        yield c
    finally:
        left = c.stop()
        shutil.rmtree(base, ignore_errors=True)
        assert not left, f"processes of the test cluster outlived it: {left}"


@pytest.fixture(autouse=True)
def _client_env(monkeypatch):
    """The test process itself has no Ray auth settings: the token must come from --token-file
    (and without RAY_AUTH_MODE=token neither cnsbench nor Ray falls back to ~/.ray/auth_token)."""
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(var, raising=False)


def _use_small_pools(raw: dict) -> None:
    # generate 1 + filter/classify/write 0.25 = 1.75 CPUs: all four pools fit on either node alone.
    for stage in ("filter", "classify", "write"):
        raw["resources"][stage]["num_cpus"] = 0.25


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """The uploaded working_dir: only the config (absolute asset paths, on this shared disk)."""
    wd = tmp_path_factory.mktemp("submit-wd")
    tiny_config(wd, _use_small_pools)
    return wd


def _conn(cluster) -> list[str]:
    return ["--address", cluster.address, "--token-file", str(cluster.token_file)]


def _submit(cluster, workdir: Path, out: Path, capsys, *, token: bool = True) -> tuple[int, str, str]:
    capsys.readouterr()
    conn = _conn(cluster) if token else ["--address", cluster.address]
    # --num-cpus 0: the driver is pinned to the head (as on the deploy/ clusters' on-demand head).
    rc = main(["submit", str(workdir / "tiny.yaml"), "--working-dir", str(workdir), "--output", str(out),
               "--num-cpus", "0", *conn])
    captured = capsys.readouterr()
    return rc, captured.out.strip(), captured.err


def _wait(cluster, job_id: str, capsys) -> str:
    capsys.readouterr()
    rc = main(["jobs", "wait", job_id, "--timeout", str(JOB_TIMEOUT), *_conn(cluster)])
    status = capsys.readouterr().out.strip()
    assert (rc == 0) == (status == "SUCCEEDED"), status
    return status


def _note(capsys, msg: str) -> None:
    """Shown in the terminal even without -s: how the cluster build went."""
    with capsys.disabled():
        print(f"\n[cluster] {msg}", flush=True)


def _logs(cluster, job_id: str, tail: int | None = 6000) -> str:
    text = jobs.job_logs(job_id, cluster.address, token_file=cluster.token_file)
    return text[-tail:] if tail else text


def _check_output(out: Path) -> dict:
    snap = snapshot(out)
    samples, preds = snap["samples"], snap["predictions"]
    assert len(snap["images"]) == 48
    assert samples["sample_id"].is_unique and len(samples) == 48
    assert set(samples["sample_id"]) == set(snap["images"])
    assert set(preds["classifier"]) == CLASSIFIERS
    for name, rows in preds.groupby("classifier"):
        assert rows["sample_id"].is_unique and set(rows["sample_id"]) == set(samples["sample_id"]), name
    assert (out / "report" / "index.html").is_file()
    assert not (out / "attempts").exists()
    return snap


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The first build's output, and its snapshot once test_submitted_build_succeeds made it."""
    return {"out": tmp_path_factory.mktemp("cluster-ref") / "out"}


# --------------------------------------------------------------------------- tests
def test_token_auth_is_enforced(cluster, workdir, tmp_path, capsys):
    # Ray's own client with no token: the Jobs API answers 401.
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{cluster.address}/api/jobs/", timeout=30)
    assert err.value.code == 401
    # cnsbench submit without a token is refused before anything runs.
    rc, out, errtext = _submit(cluster, workdir, tmp_path / "out", capsys, token=False)
    assert rc == 1 and not out
    assert "Unauthorized" in errtext or "Authentication" in errtext, errtext
    # A wrong token: 403.
    wrong = tmp_path / "wrong_token"
    wrong.write_text(secrets.token_hex(32))
    rc = main(["jobs", "status", "raysubmit_nonexistent", "--address", cluster.address, "--token-file", str(wrong)])
    assert rc == 1 and ("Forbidden" in capsys.readouterr().err)
    assert not (tmp_path / "out").exists()
    assert cluster.client().list_jobs() == []  # nothing was submitted


def test_submitted_build_succeeds(cluster, workdir, reference, capsys):
    out = reference["out"]
    t0 = time.monotonic()
    rc, job_id, err = _submit(cluster, workdir, out, capsys)
    assert rc == 0 and job_id.startswith("raysubmit_"), err
    status = _wait(cluster, job_id, capsys)
    assert status == "SUCCEEDED", _logs(cluster, job_id)
    _note(capsys, f"first build: {time.monotonic() - t0:.0f} s")
    assert main(["jobs", "status", job_id, *_conn(cluster)]) == 0
    assert capsys.readouterr().out.strip() == "SUCCEEDED"
    logs = _logs(cluster, job_id, tail=None)
    assert "8 trajectories planned, 0 already done, 8 to make" in logs
    reference["snap"] = _check_output(out)


def test_worker_node_killed_mid_build(cluster, workdir, reference, tmp_path, capsys):
    if "snap" not in reference:
        pytest.skip("the first cluster build did not succeed")
    out, faults = tmp_path / "out", tmp_path / "faults"
    faults.mkdir()
    # Replace the worker node by one whose actors pause in the write of the last work unit
    # (files written, manifest not), so that the kill lands with some shards committed and
    # one half-written.  The head has no such rule: work retried there goes through.
    cluster.worker.kill()
    cluster.add_worker("w2", CNSBENCH_FAULT_INJECT="write:before_manifest:painting_style/022/seed_0002:pause",
                       CNSBENCH_FAULT_DIR=str(faults))
    client = cluster.client()
    # Keep the head's CPUs busy so that every stage actor lands on the worker node.
    holder = client.submit_job(entrypoint="sleep 3600", entrypoint_num_cpus=2,
                               entrypoint_resources={HEAD_RESOURCE: 1})
    try:
        deadline = time.monotonic() + 120
        while jobs.job_status(holder, cluster.address, token_file=cluster.token_file) != "RUNNING":
            assert time.monotonic() < deadline, "the holder job never started"
            time.sleep(1)
        t0 = time.monotonic()
        rc, job_id, err = _submit(cluster, workdir, out, capsys)
        assert rc == 0, err
        deadline = time.monotonic() + JOB_TIMEOUT
        while not list(faults.glob("paused-*")):
            status = jobs.job_status(job_id, cluster.address, token_file=cluster.token_file)
            assert status not in jobs.TERMINAL_STATUSES, f"{status} before the kill:\n{_logs(cluster, job_id)}"
            assert time.monotonic() < deadline, f"the build never reached the pause:\n{_logs(cluster, job_id)}"
            time.sleep(0.5)
        on_worker = cluster.actors_on(cluster.worker_node_id)
        committed = len(list((out / "manifest").glob("*.json")))
        cluster.worker.kill()
        _note(capsys, f"killed the worker node after {time.monotonic() - t0:.0f} s, "
              f"{committed}/4 shards committed; its actors: {on_worker}")
        assert not _procs_under(str(cluster.worker.temp_dir)), "the worker node's processes survived SIGKILL"
        assert len(_raylets(str(cluster.base))) == 1
        # The paused write actor was on the killed node (the earlier pools may have ended).
        assert "MapWorker(MapBatches(WriteStage))" in on_worker, on_worker
    finally:
        client.stop_job(holder)  # the head's CPUs come free: the pools can move there
    status = _wait(cluster, job_id, capsys)
    _note(capsys, f"the job after the kill: {status} ({time.monotonic() - t0:.0f} s)")
    if status != "SUCCEEDED":
        _note(capsys, f"its log ends:\n{_logs(cluster, job_id, tail=1500)}")
        done = 2 * len(list((out / "manifest").glob("*.json")))  # trajectories_per_shard: 2
        rc, job2, err = _submit(cluster, workdir, out, capsys)
        assert rc == 0, err
        status2 = _wait(cluster, job2, capsys)
        assert status2 == "SUCCEEDED", _logs(cluster, job2)
        logs2 = _logs(cluster, job2, tail=None)
        assert f"8 trajectories planned, {done} already done, {8 - done} to make" in logs2, logs2
        _note(capsys, f"resubmitted ({done} trajectories were committed): {status2} "
              f"({time.monotonic() - t0:.0f} s){' - it removed uncommitted files' if 'uncommitted file' in logs2 else ''}")
    assert not list(out.rglob(".tmp-*"))
    snap, ref = _check_output(out), reference["snap"]
    assert set(snap["images"]) == set(ref["images"])
    pd.testing.assert_frame_equal(snap["samples"], ref["samples"])
    keys = ["sample_id", "classifier"]
    assert snap["predictions"][keys].equals(ref["predictions"][keys])
    pd.testing.assert_frame_equal(snap["predictions"], ref["predictions"])
    assert snap["images"] == ref["images"]  # byte-identical: one generation thread on either node
