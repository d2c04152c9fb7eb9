"""``cnsbench refine``: bisect classifiers' failure points below a build's grid (docs/refine.md)."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from pipeline.api import commands

    summary = commands.refine(args.classifier, args.output, rounds=args.rounds, runner=args.runner, address=args.address)
    print(f"[cnsbench] table: {summary.table}")
    if summary.build is not None and summary.build.report:
        print(f"[cnsbench] report: {summary.build.report}")
    return 0 if not summary.failed else 3  # as a build with failed trajectories


def register(sub) -> None:
    s = sub.add_parser("refine", help="bisect classifiers' failure points below the build's grid")
    s.add_argument("output", help="a build output (directory or URI)")
    s.add_argument("--classifier", required=True, metavar="NAME",
                   help="one of the output's classifiers, a comma list of them, or 'all': refined together, "
                        "each point made once")
    s.add_argument("--rounds", type=int, default=None,
                   help="bisection rounds, 1..8 (default: refine.rounds of the output's config, 3)")
    s.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    s.add_argument("--runner", choices=("ray", "local"), default="ray", help="'local' runs in-process, no Ray")
    s.set_defaults(func=run)
