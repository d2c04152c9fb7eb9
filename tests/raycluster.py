"""A local multi-node Ray cluster for tests and the fault campaign: ``ray start`` nodes on this
machine, each inside its own PID namespace (``unshare -p -f --mount-proc``), with token auth.

SIGKILLing a namespace's init takes every process of that node with it, and nothing else:
other Ray instances on the host are never touched.  Every port is chosen free, and the temp
dirs are the caller's own (keep the base path short: Ray's unix sockets live under it).
Used by ``tests/test_cluster.py`` and ``bench/chaos.py --runner cluster``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from pipeline.runtime import jobs
RAY = str(Path(sys.executable).with_name("ray"))
HEAD_RESOURCE = "cnsbench_test_head"  # a custom resource only the head has (for a holder job)
START_TIMEOUT = 420  # a node joins in seconds alone; minutes beside a busy suite
NODE_LABEL = "cnsbench-test-node"  # each node's temp dir name, to tell a worker's node id


class NodeExited(RuntimeError):
    """``ray start`` ended before its node was ready."""


def small_pools(raw: dict) -> None:
    """A config mutation for ``buildproc.tiny_config``: generate 1 + filter/classify/write 0.25
    = 1.75 CPUs, so all four pools fit on either 2-CPU node alone."""
    for stage in ("filter", "classify", "write"):
        raw["resources"][stage]["num_cpus"] = 0.25


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
        # A busy 2-core machine registers a node slower than Ray's default wait allows.
        env = {"RAY_raylet_start_wait_time_s": "120", **env}
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
        self.head_cpus = 2

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
        """Start the head node (its Jobs API up); worker nodes join with ``add_worker``."""
        self.head = self._start(self._head, self._head_up, "the head's Jobs API and raylet")

    def _head(self) -> Node:
        p = _free_ports(9)
        self.gcs_port, self.dashboard_port = p[0], p[1]
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        return self._node("h", [
            "--head", f"--port={p[0]}", "--dashboard-host=127.0.0.1", f"--dashboard-port={p[1]}",
            f"--ray-client-server-port={p[2]}", f"--num-cpus={self.head_cpus}", *self._head_args(),
            *self._node_ports(p[3:]),
        ], self.env)

    def _head_args(self) -> list[str]:
        """The head's own arguments beyond the common ones (``gcs_port`` is chosen by then)."""
        return [f"--resources={json.dumps({HEAD_RESOURCE: 1})}"]

    def add_worker(self, name: str, **extra_env: str) -> Node:
        """Start a worker node (2 CPUs) in a new PID namespace; it becomes ``self.worker``."""
        # The worker gets its own temp dir: two nodes sharing one would share the runtime-env
        # cache, and the worker's agent would delete the job's working_dir from under the driver.
        # Its label tells it from every other node, a failed earlier try's included.
        new = []

        def worker() -> Node:
            return self._node(name, [f"--address=127.0.0.1:{self.gcs_port}", "--num-cpus=2",
                                     *self._node_ports(_free_ports(6))], {**self.env, **extra_env})

        def joined() -> bool:
            label = {NODE_LABEL: self.nodes[-1].temp_dir.name}
            new[:] = [n.node_id for n in self.alive_nodes() if label.items() <= (n.labels or {}).items()]
            return bool(new)

        self.worker = self._start(worker, joined, f"worker node {name} to join")
        self.worker_node_id = new[0]
        return self.worker

    def _node(self, name: str, args: list[str], env: dict) -> Node:
        """Start a node labelled with its temp dir's name; a retry gets a temp dir of its own
        (``w-1``, ``w-2``)."""
        tries = sum(1 for n in self.nodes if n.temp_dir.name.split("-")[0] == name)
        name = name if not tries else f"{name}-{tries}"
        return Node(name, [*args, f"--labels={NODE_LABEL}={name}"], env, self.base)

    def _start(self, make, ready, what: str, tries: int = 3) -> Node:
        """Start the node ``make()`` describes and wait until ``ready()``.  On a busy machine
        ``ray start`` may exit before that: its wait for the raylet to register is a fixed 30 s
        (``ray._private.node``), and a loaded GCS can take longer; such a node is started again,
        with fresh ports, ``tries`` times in all."""
        for attempt in range(1, tries + 1):
            node = make()
            self.nodes.append(node)
            try:
                self._wait(ready, what, node)
                return node
            except NodeExited:
                if attempt == tries:
                    raise
                node.kill()

    def _wait(self, ready, what: str, node: Node) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if not node.alive():
                raise NodeExited(f"`ray start` for {what} exited:\n{node.log_tail()}")
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

    def _head_up(self) -> bool:
        """The Jobs API answers and the head's raylet has registered (the dashboard comes up
        before the raylet does: on a busy machine, seconds before)."""
        return self._jobs_api_up() and any(n.is_head_node for n in self.alive_nodes())

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


