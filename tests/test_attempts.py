"""Attempt bookkeeping (pipeline.runtime.faults): after max_retries + 1 tries that each killed the
worker, a stage gives its batch up as failed items; the writer, which cannot commit half a
shard, and the reclassify stage, which commits whole shards too, stop the run instead.  All
keep markers, so the Ray runner retries them without limit while an actor is only
unreachable (tests/test_cluster.py loses a node mid-write)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline.runtime import faults
from pipeline.runtime.checkout import TINY_CONFIG
from pipeline.config import load_config
from pipeline.io.store import OutputStore
from pipeline.stages.base import Stage
from pipeline.stages.reclassify import ReclassifyStage
from pipeline.stages.write import WriteStage, shard_name


class Passing(Stage):
    name = "classify"
    output_schema = pa.schema([("trajectory_id", pa.string()), ("error", pa.string()), ("scales", pa.list_(pa.float64())),
                               ("sample_ids", pa.list_(pa.string())), ("images", pa.list_(pa.binary()))])

    def process(self, rows):
        return [{**r, "error": None} for r in rows]


def batch(*ids: str) -> pa.Table:
    return pa.Table.from_pylist([{"trajectory_id": t, "error": None, "scales": [0.0], "sample_ids": [f"{t}_0"],
                                  "images": [b"x"]} for t in ids], schema=Passing.output_schema)


def crashed_before(out, stage: str, ids: list[str], times: int) -> None:
    """Markers of ``times`` earlier attempts at this batch, as crashed workers leave them."""
    attempts = faults.Attempts(OutputStore(str(out)), stage)
    for _ in range(times):
        attempts.record(faults.attempt_key(ids))


def test_a_batch_is_given_up_as_failed_items_after_max_retries_plus_one_attempts(tmp_path):
    cfg = load_config(TINY_CONFIG)
    assert cfg.resources.classify.max_retries == 2
    crashed_before(tmp_path, "classify", ["a", "b"], 2)
    assert Passing(cfg, output=str(tmp_path))(batch("a", "b")).column("error").to_pylist() == [None, None]  # third try
    crashed_before(tmp_path, "classify", ["c"], 3)
    rows = Passing(cfg, output=str(tmp_path))(batch("c")).to_pylist()
    assert rows[0]["error"] == "[classify] worker crashed 3 times while processing this batch"
    assert rows[0]["images"] == [] and rows[0]["sample_ids"] == []


def test_the_writer_stops_the_run_instead_of_committing_half_a_shard(tmp_path):
    cfg = load_config(TINY_CONFIG)
    assert WriteStage.keeps_attempts
    ids = ["heavy_snow/001/seed_0001", "heavy_snow/022/seed_0001"]
    crashed_before(tmp_path, "write", ids, 3)
    with pytest.raises(RuntimeError, match=f"crashed 3 times while writing {shard_name(ids)}.*redoes its trajectories"):
        WriteStage(cfg, output=str(tmp_path))(pa.Table.from_pylist([{"trajectory_id": t} for t in ids]))
    assert not OutputStore(str(tmp_path)).list("manifest")


def test_each_classifier_group_counts_the_tries_of_a_batch_itself(tmp_path):
    # Two classify stages (two classifier groups) see the same batches: a batch that crashed
    # the first group's worker once and then went through must get all its tries in the next.
    from pipeline.stages.classify import ClassifyStage

    cfg = load_config(TINY_CONFIG, sets=["resources.classify.memory_budget_gb=0.1"])
    names = [ClassifyStage(cfg, classifiers=g, done=d).attempts_name for g, d in (([0], []), ([1], [0]), ([2], [0, 1]))]
    assert names == ["classify-0", "classify-1", "classify-2"]
    assert ClassifyStage(load_config(TINY_CONFIG)).attempts_name == "classify"

    class SecondGroup(Passing):
        attempts_name = "classify-1"

    crashed_before(tmp_path, "classify-0", ["a"], 2)  # the first group: a crash, then the try that went through
    assert SecondGroup(cfg, output=str(tmp_path))(batch("a")).column("error").to_pylist() == [None]
    assert len(OutputStore(str(tmp_path)).list(f"attempts/classify-1/{faults.attempt_key(['a'])}")) == 1


def test_a_start_fault_fires_only_for_the_items_a_stage_processes(tmp_path, monkeypatch):
    monkeypatch.setenv(faults.ENV, "classify:start:c:raise")
    cfg = load_config(TINY_CONFIG)
    failed = batch("c", "d").to_pylist()
    failed[0]["error"] = "[generate] boom"
    out = Passing(cfg)(pa.Table.from_pylist(failed, schema=Passing.output_schema))  # c failed upstream: passed on
    assert out.column("trajectory_id").to_pylist() == ["c", "d"]
    with pytest.raises(RuntimeError, match="injected fault at classify:start"):
        Passing(cfg)(batch("c", "d"))


def retries_on_ray(stage, max_retries: int = 2) -> int:
    """The task retries the Ray runner gives a stage's actors (-1: without limit)."""
    from pipeline.config import StageResources
    from pipeline.executors.ray_data import _remote_args

    return _remote_args(StageResources(max_retries=max_retries), bookkept=stage.keeps_attempts)["max_task_retries"]


def test_every_build_stage_is_retried_without_limit_on_ray():
    from pipeline.build import build_chain

    chain = build_chain(load_config(TINY_CONFIG))
    assert [s.stage.name for s in chain] == ["generate", "filter", "classify", "write"]
    for spec in chain:
        assert retries_on_ray(spec.stage) == -1, spec.stage.name

    class Unkept(Passing):
        keeps_attempts = False

    assert retries_on_ray(Unkept, max_retries=2) == 3  # a stage without markers: a bounded budget


def test_reclassify_stops_the_run_on_a_shard_that_keeps_killing_its_worker(tmp_path):
    cfg = load_config(TINY_CONFIG)
    crashed_before(tmp_path, "reclassify", ["shard-0123456789abcdef"], 3)
    rows = pa.Table.from_pylist([{"shard": "shard-0123456789abcdef", "classifiers": ["tiny-vit"]}])
    with pytest.raises(RuntimeError, match="crashed 3 times while adding predictions to shard-0123456789abcdef"):
        ReclassifyStage(cfg, output=str(tmp_path))(rows)
    assert retries_on_ray(ReclassifyStage) == -1
