"""The GPU budget's split, the pools' placement on a cluster, the chain's memory, the cluster's
address, and the adapter of Ray's internals (pipeline/perf/budget.py, pipeline/executors/)."""

from __future__ import annotations

import socket

import pytest

from pipeline.cli import TINY_CONFIG, main
from pipeline.config import load_config
from pipeline.executors import cluster, ray_private
from pipeline.executors.placement import Ask, Unplaceable, check_actors, fit_fixed
from pipeline.perf.budget import GpuPool, split

GIB = 1024**3


# --------------------------------------------------------------------------- the split
def test_split_follows_gpu_time_within_the_budget():
    # The paper's shape: generate about 85 % of the GPU time, filter and two classify groups the rest.
    pools = [GpuPool("generate", 1.0, 1, 85.0, 100), GpuPool("filter", 0.25, 1, 5.0),
             GpuPool("classify group 1 of 2", 0.5, 1, 6.0), GpuPool("classify group 2 of 2", 0.5, 1, 4.0)]
    ranges = {r.name: r for r in split(8, pools)}
    assert [ranges[n].min_size for n in ranges] == [1, 1, 1, 1]
    assert ranges["generate"].max_size == 6  # 8 - 0.25 - 2 x 0.5 = 6.75 left for whole actors
    assert ranges["filter"].max_size == 2 and ranges["classify group 1 of 2"].max_size == 1
    assert sum(r.gpus for r in ranges.values()) <= 8
    assert ranges["generate"].share == pytest.approx(8 * 0.85)
    # More budget than the plan can use: generate stops at one actor per work unit.
    assert {r.name: r.max_size for r in split(64, pools)}["generate"] == 54
    assert {r.name: r.max_size for r in split(64, [GpuPool("generate", 1.0, 1, 85.0, 12)])}["generate"] == 12


def test_split_keeps_pool_size_under_a_small_budget():
    ranges = split(1, [GpuPool("generate", 1.0, 2, 9.0), GpuPool("classify", 0.5, 1, 1.0)])
    assert [(r.min_size, r.max_size) for r in ranges] == [(2, 2), (1, 1)]


def test_validate_and_estimate_print_the_same_split(capsys):
    assert main(["validate", str(TINY_CONFIG), "--set", "resources.generate.num_gpus=1",
                 "--set", "resources.classify.num_gpus=0.5", "--set", "resources.max_gpus=3"]) == 0
    out = capsys.readouterr().out
    assert "GPU budget 3" in out
    lines = {line.split()[0]: line for line in out.splitlines()[out.splitlines().index(
        next(line for line in out.splitlines() if "GPU budget 3" in line)) + 1:][:2]}
    from pipeline.perf.estimate import config_split

    cfg = load_config(TINY_CONFIG, sets=["resources.generate.num_gpus=1", "resources.classify.num_gpus=0.5"])
    for r in config_split(cfg, 3):
        assert f"{r.min_size}-{r.max_size} actors" in lines[r.name.split()[0]]
    gen = {r.name: r for r in config_split(cfg, 3)}["generate"]
    assert gen.max_size == 2  # 3 GPUs: classify holds 0.5 of them, generate the other two


