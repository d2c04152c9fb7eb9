"""A build on an autoscaling cluster: GPU nodes started from zero under the GPU budget, a
reclaimed node survived, nodes given back, requests no node type offers refused, two builds'
budgets added and a killed driver's request expired.

The cluster is Ray's fake multi-node provider (``tests/raycluster.py`` ``AutoscalingCluster``:
``ray start --head --autoscaling-config`` in its own PID namespace, ``RAY_FAKE_CLUSTER=1``):
a head with 2 CPUs and no GPU, and a GPU node type (min 0, max 3, idle timeout 15 s) whose
nodes are processes of the head's autoscaler.  The tiny models run on the CPU of a node that
declares a GPU.  One cluster serves every test of this module; none runs ``ray stop``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml
from buildproc import HAS_UNSHARE, assert_same_as_full, env_with, light, snapshot, tiny_config
from raycluster import AutoscalingCluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAS_UNSHARE, reason="needs `unshare -p -f --mount-proc` to run the head in its own "
                       "PID namespace"),
]

GIB = 2**30
GPU_TYPE = {"CPU": 2, "GPU": 1, "memory": 3 * GIB}
BUILD_TIMEOUT = 480
GROWTH_TIMEOUT = 420
SCALE_DOWN_S = 150
GPU_SETS = ["--set", "resources.generate.num_gpus=1", "--set", "resources.classify.num_gpus=0.5"]


@pytest.fixture(scope="module")
def fake_cluster():
    base = Path(tempfile.mkdtemp(prefix="cnsa-", dir="/tmp"))
    c = AutoscalingCluster(base, GPU_TYPE, max_workers=3, idle_timeout_minutes=0.25)
    try:
        c.start()
        yield c
    finally:
        left = c.stop()
        shutil.rmtree(base, ignore_errors=True)
        assert not left, f"processes of the test cluster outlived it: {left}"


def _env(c: AutoscalingCluster) -> dict[str, str]:
    env = {k: v for k, v in env_with().items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    return {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(c.token_file)}


def _build(c: AutoscalingCluster, cfg: Path, out: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pipeline.cli", "build", str(cfg), "--output", str(out), "--address", c.gcs_address,
           *GPU_SETS, *extra]
    return subprocess.Popen(cmd, env={**_env(c), **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


class Watch(threading.Thread):
    """Samples the cluster every second: GPU nodes, and alive generate actors."""

    def __init__(self, c: AutoscalingCluster) -> None:
        super().__init__(daemon=True)
        self.c, self.stop_ = c, threading.Event()
        self.gpu_nodes: list[int] = []
        self.generate_actors: list[int] = []

    def run(self) -> None:
        from ray.util.state.common import ListApiOptions, StateResource

        while not self.stop_.is_set():
            try:
                self.gpu_nodes.append(len(self.c.gpu_nodes()))
                actors = self.c._state().list(StateResource.ACTORS, options=ListApiOptions(
                    filters=[("state", "=", "ALIVE")], detail=True), raise_on_missing_output=False)
                self.generate_actors.append(sum("GenerateStage" in (a.class_name or "") for a in actors))
            except Exception:  # noqa: BLE001 - the state API is busy: sample again
                pass
            self.stop_.wait(1.0)


@contextlib.contextmanager
def autoscaling_config(c: AutoscalingCluster, mutate):
    """The cluster's autoscaling config changed by ``mutate(raw)`` for a while (the autoscaler
    reads its config file again at every update)."""
    config = c.base / "autoscaling.yaml"
    original = config.read_text()
    raw = yaml.safe_load(original)
    mutate(raw)
    config.write_text(yaml.safe_dump(raw))
    try:
        yield
    finally:
        config.write_text(original)


def idle_timeout(c: AutoscalingCluster, minutes: float):
    """The GPU nodes' idle timeout set to ``minutes`` for a while."""
    return autoscaling_config(c, lambda raw: raw.update(idle_timeout_minutes=minutes))


def _wait_scaled_down(c: AutoscalingCluster) -> float:
    t0 = time.monotonic()
    while c.gpu_nodes():
        assert time.monotonic() - t0 < SCALE_DOWN_S, "the GPU nodes were not released after the idle timeout"
        time.sleep(2)
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def light_cfg(tmp_path_factory) -> Path:
    return tiny_config(tmp_path_factory.mktemp("autoscale-cfg"), light)


