"""``cnsbench build``: build (or resume) a benchmark into an output."""

from __future__ import annotations

import argparse

from pipeline.cli.options import add_max_gpus, add_max_gpus_argument, add_set_argument


def run(args: argparse.Namespace) -> int:
    from pipeline.api import commands

    add_max_gpus(args)
    summary = commands.build(
        args.config, args.output, sets=args.sets, filter_thresholds=getattr(args, "filter_thresholds", None),
        address=args.address, runner=args.runner, new_version=args.new_version, verify=args.verify,
    )
    for line in summary.lines():
        print(f"[cnsbench] {line}")
    return 0 if not summary.trajectories_failed else 3


def register(sub) -> None:
    s = sub.add_parser("build", help="build (or resume) a benchmark")
    s.add_argument("config")
    add_set_argument(s)
    s.add_argument("--output", help="directory or URI (default: output.path of the config)")
    s.add_argument("--address", help="Ray cluster address, or auto: the cluster `ray start` runs on this host "
                   "(default: start a local Ray of its own)")
    add_max_gpus_argument(s)
    s.add_argument("--runner", choices=("ray", "local"), default="ray", help="'local' runs in-process, no Ray")
    s.add_argument("--new-version", action="store_true", help="archive an incompatible existing build and start anew")
    s.add_argument("--verify", action="store_true", help="check the SHA-256 of every committed file, not only sizes")
    s.add_argument(
        "--filter-thresholds", metavar="YAML", help="merge filter.thresholds/min_pass from `cnsbench calibrate-filter`"
    )
    s.set_defaults(func=run)