# --------------------------------------------------------------------------- placement
def test_fixed_cluster_pools_are_scaled_to_start_together():
    # The demo's pools on a 2-CPU cluster whose job driver holds one CPU: 2.25 CPUs asked for, 1 free.
    asks = [Ask("generate", 1.0, 0, GIB), Ask("filter", 0.5, 0, GIB), Ask("classify", 0.5, 0, GIB),
            Ask("write", 0.25, 0, GIB // 4)]
    fit = fit_fixed(asks, [{"CPU": 1.0, "memory": 16.0 * GIB}])
    assert sum(a.cpu for a in fit.asks) <= 1.0
    assert fit.asks[0].cpu == pytest.approx(2 * fit.asks[1].cpu, rel=1e-3)
    assert [a.memory for a in fit.asks] == [a.memory for a in asks]  # memory was not what was short
    assert "2.25 CPUs" in fit.notes[0]
    assert fit_fixed(asks, [{"CPU": 4.0, "memory": 16.0 * GIB}]).notes == []  # fits as asked
    with pytest.raises(Unplaceable, match="cannot all start at once") as err:
        fit_fixed([Ask("generate", 1.0, 1.0, 0), Ask("filter", 0.5, 0.5, 0, actors=2)], [{"CPU": 8.0, "GPU": 1.0}])
    assert "filter: 2 actor(s) of 0.5 CPU, 0.5 GPU" in str(err.value)


def test_requests_no_node_type_offers_are_refused_naming_stage_request_and_offers():
    offers = {"node type head": {"CPU": 2.0, "memory": 8.0 * GIB}, "node type gpu": {"CPU": 2.0, "GPU": 1.0}}
    with pytest.raises(Unplaceable) as err:  # the GPU type declares no memory: none from zero
        check_actors([Ask("generate", 1.0, 1.0, GIB), Ask("write", 0.25, 0, GIB)], offers, "node type or node")
    text = str(err.value)
    assert "generate: one actor asks for 1 CPU, 1 GPU, 1.0 GiB memory" in text
    assert "write" not in text.split("node types")[0].split("\n", 1)[1]  # the head holds the writer
    assert "gpu: 2 CPU, 1 GPU, no memory declared" in text and "declare each node type's memory" in text
    with pytest.raises(Unplaceable, match="with GPU nodes"):
        check_actors([Ask("classify", 0.5, 0.5, 0)], {"node 1234": {"CPU": 2.0, "memory": GIB}}, "node")
    check_actors([Ask("generate", 1.0, 1.0, GIB)], {"node type gpu": {"CPU": 2.0, "GPU": 1.0, "memory": 2.0 * GIB}},
                 "node type")


# --------------------------------------------------------------------------- chain and Ray
def test_evaluation_pools_declare_their_memory(ray_session, tmp_path):
    """An evaluation's chain is a Chain: its filter, classify and write pools ask Ray for their
    projected memory (read back from the Ray Data operators' ray_remote_args)."""
    from pipeline.evaluate import _stages
    from pipeline.executors.base import RunOptions
    from pipeline.executors.chain import Chain
    from pipeline.executors.pools import Sized
    from pipeline.executors.ray_data import RayDataExecutor
    from pipeline.perf.memory import actor_host_bytes

    cfg = load_config(TINY_CONFIG)
    chain = _stages(cfg, {})
    assert isinstance(chain, Chain)
    sized = [Sized(p, p.resources, p.memory()) for p in chain.pools]
    ds = RayDataExecutor(cfg).dataset([{"x": 1}], str(tmp_path), sized, RunOptions())
    ops, op = [], ds._logical_plan.dag
    while op is not None:
        ops.append(op)
        op = op.input_dependencies[0] if op.input_dependencies else None
    declared = {getattr(o, "name", ""): (getattr(o, "ray_remote_args", None) or {}).get("memory") for o in ops}
    assert declared["MapBatches(ClassifyStage)"] == actor_host_bytes(cfg, "classify") > 0
    assert declared["MapBatches(FilterStage)"] == actor_host_bytes(cfg, "filter") > 0
    assert declared["MapBatches(WriteStage)"] == actor_host_bytes(cfg, "write") > 0
    assert declared["MapBatches(LoadStage)"] is None  # not projected: asks for none


def test_exact_blocks_sets_what_ray_data_does_not_take(ray_session):
    """The private access of ray_private.exact_blocks: fails here when Ray changes it."""
    import ray

    ds = ray_private.exact_blocks(ray.data.range(10), 4, tasks=3)
    op = ds._logical_plan.dag
    assert op.ray_remote_args["num_cpus"] == 0
    assert isinstance(op.compute, ray.data.TaskPoolStrategy) and op.compute.size == 3
    assert sorted(len(b["id"]) for b in ds.iter_batches(batch_size=None)) == [2, 4, 4]
    assert ray_private.node_types() is None  # a local Ray: no autoscaler
    assert ray_private.free_per_node()


def test_a_command_without_address_starts_its_own_ray(monkeypatch, tmp_path):
    """Ray's bootstrap file (left by `ray start`, running or gone) is never connected to without
    --address; --address auto refuses a stale one naming the file."""
    import ray

    from pipeline.executors.ray_data import init_ray

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "ray").mkdir()
    stale = socket.socket()
    stale.bind(("127.0.0.1", 0))
    port = stale.getsockname()[1]
    stale.close()  # nothing listens there any more
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}")
    calls: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    notes: list[str] = []
    init_ray(None, None, notes.append)
    assert calls[-1]["address"] == "local" and not notes
    with pytest.raises(ValueError, match="not running") as err:
        init_ray("auto", None, notes.append)
    assert str(tmp_path / "ray" / "ray_current_cluster") in str(err.value)
    with socket.socket() as live:  # a cluster that answers: one line naming it and --address auto
        live.bind(("127.0.0.1", 0))
        live.listen()
        address = f"127.0.0.1:{live.getsockname()[1]}"
        (tmp_path / "ray" / "ray_current_cluster").write_text(address)
        init_ray(None, None, notes.append)
        assert calls[-1]["address"] == "local"
        assert len(notes) == 1 and address in notes[0] and "--address auto" in notes[0]
        init_ray("auto", None, notes.append)
        assert calls[-1]["address"] == "auto"
    (tmp_path / "ray" / "ray_current_cluster").unlink()
    with pytest.raises(ValueError, match="does not exist"):
        cluster.check_auto()


