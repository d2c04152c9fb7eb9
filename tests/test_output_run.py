"""An output's run: its steps in order, carried by its types, and the Chain it hands an executor."""

from __future__ import annotations

import pytest

from pipeline.cli import TINY_CONFIG
from pipeline.config import load_config
from pipeline.executors import Chain, StageSpec, get_executor
from pipeline.output_run import OutputRun, Running, StoreRun


def test_only_the_started_run_runs_chains_adds_classifiers_and_finishes():
    for step in ("run_chain", "add_classifiers", "finish", "commit_kwargs"):
        assert not hasattr(OutputRun, step), step
        assert callable(getattr(Running, step)), step
    assert callable(StoreRun.run_chain) and not hasattr(StoreRun, "finish") and not hasattr(StoreRun, "start")
    assert issubclass(Running, StoreRun) and not issubclass(OutputRun, StoreRun)


def test_start_before_prepare_is_refused_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    with OutputRun.claim(str(out), "test", lambda m: None, runner="local") as run:
        with pytest.raises(RuntimeError, match=r"start\(\) before prepare\(\)"):
            run.start(1, 0)
    assert not (out / "config.json").exists()


def test_an_executor_runs_a_chain_and_nothing_else(tmp_path):
    from pipeline.stages.write import WriteStage

    cfg = load_config(TINY_CONFIG)
    executor = get_executor("local", cfg)
    with pytest.raises(TypeError, match="an executor runs a pipeline.executors.chain.Chain, not list"):
        executor.run([{"x": 1}], str(tmp_path), [StageSpec(WriteStage)])
    chain = Chain(cfg, [StageSpec(WriteStage)])
    assert isinstance(chain[:1], Chain) and chain[:1].specs == chain.specs  # a slice is a chain of the same config
