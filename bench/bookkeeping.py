"""Bookkeeping at scale: plan and resume-diff a 1,008,000-sample build with half of it done.

1000 classes x 14 shifts x 12 seeds x 6 scales.  Half of the trajectories are committed
as real shard manifests (64 trajectories per shard, with a small stand-in tar and stand-in
``samples``/``predictions`` Parquet tables of null rows, as many as the manifest says) in a
temporary output; the benchmark then times what a resumed build does before any model
loads: read and verify every manifest (file sizes, and each table's Parquet footer:
schema and row count), and plan the remaining work units.  ``sizes_only_baseline_s`` is
the same manifests read and size-checked without the footers, timed in the same run (the
check as it was before tables were read).

    python bench/bookkeeping.py --json

Prints wall times and the process's peak RSS (the whole Python process, imports included).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--shifts", type=int, default=14)
    p.add_argument("--seeds", type=int, default=12)
    p.add_argument("--per-shard", type=int, default=64)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline import plan

    from pipeline.plan import schema
    from pipeline.output_run import committed_trajectories
    from pipeline.config import BenchmarkSpec
    from pipeline.io.store import OutputStore, ShardManifest
    from pipeline.stages.write import shard_name

    spec = BenchmarkSpec(
        classes=list(range(args.classes)),
        seeds=list(range(1, args.seeds + 1)),
        shifts=[f"shift_{i:02d}" for i in range(args.shifts)],
    )
    summary = plan.summarize(spec)
    all_traj = [plan.trajectory_id(s, c, seed) for c, seed, s in plan.iter_trajectories(spec)]
    done_ids = all_traj[::2]  # half of them, spread over every class and seed

    tables: dict[tuple[str, int], bytes] = {}

    def table_bytes(kind: str, sch: pa.Schema, rows: int) -> bytes:
        if (kind, rows) not in tables:
            buf = io.BytesIO()
            pq.write_table(pa.table({f.name: pa.nulls(rows, f.type) for f in sch}, schema=sch), buf)
            tables[kind, rows] = buf.getvalue()
        return tables[kind, rows]

    with tempfile.TemporaryDirectory() as tmp:
        store = OutputStore(tmp)
        t0 = time.perf_counter()
        for lo in range(0, len(done_ids), args.per_shard):
            chunk = done_ids[lo : lo + args.per_shard]
            name = shard_name(chunk)
            n = len(chunk) * 6
            files = {f"images/{name}.tar": store.write_bytes(f"images/{name}.tar", b"x" * 16)}
            for kind, sch in (("samples", schema.SAMPLES), ("predictions", schema.PREDICTIONS)):
                files[f"{kind}/{name}.parquet"] = store.write_bytes(f"{kind}/{name}.parquet", table_bytes(kind, sch, n))
            store.commit_manifest(ShardManifest(name, chunk, files, len(chunk) * 6, {}, {}))
        setup_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        units_full = plan.plan_units(spec)
        plan_s = time.perf_counter() - t0

        t0 = time.perf_counter()  # the baseline: manifests read, file sizes checked, no tables read
        sized = [m for m in store.scan().manifests if not store.verify_shard(m)]
        sizes_only_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        done, failed = committed_trajectories(store, repair=False)
        read_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        units = plan.plan_units(spec, done)
        diff_s = time.perf_counter() - t0
        todo = sum(len(u.shifts) for u in units)

    assert len(done) == len(done_ids) == sum(len(m.trajectories) for m in sized)
    assert todo == len(all_traj) - len(done_ids)
    result = {
        "samples": summary.n_images,
        "trajectories": summary.n_trajectories,
        "trajectories_done": len(done),
        "trajectories_todo": todo,
        "units_todo": len(units),
        "units_full": len(units_full),
        "manifests": -(-len(done_ids) // args.per_shard),
        "plan_s": round(plan_s, 3),
        "read_verify_manifests_s": round(read_s, 3),
        "sizes_only_baseline_s": round(sizes_only_s, 3),
        "resume_diff_s": round(diff_s, 3),
        "total_s": round(plan_s + read_s + diff_s, 3),
        "setup_s_not_counted": round(setup_s, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k:>26}: {v}" for k, v in result.items()))
    return result


if __name__ == "__main__":
    main()