def test_estimate_uses_the_split_and_counts_ramp_and_idle_tail():
    from pipeline.perf.estimate import IDLE_TIMEOUT_MIN, NODE_START_S, config_split, estimate

    cfg = load_config(TINY_CONFIG, sets=["resources.generate.num_gpus=1", "resources.classify.num_gpus=0.5"])
    est = estimate(cfg, "h100", 3, price_per_hour=2.0)
    assert [(r.name, r.min_size, r.max_size) for r, _ in est.pools] == [
        (r.name, r.min_size, r.max_size) for r in config_split(cfg, 3)]
    assert est.ramp_s == NODE_START_S and est.idle_tail_s == IDLE_TIMEOUT_MIN * 60
    assert est.wall_seconds == pytest.approx(est.ramp_s + est.startup_s + est.work_seconds)
    assert est.cost == pytest.approx((est.wall_seconds + est.idle_tail_s) / 3600 * 3 * 2.0)
    text = "\n".join(est.lines())
    assert "ramp" in text and "idle tail" in text and "1-2" in text


def test_a_cluster_without_gpus_at_start_is_told_about_max_gpus():
    from pipeline.build import build_chain
    from pipeline.executors.cluster import ClusterView
    from pipeline.executors.pools import gpu_budget

    cfg = load_config(TINY_CONFIG, sets=["resources.generate.num_gpus=1"])
    chain = build_chain(cfg)
    nodes = {"head": {"CPU": 4.0, "memory": 8.0 * GIB}}
    notes: list[str] = []
    assert gpu_budget(chain, ClusterView(False, nodes, nodes, None), notes.append) is None
    assert len(notes) == 1 and "no GPU at start" in notes[0] and "--max-gpus" in notes[0]
    with_gpus = {"head": {"CPU": 4.0, "GPU": 2.0}}
    assert gpu_budget(chain, ClusterView(False, with_gpus, with_gpus, None), notes.append) == 2.0
    assert gpu_budget(chain, ClusterView(True, with_gpus, with_gpus, None), notes.append) is None  # a local Ray
    budgeted = build_chain(load_config(TINY_CONFIG, sets=["resources.generate.num_gpus=1", "resources.max_gpus=5"]))
    assert gpu_budget(budgeted, ClusterView(False, nodes, nodes, None), notes.append) == 5.0 and len(notes) == 1


