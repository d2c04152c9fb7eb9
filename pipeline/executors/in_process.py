"""In-process executor: the same stage classes, chained in one Python process.

Used by tests and benchmarks that must not pay Ray's start-up, and as the reference the
Ray executor's outputs are compared with.  Rows go through in chunks of the first stage's
batch size; the last stage (the writer) receives one shard of trajectories at a time.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import pyarrow as pa

from pipeline.executors.base import Executor, RunOptions, stage_threads
from pipeline.executors.chain import Chain


class InProcessExecutor(Executor):
    name = "in_process"

    def execute(self, rows: Iterable[dict], output: str, chain: Chain, options: RunOptions) -> Iterator[dict]:
        cfg = self.cfg
        *work, last = chain
        # Each stage computes with its own thread count, as its Ray actors do (same pixels).
        stages = [spec.stage(cfg, output, threads=stage_threads(spec.resources or getattr(cfg.resources, spec.stage.name)),
                             **spec.kwargs) for spec in work]
        writer = last.stage(cfg, output, **last.kwargs)
        _, per_shard = last.resolved(cfg)
        chunk_size = work[0].resolved(cfg)[1] if work else per_shard
        pending: list[pa.Table] = []
        n_pending = 0

        def flush() -> Iterator[dict]:
            nonlocal pending, n_pending
            if not pending:
                return
            table = pa.concat_tables(pending)
            pending, n_pending = [], 0
            for lo in range(0, table.num_rows, per_shard):
                for row in writer(table.slice(lo, per_shard)).to_pylist():
                    if options.on_shard:
                        options.on_shard(row)
                    yield row

        def step(chunk: list[dict]) -> Iterator[dict]:
            nonlocal n_pending
            table = pa.Table.from_pylist(chunk, schema=options.first_schema)
            for stage in stages:
                table = stage(table)
            pending.append(table)
            n_pending += table.num_rows
            if n_pending >= per_shard:
                yield from flush()

        chunk: list[dict] = []
        for row in rows:
            chunk.append(row)
            if len(chunk) >= chunk_size:
                yield from step(chunk)
                chunk = []
        if chunk:
            yield from step(chunk)
        yield from flush()
