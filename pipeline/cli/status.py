"""``cnsbench status``: what an output holds: done/total per stage, failures, problems, the writer's lease."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from pipeline import plan
    from pipeline.aggregate.run import load_output_config
    from pipeline.build import committed_trajectories
    from pipeline.io.store import OutputStore

    store = OutputStore(args.output)
    cfg = load_output_config(store)
    done, failed = committed_trajectories(store, repair=False, deep=args.verify, echo=print)
    problems = store.scan().problems
    total = plan.summarize(cfg).n_trajectories
    n_scales = len(cfg.benchmark.scales)
    # Stages commit together per shard, so a committed trajectory has passed all three;
    # a failed one stopped at the stage its error names.
    failed_at = {s: sum(1 for e in failed.values() if e.startswith(f"[{s}]")) for s in ("generate", "filter", "classify")}
    from pipeline.io.lease import lease_status

    print(f"{store.uri}")
    print(f"  lease       {lease_status(store)}")
    reached = len(done)
    for stage, key in (("generated", "generate"), ("filtered", "filter"), ("classified", "classify")):
        note = f", {failed_at[key]} failed here" if failed_at[key] else ""
        print(f"  {stage:<11} {reached * n_scales}/{total * n_scales} images ({reached}/{total} trajectories{note})")
    aggregated = False
    if store.exists("report/metrics.json"):
        import json

        metrics = json.loads(store.read_text("report/metrics.json"))
        aggregated = metrics.get("counts", {}).get("n_trajectories_total") == len(done)
    print(f"  {'aggregated':<11} {'yes' if aggregated else 'no (run cnsbench aggregate)'}")
    if problems:
        print(f"  problems: {len(problems)} manifest(s) not counted (the next build moves them to previous/quarantine/ and redoes their shards)")
        for p in problems:
            print(f"    {p.line()}")
    if failed:
        print(f"  failed trajectories: {len(failed)}")
        for tid, err in sorted(failed.items()):
            print(f"    {tid}: {err.splitlines()[0] if err else ''}")
    return 0 if not (failed or problems) else 3


def register(sub) -> None:
    s = sub.add_parser("status", help="done/total per stage and failed items of a build output")
    s.add_argument("output")
    s.add_argument("--verify", action="store_true", help="also check every committed file's SHA-256")
    s.set_defaults(func=run)