def test_gpu_pools_start_at_their_share_where_its_gpus_are_there_or_asked_for(monkeypatch):
    """Ray Data grows a pool about one step per ten seconds as its queue fills; where the budget's
    GPUs are asked for up front (an autoscaling cluster) or already there (a fixed cluster that
    holds it), each GPU pool starts at its maximum instead.  A budget larger than a fixed
    cluster's GPUs leaves the pools at pool_size, growing as Ray Data sees fit."""
    from pipeline.build import build_chain
    from pipeline.executors import pools
    from pipeline.executors.cluster import ClusterView
    from pipeline.executors.pools import Sized, first_gpus, size_pools

    cfg = load_config(TINY_CONFIG, sets=["resources.generate.num_gpus=1", "resources.classify.num_gpus=0.5",
                                         "resources.max_gpus=4"])
    chain = build_chain(cfg)
    sized = [Sized(p, p.resources, GIB) for p in chain.pools]
    head = {"head": {"CPU": 8.0, "memory": 64.0 * GIB}}
    gpu_type = ray_private.NodeType("gpu", {"CPU": 8.0, "GPU": 1.0, "memory": 32.0 * GIB}, 0, 4)
    notes: list[str] = []

    def starts(view) -> dict[str, tuple[int, int, int]]:
        return {s.pool.name: (s.min_size, s.initial_size, s.max_size)
                for s in size_pools(chain, sized, view, notes.append) if s.resources.num_gpus > 0}

    autoscaling = starts(ClusterView(False, head, head, [gpu_type]))
    assert autoscaling["generate"][0] == 1 and autoscaling["generate"][1] == autoscaling["generate"][2] > 1
    assert all(initial == top for _, initial, top in autoscaling.values())
    assert notes[-1].endswith("each GPU pool starts at its maximum")
    monkeypatch.setenv(pools.UPFRONT_ENV, "0")  # no request up front: the pools grow as nodes join
    assert all(initial == low for low, initial, _ in starts(ClusterView(False, head, head, [gpu_type])).values())
    monkeypatch.delenv(pools.UPFRONT_ENV)
    four = {"head": {"CPU": 8.0, "memory": 64.0 * GIB}, "gpus": {"CPU": 16.0, "GPU": 4.0, "memory": 64.0 * GIB}}
    fixed = starts(ClusterView(False, four, four, None))
    assert fixed == autoscaling
    two = {"head": {"CPU": 8.0, "memory": 64.0 * GIB}, "gpus": {"CPU": 16.0, "GPU": 2.0, "memory": 64.0 * GIB}}
    short = starts(ClusterView(False, two, two, None))  # the budget (4) is more than the cluster has (2)
    assert all(initial == low for low, initial, _ in short.values()) and short["generate"][2] > 1
    held = size_pools(chain, sized, ClusterView(False, four, four, None), notes.append)
    assert first_gpus(held) == sum(s.max_size * s.resources.num_gpus for s in held if s.resources.num_gpus > 0)


# --------------------------------------------------------------------------- the request up front
@pytest.fixture
def coordinator_calls(monkeypatch):
    """Ray Data's coordinator replaced by one that records each call; the cluster's GPUs (up,
    used) read from the returned state; ``polled`` set at each read."""
    import threading

    import ray

    calls: list[tuple] = []
    state = {"up": 0.0, "used": 0.0, "polled": threading.Event()}

    class Method:
        def __init__(self, name):
            self.name = name

        def remote(self, *args, **kwargs):
            calls.append((self.name, args, kwargs))

    class Coordinator:
        request_resources, cancel_request = Method("request"), Method("cancel")

    def gpus():
        state["polled"].set()
        return state["up"], state["used"]

    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref)
    monkeypatch.setattr(ray_private, "autoscaling_coordinator", lambda: Coordinator())
    monkeypatch.setattr(ray_private, "gpus_up_and_used", gpus)
    monkeypatch.delenv(ray_private.REQUEST_EXPIRY_ENV, raising=False)
    return calls, state