def test_a_request_no_node_type_offers_is_refused(fake_cluster, light_cfg, tmp_path):
    """The GPU node type declares no memory: the pools' memory requests could never start one
    from zero.  Refused within 60 s, naming the stage, its request and the node types."""
    with autoscaling_config(fake_cluster, lambda raw: raw["available_node_types"]["gpu"]["resources"].pop("memory")):
        t0 = time.monotonic()
        proc = _build(fake_cluster, light_cfg, tmp_path / "out", "--max-gpus", "3")
        out, _ = proc.communicate(timeout=120)
        seconds = time.monotonic() - t0
    assert proc.returncode == 2, out[-3000:]
    assert seconds < 60, seconds
    assert "generate: one actor asks for 1 CPU, 1 GPU" in out and "GiB memory" in out, out[-3000:]
    assert "node type gpu: 2 CPU, 1 GPU, no memory declared" in out, out[-3000:]
    assert "Traceback" not in out
    assert not fake_cluster.gpu_nodes()


def _grow_then_reclaim(c: AutoscalingCluster, proc: subprocess.Popen, watch: Watch, faults: Path):
    """Hold the build until its generate pool has 2 actors, kill a GPU node, release; wait for the end."""
    deadline = time.monotonic() + GROWTH_TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline and max(watch.generate_actors, default=0) < 2:
        time.sleep(1)
    grown = max(watch.generate_actors, default=0) >= 2
    killed = c.kill_gpu_node() if grown and proc.poll() is None else None  # while the batches are held
    (faults / "release").touch()
    out, _ = proc.communicate(timeout=BUILD_TIMEOUT)
    return grown, killed, out


def test_build_from_zero_gpu_nodes_grows_survives_a_reclaimed_node_and_gives_nodes_back(
    fake_cluster, light_cfg, tiny_reference, tmp_path
):
    """One build from 0 GPU nodes under --max-gpus 3: the generate pool (started at its share, two
    actors waiting for their nodes) reaches two live actors on the nodes the autoscaler starts;
    then a GPU node's processes are killed (a spot reclaim), the autoscaler replaces it, and the
    build finishes equal to an uninterrupted one (nothing lost, nothing duplicated); the nodes are
    given back after the idle timeout.

    The tiny models generate a unit in a second or two, before a second GPU node is up: every
    generation batch is held (fault injection's ``hold``) until the pool has two live actors, so
    that the pool's use of the new nodes is what is tested, not the race.  On a quiet 2-core
    machine that is about 40 s after the build's start; the wait allows ten times that for a busy
    one.  While the build runs the nodes' idle timeout is 90 s, as a cloud's is longer than an
    actor's start-up: with this cluster's 15 s, a busy machine released the node the pool was to
    grow onto while the pool's first actor was still starting (deploy/README.md, "The request up
    front")."""
    assert not fake_cluster.gpu_nodes()
    faults = tmp_path / "faults"
    faults.mkdir()
    out_dir = tmp_path / "out"
    watch = Watch(fake_cluster)
    watch.start()
    proc = _build(fake_cluster, light_cfg, out_dir, "--max-gpus", "3",
                  env={"CNSBENCH_FAULT_INJECT": "generate:start:*:hold", "CNSBENCH_FAULT_DIR": str(faults)})
    killed = None
    try:
        with idle_timeout(fake_cluster, 1.5):
            grown, killed, out = _grow_then_reclaim(fake_cluster, proc, watch, faults)
    finally:
        watch.stop_.set()
        watch.join()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    assert "GPU budget 3: generate 1-2 actors, classify 1-1 actors" in out, out[-3000:]
    assert max(watch.gpu_nodes) >= 2, watch.gpu_nodes
    assert grown, (f"the generate pool did not reach 2 actors within {GROWTH_TIMEOUT} s: GPU nodes "
                   f"{watch.gpu_nodes}, generate actors {watch.generate_actors}")
    assert killed, "the build ended before a GPU node could be reclaimed"
    snap = snapshot(out_dir)
    assert snap["samples"]["sample_id"].is_unique
    assert_same_as_full(snap, snapshot(tiny_reference))
    _wait_scaled_down(fake_cluster)
    assert os.environ.get("RAY_ADDRESS") is None


def test_bench_autoscale_smallest(fake_cluster, capsys):
    """bench/autoscale.py at its smallest size, on this module's cluster (the stand-in build from
    0 GPU nodes; no second run, no fixed cluster)."""
    import importlib.util

    bench = Path(__file__).resolve().parents[1] / "bench" / "autoscale.py"
    spec = importlib.util.spec_from_file_location("bench_autoscale", bench)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _wait_scaled_down(fake_cluster)
    out = module.main(["--max-gpus", "2", "--classes", "1", "--seeds", "2", "--shifts", "2", "--classifiers", "2",
                       "--skip-paced", "--skip-fixed", "--json"], cluster=fake_cluster)
    printed = capsys.readouterr().out
    assert json.loads(printed[printed.index("{"):]) == out
    assert out["images"] == 24 and out["gpu_nodes_max"] >= 1 and out["generate_actors_max"] >= 1
    assert out["scaled_down_s"] is not None and 0 < out["gpu_busy_share"] <= 1.0


