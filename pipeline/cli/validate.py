"""``cnsbench validate``: check a config: its plan, the registry keys it names and the files it needs."""

from __future__ import annotations

import argparse

from pipeline.cli.options import add_set_argument, load_cli_config

VALIDATE_SHOWN = 40  # problem lines `validate` prints (a paper-size build misses thousands of sliders)


def run(args: argparse.Namespace) -> int:
    from pipeline import plan
    from pipeline.assets import (
        check_registry_keys,
        missing_assets,
        remote_weights_not_cached,
    )
    from pipeline.config import config_hash

    cfg = load_cli_config(args)
    summary = plan.summarize(cfg)
    print(f"config {args.config}: valid (hash {config_hash(cfg)[:12]})")
    for line in summary.lines():
        print(f"  {line}")
    print(f"  classifiers: {', '.join(c.name for c in cfg.classifiers)}")
    print(f"  protocol: {cfg.protocol} (see docs/protocol.md)")
    problems = check_registry_keys(cfg) + missing_assets(cfg)
    remote = remote_weights_not_cached(cfg)
    if remote:
        print(f"  weights fetched on first use, not in this machine's caches ({len(remote)}):")
        for line in remote:
            print(f"    {line}")
    if problems:
        # Bad input, as for `build`: the config names things that do not exist.
        print(f"{len(problems)} problem(s):")
        for p in problems[:VALIDATE_SHOWN]:
            print(f"  - {p}")
        if len(problems) > VALIDATE_SHOWN:
            print(f"  ... and {len(problems) - VALIDATE_SHOWN} more")
        return 2
    print("  all assets present")
    return 0


def register(sub) -> None:
    s = sub.add_parser("validate", help="check a config and print its plan and missing assets")
    s.add_argument("config")
    add_set_argument(s)
    s.set_defaults(func=run)