def test_the_request_up_front_is_withdrawn_once_the_first_actors_hold_their_gpus(coordinator_calls):
    """Withdrawn when the nodes are up *and* the pools' first actors are placed: withdrawn as soon
    as the nodes were up, a node the pools had not grown onto yet was idle and could be released
    before they did.  Withdrawn in any case when the run ends."""
    import threading

    calls, state = coordinator_calls
    polled = state["polled"]

    def wait_polls(n=3):
        for _ in range(n):
            polled.clear()
            assert polled.wait(5)

    bundles = [{"CPU": 1, "GPU": 1.0}, {"CPU": 1, "GPU": 1.0}, {"CPU": 1, "GPU": 0.5}]
    with ray_private.budget_request(bundles, first_gpus=1.5, poll_s=0.01, requester="cnsbench-x"):
        assert [c[0] for c in calls] == ["request"] and calls[0][2] == {
            "requester_id": "cnsbench-x", "resources": bundles, "expire_after_s": ray_private.REQUEST_EXPIRY_S}
        state["up"] = 3.0  # every node up, no actor placed yet: still asked for
        wait_polls()
        assert [c[0] for c in calls] == ["request"]
        state["used"] = 1.0  # one of the two first actors placed
        wait_polls()
        assert [c[0] for c in calls] == ["request"]
        state["used"] = 1.5  # both: handed over to the pools
        for _ in range(500):
            if len(calls) > 1:
                break
            threading.Event().wait(0.01)
        assert [c[0] for c in calls] == ["request", "cancel"] and calls[1][1] == ("cnsbench-x",)
    assert [c[0] for c in calls][-1] == "cancel"  # and once more at the end (harmless)

    calls.clear()
    state.update(up=0.0, used=0.0)
    with pytest.raises(RuntimeError):
        with ray_private.budget_request(bundles, first_gpus=1.5, poll_s=0.01, requester="cnsbench-x"):
            raise RuntimeError("the run failed")
    assert [c[0] for c in calls] == ["request", "cancel"]  # withdrawn with the failure


def test_the_request_is_the_outputs_own_and_expires_unless_renewed(monkeypatch):
    """Each output asks under its own requester id, so two builds on one cluster add their budgets;
    the request expires unless its driver renews it (every quarter of the expiry), so a killed
    driver's request ends by itself.  Checked on Ray Data's own coordinator class, in process."""
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        _AutoscalingCoordinatorActor,
    )

    a, b = ray_private.requester_id("s3://bucket/a"), ray_private.requester_id("/data/b")
    assert a != b and a == ray_private.requester_id("s3://bucket/a") and a.startswith("cnsbench-")

    clock, sent = [1000.0], []
    coord = _AutoscalingCoordinatorActor(get_current_time=lambda: clock[0],
                                         send_resources_request=lambda bundles, label_selectors=None: sent.append(bundles),
                                         get_cluster_nodes=lambda: [])
    one, two = [{"CPU": 1.0, "GPU": 1.0}], [{"CPU": 1.0, "GPU": 0.5}] * 2
    coord.request_resources(requester_id=a, resources=one, expire_after_s=60)
    coord.request_resources(requester_id=b, resources=two, expire_after_s=60)
    assert sent[-1] == one + two  # both budgets, not the last one alone
    clock[0] += 45
    coord.request_resources(requester_id=a, resources=one, expire_after_s=60)  # a's driver renews, b's is gone
    clock[0] += 30
    coord._tick()
    assert sent[-1] == one  # b's request expired at the coordinator's next tick
    clock[0] += 61
    coord._tick()
    assert sent[-1] == []


def test_the_running_driver_renews_its_request(coordinator_calls, monkeypatch):
    """Renewed by the driver's watcher thread with the same bundles, requester and expiry while
    the nodes are not yet up (a 5 s expiry: every 1.25 s)."""
    import threading

    calls, _ = coordinator_calls
    monkeypatch.setenv(ray_private.REQUEST_EXPIRY_ENV, "5")
    bundles = [{"CPU": 1, "GPU": 1.0}]
    with ray_private.budget_request(bundles, first_gpus=1.0, poll_s=0.05, requester="cnsbench-y"):
        for _ in range(200):
            if len(calls) > 1:
                break
            threading.Event().wait(0.05)
    assert [c[0] for c in calls] == ["request", "request", "cancel"]
    assert calls[0][2] == calls[1][2] == {"requester_id": "cnsbench-y", "resources": bundles, "expire_after_s": 5.0}


