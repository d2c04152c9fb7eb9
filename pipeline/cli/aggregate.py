"""``cnsbench aggregate``: re-run an output's analyses and write its report."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from pipeline.aggregate.run import aggregate_output, load_output_config
    from pipeline.config import config_hash
    from pipeline.io.store import OutputStore

    store = OutputStore(args.output)
    cfg = load_output_config(store)
    report = aggregate_output(store, cfg, config_hash(cfg), echo=print)
    print(f"[cnsbench] report: {report}")
    return 0


def register(sub) -> None:
    s = sub.add_parser("aggregate", help="recompute the report of a build output")
    s.add_argument("output")
    s.set_defaults(func=run)