# --------------------------------------------------------------------------- autoscaling
# Ray's fake multi-node provider, with the node's memory passed as Ray's ``memory`` resource:
# Ray's own passes every resource other than CPU, GPU and object store as a custom resource,
# so it refuses ``memory`` in a node type.  Nodes it starts are processes of the head's
# autoscaler, inside the head's PID namespace: killing the head's namespace ends them all.
PROVIDER_MODULE = "raycluster.MemoryFakeProvider"
FAKE_HEAD_NODE_ID = "fffffffffffffffffffffffffffffffffffffffffffffffffff00000"


def _memory_provider():
    import ray._private.parameter
    from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider

    class MemoryFakeProvider(FakeMultiNodeProvider):
        def _create_node_with_resources_and_labels(self, node_config, tags, count, resources, labels):
            resources = dict(resources)
            memory = resources.pop("memory", None)
            original = ray._private.parameter.RayParams

            def params(*args, **kwargs):
                if memory:
                    kwargs["memory"] = int(memory)
                kwargs.setdefault("object_store_memory", 100_000_000)
                return original(*args, **kwargs)

            with self.lock:
                ray._private.parameter.RayParams = params
                try:
                    super()._create_node_with_resources_and_labels(node_config, tags, count, resources, labels)
                finally:
                    ray._private.parameter.RayParams = original

    return MemoryFakeProvider


def __getattr__(name: str):  # the provider class is built on first use: importing Ray's provider is slow
    if name == "MemoryFakeProvider":
        return _memory_provider()
    raise AttributeError(name)


class AutoscalingCluster(Cluster):
    """A head with CPUs only, ``ray start --autoscaling-config`` with the fake provider
    (``RAY_FAKE_CLUSTER=1``), in its own PID namespace: GPU nodes are started from zero on
    demand and released after ``idle_timeout_minutes``.  ``gpu_type`` is the GPU node type's
    ``resources`` (e.g. ``{"CPU": 1, "GPU": 1, "memory": 2**31}``; leave ``memory`` out for a
    type that declares none)."""

    def __init__(self, base: Path, gpu_type: dict, max_workers: int = 3, idle_timeout_minutes: float = 0.25,
                 head_cpus: int = 2) -> None:
        super().__init__(base)
        self.gpu_type = gpu_type
        self.max_workers = max_workers
        self.idle_timeout_minutes = idle_timeout_minutes
        self.head_cpus = head_cpus

    def start(self) -> None:
        tests = str(Path(__file__).resolve().parent)
        self.env = {**self.env, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
                    "PYTHONPATH": os.pathsep.join(filter(None, [tests, self.env.get("PYTHONPATH")]))}
        super().start()

    def _head_args(self) -> list[str]:
        import ray._private.services
        import yaml

        self.gcs_address = f"{ray._private.services.get_node_ip_address()}:{self.gcs_port}"
        config_file = self.base / "autoscaling.yaml"
        config_file.write_text(yaml.safe_dump(self._autoscaling_config()))
        return [f"--autoscaling-config={config_file}"]

    def _autoscaling_config(self) -> dict:
        return {
            "cluster_name": "cnsbench-fake",
            "max_workers": self.max_workers,
            "provider": {"type": "external", "module": PROVIDER_MODULE, "gcs_address": self.gcs_address,
                         "use_node_id_as_ip": True, "disable_node_updaters": True,
                         "disable_launch_config_check": True},
            "available_node_types": {
                "ray.head.default": {"resources": {"CPU": self.head_cpus}, "node_config": {}, "max_workers": 0},
                "gpu": {"resources": dict(self.gpu_type), "node_config": {}, "min_workers": 0,
                        "max_workers": self.max_workers},
            },
            "head_node_type": "ray.head.default",
            "auth": {}, "upscaling_speed": 1.0, "idle_timeout_minutes": self.idle_timeout_minutes,
            "docker": {}, "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
            "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
            "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
            "rsync_exclude": [], "rsync_filter": [],
        }

    def gpu_nodes(self) -> list:
        """The alive nodes that have a GPU."""
        return [n for n in self.alive_nodes() if float((n.resources_total or {}).get("GPU", 0)) > 0]

    def kill_gpu_node(self) -> str:
        """SIGKILL every process of one GPU node (as a spot reclaim does); returns its node id."""
        node = self.gpu_nodes()[0]
        marker = f"RAY_OVERRIDE_NODE_ID_FOR_TESTING={node.node_id}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if marker in environ.split(b"\0"):
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return node.node_id