# --------------------------------------------------------------------------- the request up front
EXPIRY_S = 10  # the up-front request's expiry in these tests (CNSBENCH_GPU_REQUEST_EXPIRY_S)
COORDINATOR_TICK_S = 20  # Ray Data's coordinator drops expired requests at its tick
IDLE_S = 15  # this cluster's idle timeout
BUSY_MARGIN_S = 60  # the autoscaler's updates and node shutdowns on a busy 2-core machine
RELEASE_BOUND_S = EXPIRY_S + COORDINATOR_TICK_S + IDLE_S + BUSY_MARGIN_S
HOLDER = Path(__file__).resolve().parent / "request_holder.py"


def _gpu_max_workers(n: int):
    def mutate(raw: dict) -> None:
        raw["available_node_types"]["gpu"]["max_workers"] = n
    return mutate


def _released_within(c: AutoscalingCluster, bound: float) -> float:
    """Seconds until the cluster has no GPU node, failing past ``bound``."""
    t0 = time.monotonic()
    while c.gpu_nodes():
        seconds = time.monotonic() - t0
        assert seconds < bound, f"GPU nodes still up {seconds:.0f} s after the driver was killed"
        time.sleep(1)
    return time.monotonic() - t0


def _wait_gpu_nodes(c: AutoscalingCluster, n: int, *procs: subprocess.Popen) -> None:
    deadline = time.monotonic() + GROWTH_TIMEOUT
    while len(c.gpu_nodes()) < n:
        assert all(p.poll() is None for p in procs), "a driver ended before the GPU nodes were up"
        assert time.monotonic() < deadline, f"fewer than {n} GPU node(s) after {GROWTH_TIMEOUT} s"
        time.sleep(1)


def _holder(c: AutoscalingCluster, output: Path, gpus: int, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HOLDER), "hold", c.gcs_address, str(output), str(gpus)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_builds_add_their_budgets_and_a_killed_driver_stops_holding_the_nodes(fake_cluster, light_cfg, tmp_path):
    """Two drivers at once (case B9): a build under --max-gpus 2 (1.5 GPUs asked for up front) and
    a driver holding another output's one-GPU request, as the build's executor asks.  The
    coordinator holds both budgets, each under its output's requester id (one id for every build
    replaced the first budget by the second).  Both drivers SIGKILLed once a GPU node is up: the
    nodes are back to 0 within the request's expiry, the coordinator's tick and the idle timeout
    (the request lasted seven days before).  The GPU type may start one node here, so neither
    budget is ever all up and neither request handed over: each lasts while its driver renews it."""
    from pipeline.executors.ray_private import requester_id

    _wait_scaled_down(fake_cluster)  # after the tests before it
    faults = tmp_path / "faults"
    faults.mkdir()
    expiry = {"CNSBENCH_GPU_REQUEST_EXPIRY_S": str(EXPIRY_S)}
    with autoscaling_config(fake_cluster, _gpu_max_workers(1)):
        build = _build(fake_cluster, light_cfg, tmp_path / "out", "--max-gpus", "2",
                       env={**expiry, "CNSBENCH_FAULT_INJECT": "generate:start:*:hold", "CNSBENCH_FAULT_DIR": str(faults)})
        holder = _holder(fake_cluster, tmp_path / "other", 1, {**_env(fake_cluster), **expiry})
        try:
            line = holder.stdout.readline()
            assert line.strip() == "held", line + (holder.stdout.read() if holder.poll() is not None else "")
            shown = subprocess.run([sys.executable, str(HOLDER), "show", fake_cluster.gcs_address, "2.5"],
                                   env=_env(fake_cluster), capture_output=True, text=True, timeout=GROWTH_TIMEOUT)
            held = json.loads(shown.stdout.strip().splitlines()[-1])
            if build.poll() is not None:  # the build ended before asking: say why
                raise AssertionError(f"{shown}: the build exited {build.returncode}: {build.stdout.read()[-3000:]}")
            assert held == {requester_id(str(tmp_path / "out")): 1.5, requester_id(str(tmp_path / "other")): 1.0}, shown
            _wait_gpu_nodes(fake_cluster, 1, build, holder)
        finally:
            for proc in (build, holder):
                proc.kill()
            out, _ = build.communicate(timeout=60)
            holder.communicate(timeout=60)
        assert build.returncode == -9, out[-3000:]
        assert "GPU budget 2: generate 1-1 actors, classify 1-1 actors" in out, out[-3000:]
        seconds = _released_within(fake_cluster, RELEASE_BOUND_S)
    print(f"GPU nodes back to 0 {seconds:.0f} s after the drivers were killed")