def test_the_request_is_renewed_each_quarter_of_its_expiry_and_withdrawn_on_hand_over():
    h = ray_private.Handover(wanted=2.0, first_gpus=1.0, expiry_s=60.0, started=0.0, renewed=0.0)
    assert h.renew_every == 15.0
    assert [h.step(t, 0.0, 0.0) for t in (5.0, 14.0, 15.0, 20.0, 30.0)] == [None, None, "renew", None, "renew"]
    assert h.step(31.0, None, None) is None  # the head did not answer: nothing known, nothing withdrawn
    assert h.step(45.0, None, None) == "renew"  # renewed all the same while this driver runs
    assert h.step(46.0, 2.0, 0.5) is None  # the nodes are up, the first actors not yet placed
    assert h.step(47.0, 2.0, 1.0) == "withdraw"
    late = ray_private.Handover(wanted=2.0, first_gpus=1.0, expiry_s=60.0, started=0.0, renewed=0.0)
    assert late.step(ray_private.HANDOVER_TIMEOUT_S + 1, 0.0, 0.0) == "withdraw"  # the cloud never met it
    unplaced = ray_private.Handover(wanted=2.0, first_gpus=1.0, expiry_s=60.0, started=0.0, renewed=0.0)
    unplaced.step(10.0, 2.0, 0.0)
    assert unplaced.step(10.0 + ray_private.FIRST_ACTORS_WAIT_S + 1, 2.0, 0.0) == "withdraw"


@pytest.mark.parametrize("raw", ["abc", "0", "4", "301", "nan", "inf", "-10"])
def test_a_bad_request_expiry_is_refused_naming_the_variable(monkeypatch, raw):
    from pipeline.errors import CnsbenchError

    monkeypatch.setenv(ray_private.REQUEST_EXPIRY_ENV, raw)
    with pytest.raises(CnsbenchError, match=f"{ray_private.REQUEST_EXPIRY_ENV}={raw!r}.*from 5 to 300"):
        ray_private.request_expiry_s()


def test_the_request_expiry_defaults_to_three_minutes_and_may_be_shorter(monkeypatch):
    monkeypatch.delenv(ray_private.REQUEST_EXPIRY_ENV, raising=False)
    assert ray_private.request_expiry_s() == 180.0
    monkeypatch.setenv(ray_private.REQUEST_EXPIRY_ENV, " 12.5 ")
    assert ray_private.request_expiry_s() == 12.5


# --------------------------------------------------------------------------- a local Ray refuses as a cluster does
class _Generate:
    name = "generate"


def _generate_chain(cfg, gpus: float, memory: int):
    from pipeline.executors import StageSpec
    from pipeline.executors.chain import Chain

    res = cfg.resources.generate.model_copy(update={"num_gpus": gpus, "num_cpus": 1.0})
    return Chain(cfg, [StageSpec(_Generate, resources=res, batch_size=1, memory=lambda: memory)])


