"""``cnsbench demo``: build the shipped miniature world (or another family's world configuration)."""

from __future__ import annotations

import argparse
import sys

from pipeline.runtime.checkout import DEMO_CONFIG, REPO_ROOT
from pipeline.cli.options import add_set_argument, set_args


def run(args: argparse.Namespace) -> int:
    world = REPO_ROOT / "assets" / "world" / "world.json"
    if not world.is_file():
        print(
            f"error: the demo's trained world is missing ({world} not found); it ships with the "
            "repository -- restore it with `git checkout -- assets/world` or retrain it with "
            "`python -m pipeline.demo.train_world --output assets/world`",
            file=sys.stderr,
        )
        return 2
    config = DEMO_CONFIG
    if args.family:
        config = REPO_ROOT / "configs" / f"world_{args.family}.yaml"
        if not config.is_file():
            known = sorted(p.stem[len("world_"):] for p in config.parent.glob("world_*.yaml"))
            print(
                f"cnsbench demo: error: no world configuration for family {args.family!r} "
                f"({config} not found); known: {', '.join(known) or 'none'}",
                file=sys.stderr,
            )
            return 2
    from pipeline.cli import main

    return main(["build", str(config), "--output", args.output, "--runner", args.runner, *set_args(args)])


def register(sub) -> None:
    s = sub.add_parser("demo", help="build configs/demo.yaml (the shipped miniature world) on a local Ray")
    s.add_argument("--output", default="runs/demo")
    s.add_argument("--runner", choices=("ray", "local"), default="ray")
    s.add_argument(
        "--family", metavar="NAME", help="build the world of another benchmark family (configs/world_NAME.yaml)"
    )
    add_set_argument(s)
    s.set_defaults(func=run)
