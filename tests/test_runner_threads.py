"""Both runners compute each stage with the same torch thread count: its ``num_cpus``.

A CPU's float reductions depend on the thread count (the tiny sampler's images differ by one
level in a few pixels between 1 and 2 threads), so the in-process runner, which hosts every
stage in one process, sets each stage's own count before each of its batches, as a Ray
actor of that stage has it.
"""

from __future__ import annotations

import pyarrow as pa

from pipeline.stages.base import Stage

SCHEMA = pa.schema([("trajectory_id", pa.string()), ("threads", pa.list_(pa.int64()))])


class _Recording(Stage):
    output_schema = SCHEMA

    def process(self, rows):
        import torch

        return [{**r, "threads": [*(r["threads"] or []), torch.get_num_threads()]} for r in rows]


class _Generate(_Recording):
    name = "generate"


class _Classify(_Recording):
    name = "classify"


class _Write(Stage):
    name = "write"
    output_schema = SCHEMA
    uses_torch = False
    keeps_attempts = False

    def process(self, rows):
        return rows


def test_the_in_process_runner_gives_each_stage_its_own_threads(tmp_path):
    import torch

    from buildproc import tiny_config

    from pipeline.config import load_config
    from pipeline.executors import Chain, StageSpec
    from pipeline.executors.base import stage_threads
    from pipeline.executors.in_process import InProcessExecutor

    def mutate(raw):
        raw["resources"] = {"generate": {"num_cpus": 1, "batch_size": 2}, "classify": {"num_cpus": 2, "batch_size": 2}}

    cfg = load_config(tiny_config(tmp_path, mutate))
    assert (stage_threads(cfg.resources.generate), stage_threads(cfg.resources.classify)) == (1, 2)
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # what a process starts with on a bigger machine
    try:
        chain = Chain(cfg, [StageSpec(_Generate), StageSpec(_Classify), StageSpec(_Write, batch_size=2)])
        rows = [{"trajectory_id": f"t{i}", "threads": []} for i in range(4)]
        done = list(InProcessExecutor(cfg).run(rows, str(tmp_path / "out"), chain, first_schema=SCHEMA))
    finally:
        torch.set_num_threads(before)
    assert done == [{"trajectory_id": f"t{i}", "threads": [1, 2]} for i in range(4)]