def test_a_local_ray_checks_each_actor_against_the_machine():
    """A local Ray shares its GPUs and memory among the pools, but one actor that asks for more
    than the machine has is refused first, with a cluster's message; without a GPU only the
    memory counts (the GPU stages run on the CPU)."""
    from pipeline.executors.cluster import ClusterView
    from pipeline.executors.pools import check_local_actors

    cfg = load_config(TINY_CONFIG)
    machine = {"a1b2c3d4e5f6": {"CPU": 4.0, "GPU": 1.0, "memory": 8.0 * GIB}}
    local = ClusterView(True, machine, machine, None)
    check_local_actors(_generate_chain(cfg, 1.0, 6 * GIB), local, cpu_only=False)  # fits: nothing said
    with pytest.raises(Unplaceable) as err:
        check_local_actors(_generate_chain(cfg, 1.0, 161 * GIB), local, cpu_only=False)
    assert str(err.value).splitlines()[:3] == [
        "1 actor pool(s) ask for more than any node offers, so Ray would wait for them forever:",
        "  generate: one actor asks for 1 CPU, 1 GPU, 161.0 GiB memory",
        "  nodes: node a1b2c3d4: 4 CPU, 1 GPU, 8.0 GiB memory"]
    with pytest.raises(Unplaceable, match="generate: one actor asks for 1 CPU, 2 GPU, 1.0 GiB memory"):
        check_local_actors(_generate_chain(cfg, 2.0, GIB), local, cpu_only=False)
    check_local_actors(_generate_chain(cfg, 2.0, GIB), local, cpu_only=True)  # on the CPU: no GPU asked
    with pytest.raises(Unplaceable, match="generate: one actor asks for 1 CPU, 161.0 GiB memory"):
        check_local_actors(_generate_chain(cfg, 1.0, 161 * GIB), local, cpu_only=True)
    check_local_actors(_generate_chain(cfg, 2.0, 161 * GIB), ClusterView(False, machine, machine, None), False)


def test_a_build_on_the_local_ray_refuses_an_actor_larger_than_the_machine(ray_session, tmp_path):
    """The Ray executor on a local Ray (the session's: one GPU) refuses before it starts a pool."""
    import ray

    from pipeline.executors.base import RunOptions
    from pipeline.executors.ray_data import RayDataExecutor

    cfg = load_config(TINY_CONFIG)
    have = max(float(n["Resources"].get("memory", 0)) for n in ray.nodes() if n["Alive"])
    for chain, asked in ((_generate_chain(cfg, 1.0, int(2 * have)), f"{2 * have / GIB:.1f} GiB memory"),
                         (_generate_chain(cfg, 2.0, GIB), "2 GPU")):
        with pytest.raises(Unplaceable, match=f"generate: one actor asks for .*{asked}"):
            next(RayDataExecutor(cfg, notice=print).execute([{"x": 1}], str(tmp_path), chain, RunOptions()))


def test_a_full_disk_on_the_ray_runner_is_the_stages_own_error(ray_session, tmp_path, capfd):
    """A stage's StorageError (a full disk) reaches the command as the stage raised it, so the
    command prints the one line the local runner prints, not Ray's wrapped error and traceback;
    a bug keeps Ray's error, with the actor's traceback."""
    import errno

    from pipeline.executors import StageSpec
    from pipeline.executors.base import RunOptions
    from pipeline.executors.chain import Chain
    from pipeline.executors.ray_data import RayDataExecutor
    from pipeline.io.retry import StorageError

    class FullDisk:  # defined here: pickled by value for the actor
        name, exact_batches, keeps_attempts = "write", False, False

        def __init__(self, config, output, threads, bug=False):
            self.output, self.bug = output, bug

        def __call__(self, batch):
            if self.bug:
                raise KeyError("a bug")
            raise StorageError(errno.ENOSPC, f"no space left on the device writing {self.output}/x: free space")

    cfg = load_config(TINY_CONFIG)
    res = cfg.resources.write.model_copy(update={"num_gpus": 0.0, "num_cpus": 0.5})

    def run(**kwargs):
        chain = Chain(cfg, [StageSpec(FullDisk, kwargs, resources=res, batch_size=1, memory=lambda: None)])
        return list(RayDataExecutor(cfg, notice=print).execute([{"x": 1}], str(tmp_path), chain, RunOptions()))

    with pytest.raises(StorageError) as err:
        run()
    assert type(err.value) is StorageError and err.value.errno == errno.ENOSPC
    assert err.value.strerror == f"no space left on the device writing {tmp_path}/x: free space"
    shown = capfd.readouterr().err
    assert "Traceback" not in shown and "Exception occurred" not in shown, shown[-2000:]
    import ray.exceptions

    with pytest.raises(ray.exceptions.RayTaskError, match="a bug"):
        run(bug=True)
