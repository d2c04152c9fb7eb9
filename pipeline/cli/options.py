"""Arguments shared by the commands that take a config: ``--set key.path=value``.

Every such command calls :func:`add_set_argument` on its parser and loads its config
with :func:`load_cli_config`, so overrides are parsed, merged and validated in one place
(:mod:`pipeline.config.overrides`) and a bad key or value exits 2 naming it.
"""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.config import BuildConfig, ConfigError

SET_HELP = (
    "override a config value before validation (repeatable; the value is YAML), "
    "e.g. --set generator.steps=3 --set benchmark.classes=[2] --set classifiers[0].name=x"
)


def add_set_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY.PATH=VALUE", help=SET_HELP)


def add_max_gpus_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-gpus", type=_max_gpus, default=None, metavar="N",
        help="GPU budget (resources.max_gpus): the GPU pools range from pool_size to their share of N GPUs, "
        "split by projected GPU time; on an autoscaling cluster all N are requested up front and the pools "
        "start at their share",
    )


def _max_gpus(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 100_000:
        raise argparse.ArgumentTypeError(f"a whole number of GPUs, 1 to 100,000, not {text!r}")
    return n


def add_max_gpus(args: argparse.Namespace) -> None:
    """``--max-gpus N`` as the ``--set resources.max_gpus=N`` it stands for; refused with
    ``--runner local``, which has no actor pools for a budget to size."""
    if getattr(args, "max_gpus", None) is not None and getattr(args, "runner", None) == "local":
        raise ConfigError("--max-gpus does not apply with --runner local: the GPU budget sizes Ray's actor pools, and "
                          "the local runner runs every stage in this one process (leave --max-gpus out, or use "
                          "--runner ray)")
    if getattr(args, "max_gpus", None) is not None:
        args.sets = [*(getattr(args, "sets", None) or []), f"resources.max_gpus={args.max_gpus}"]


def set_args(args: argparse.Namespace) -> list[str]:
    """The ``--set`` items given to a command (to pass on to another command line)."""
    return [f"--set={item}" for item in getattr(args, "sets", None) or []]


def load_cli_config(args: argparse.Namespace, overrides: dict[str, Any] | None = None) -> BuildConfig:
    """``args.config`` with ``overrides`` (a partial config) and the command's ``--set`` items;
    generated assets it points at (``configs/tiny.yaml``'s) are made on first use."""
    from pipeline.api.common import load_config_file

    return load_config_file(args.config, getattr(args, "sets", None), overrides)
