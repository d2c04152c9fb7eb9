"""The scale simulation's model of a GPU node (bench/scale_model.py), and the actor pools' memory
declared to Ray (the chain's projections; scaled to fit a local cluster, kept on a cluster)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.executors import Chain, StageSpec
from pipeline.runtime.checkout import REPO_ROOT, TINY_CONFIG

sys.path.append(str(REPO_ROOT / "bench"))  # after the root: bench/pipeline.py must not shadow the package

import scale_model  # noqa: E402

GIB = 1024**3
# CPU seconds per image of the real stages' CPU work (of the order bench/scale.py measures here).
CPU = {"encode": 0.013, "decode": 0.0017, "filter_preprocess": 0.0065, "classifier_preprocess": [0.00036] * 35}


def test_sixteen_gpus_hold_the_most_generators_the_other_pools_keep_up_with():
    cfg = load_config(REPO_ROOT / "configs" / "cns_bench.yaml", sets=["resources.classify.num_gpus=0.25"])
    groups = [a.members for a in scale_model.actors(cfg, "h100") if a.stage == "classify"]
    assert sorted(i for g in groups for i in g) == list(range(35)) and len(groups) >= 2
    seconds = scale_model.per_image(cfg, "h100", CPU, groups)
    layout = scale_model.pool_layout(16, seconds)
    gpus = sum(p["actors"] * p["gpu_share"] for p in layout.values())
    assert gpus <= 16 and layout["generate"]["gpu_share"] == 1.0
    gen_rate = layout["generate"]["actors"] / sum(seconds["generate"])
    for key, (gpu, cpu) in seconds.items():
        if key != "generate":  # every other pool keeps up with the generators, with the margin
            assert layout[key]["actors"] / (gpu / 0.25 + cpu) >= gen_rate * scale_model.MARGIN * 0.999
    # One more generator would leave a pool behind: the layout is the most the GPUs hold.
    bound = scale_model.bound(16, layout, seconds, units=1000, images_per_unit=84)
    assert 0.85 < bound <= 1.0


def test_one_gpu_is_shared_by_every_pool():
    seconds = {"generate": (1.0, 0.0), "filter": (0.1, 0.0), "classify:0": (0.1, 0.0)}
    layout = scale_model.pool_layout(1, seconds)
    assert sum(p["gpu_share"] for p in layout.values()) == pytest.approx(1.0)


def test_the_chain_carries_each_actors_projected_memory():
    from pipeline.build import build_chain
    from pipeline.perf.memory import actor_host_bytes, project_stage_memory

    cfg = load_config(TINY_CONFIG)
    chain = build_chain(cfg)
    assert [s.stage.name for s in chain] == ["generate", "filter", "classify", "write"]
    projected = project_stage_memory(cfg, "cpu")
    for pool in chain.pools:  # the figure is the chain's own: no spec states one
        assert pool.spec.memory is None
        assert pool.memory() == (projected[pool.stage] if pool.stage != "classify" else actor_host_bytes(cfg, "classify"))
    assert chain.pools[-1].memory() < chain.pools[0].memory()  # the writer holds no model




def test_memory_requests_fit_a_local_cluster_and_stand_on_a_cluster(monkeypatch):
    import ray

    from pipeline.executors.ray_data import RayDataExecutor

    cfg = load_config(TINY_CONFIG)
    chain = Chain(cfg, [StageSpec(type("GenerateStage", (), {"name": "generate"}), memory=lambda: 8 * GIB),
                        StageSpec(type("FilterStage", (), {"name": "filter"}), memory=lambda: 4 * GIB),
                        StageSpec(type("WriteStage", (), {"name": "write"}), memory=None)], project_memory=False)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"memory": 6.0 * GIB, "CPU": 4.0})
    notices: list[str] = []
    local = RayDataExecutor(cfg, None, notices.append)
    assert local._memory_requests(chain, cpu_only=True) == [None, None, None]  # one CPU machine: nothing to place
    scaled = local._memory_requests(chain, cpu_only=False)
    assert scaled[2] is None and sum(scaled[:2]) <= 6 * GIB and scaled[0] == 2 * scaled[1]
    assert notices and "scaled" in notices[0]
    cluster = RayDataExecutor(cfg, "127.0.0.1:6379")
    assert cluster._memory_requests(chain, cpu_only=False) == [8 * GIB, 4 * GIB, None]
