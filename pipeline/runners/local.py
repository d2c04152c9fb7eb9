"""In-process executor: the same stage classes, chained in one Python process.

Used by tests and benchmarks that must not pay Ray's start-up, and as the reference the
Ray runner's outputs are compared with.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Sequence

import pyarrow as pa

from pipeline import schema
from pipeline.config import BuildConfig
from pipeline.plan import WorkUnit
from pipeline.stages.classify import ClassifyStage
from pipeline.stages.filter import FilterStage
from pipeline.stages.generate import GenerateStage
from pipeline.stages.write import WriteStage


def run_local(
    cfg: BuildConfig, units: list[WorkUnit], output: str, on_shard: Callable[[dict], None] | None = None
) -> Iterator[dict]:
    """Run generate -> filter -> classify -> write for ``units``; yields one dict per written shard."""
    stages = [(GenerateStage, None, 1, {}), (FilterStage, None, 0, {}), (ClassifyStage, None, 0, {})]
    yield from run_local_rows(cfg, (u.to_row() for u in units), output, stages, on_shard)


def run_local_rows(
    cfg: BuildConfig,
    rows: Iterable[dict],
    output: str,
    stages: Sequence[tuple[type, Any, int, dict]],
    on_shard: Callable[[dict], None] | None = None,
) -> Iterator[dict]:
    """Like :func:`run_local`, but starting from ready rows instead of work units.

    ``stages``: ``(stage class, resources, batch size, extra constructor kwargs)`` in
    order (the resources are Ray's and unused here); the write stage is appended.  Rows
    go through in chunks of the first stage's batch size, and are written in shards of
    ``output.trajectories_per_shard`` trajectories.  Used by builds (unit rows) and by
    ``cnsbench evaluate`` (pointer rows -> load -> [filter ->] classify -> write).
    """
    chain = [cls(cfg, output, **extra) for cls, _, _, extra in stages]
    writer = WriteStage(cfg, output)
    per_shard = cfg.output.trajectories_per_shard
    chunk_size = max(1, stages[0][2]) if stages else per_shard
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
                if on_shard:
                    on_shard(row)
                yield row

    def run(chunk: list[dict]) -> Iterator[dict]:
        nonlocal n_pending
        table = pa.Table.from_pylist(chunk, schema=schema.UNIT if stages and stages[0][0] is GenerateStage else None)
        for stage in chain:
            table = stage(table)
        pending.append(table)
        n_pending += table.num_rows
        if n_pending >= per_shard:
            yield from flush()

    chunk: list[dict] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= chunk_size:
            yield from run(chunk)
            chunk = []
    if chunk:
        yield from run(chunk)
    yield from flush()
