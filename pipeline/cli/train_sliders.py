"""``cnsbench`` command: train the (class, shift) concept sliders of a config into a slider store."""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.cli.options import add_set_argument, load_cli_config
from pipeline.config import ConfigError


def _cmd_train_sliders(args: argparse.Namespace) -> int:
    overrides = {"slider_training": {"iterations": args.iterations}} if args.iterations is not None else None
    cfg = load_cli_config(args, overrides)
    store = args.output or cfg.generator.slider_store
    if not store:
        raise ConfigError("no slider store: pass --output STORE or set generator.slider_store in the config")
    from pipeline.io.fs import check_writable_dir
    from pipeline.train.run import train_sliders  # torch and diffusers: only when the command runs
    from pipeline.train.sliders import LOG_PREFIX

    check_writable_dir(store, "slider store")  # a file or an unwritable place fails now, not per pair
    summary = train_sliders(cfg, store, address=args.address, runner=args.runner)
    for line in summary.lines():
        print(f"{LOG_PREFIX} {line}")
    return 0 if not summary.failed else 3


def register(subparsers: Any) -> None:
    """Register ``train-sliders CONFIG --output STORE [--address A] [--runner ray|local]
    [--iterations N]`` on an argparse ``subparsers`` object; sets ``func(args) -> int``."""
    p = subparsers.add_parser(
        "train-sliders",
        help="train the (class, shift) concept sliders of a config into a slider store",
        description="Train one LoRA concept slider per (class, shift) of the config's benchmark with the "
        "text-slider objective (slider_training section) and write them as generator.slider_pattern "
        "files plus a metadata JSON each. Pairs already done are skipped, so rerunning resumes.",
    )
    p.add_argument("config")
    add_set_argument(p)
    p.add_argument("--output", metavar="STORE", help="slider store directory or URI (default: generator.slider_store)")
    p.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    p.add_argument("--runner", choices=("ray", "local"), default="ray", help="'local' trains in-process, no Ray")
    p.add_argument("--iterations", type=int, metavar="N", help="override slider_training.iterations")
    p.set_defaults(func=_cmd_train_sliders)
