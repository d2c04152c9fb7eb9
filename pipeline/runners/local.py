"""In-process executor: the same stage classes, chained in one Python process.

Used by tests and benchmarks that must not pay Ray's start-up, and as the reference the
Ray runner's outputs are compared with.
"""

from __future__ import annotations

from typing import Callable, Iterator

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
    gen, flt, clf = GenerateStage(cfg, output), FilterStage(cfg, output), ClassifyStage(cfg, output)
    writer = WriteStage(cfg, output)
    per_shard = cfg.output.trajectories_per_shard
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

    for unit in units:
        rows = gen(pa.Table.from_pylist([unit.to_row()], schema=schema.UNIT))
        rows = clf(flt(rows))
        pending.append(rows)
        n_pending += rows.num_rows
        if n_pending >= per_shard:
            yield from flush()
    yield from flush()
