"""``cnsbench`` command: evaluate classifiers on existing images (a published layout, a collection, a build output)."""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.cli.options import add_set_argument, load_cli_config
from pipeline.config import (
    BuildConfig,
    ConfigError,
    deep_merge,
    parse_config,
    resolved_dict,
)
from pipeline.config.overrides import apply_overrides
from pipeline.evaluate import effective_config, evaluate
from pipeline.sources import SOURCE_KINDS, open_source


def run_cli(args: argparse.Namespace) -> int:
    """``cnsbench evaluate``: exit 0, 3 when trajectories failed; bad input raises (the CLI maps it to 2)."""
    overrides = None
    if args.filter_thresholds:  # a `cnsbench calibrate-filter` result
        from pipeline.models.calibrate import threshold_overrides

        overrides = threshold_overrides(args.filter_thresholds)
    if args.config:
        cfg = load_cli_config(args, overrides)
    else:
        cfg = output_config(args.source)
        if cfg is None:
            raise ConfigError("evaluate: pass --config CONFIG (it supplies the classifiers, filter and resources)")
        if overrides or args.sets:
            raw = apply_overrides(deep_merge(resolved_dict(cfg), overrides or {}), args.sets)
            cfg = parse_config(raw, source=f"{args.source}/config.json")
    names = [n.strip() for n in args.classifiers.split(",") if n.strip()] if args.classifiers else None
    source = open_source(
        args.source,
        cfg.benchmark.label_space,
        kind=args.source_kind,
        label_map=args.label_map,
        follow_symlinks=args.follow_symlinks,
    )
    eff = effective_config(cfg, source, use_filter=args.filter, classifiers=names)
    summary = evaluate(eff, source, args.output, runner=args.runner, address=args.address)
    for line in summary.lines():
        print(f"[cnsbench] {line}")
    if summary.report:
        print(f"[cnsbench] {counted_line(args.output, args.filter)}")
    return 0 if not summary.trajectories_failed else 3


def counted_line(output: str, filtered: bool) -> str:
    """Which trajectories the report's metrics count, and why (a build's report may count fewer)."""
    from pipeline.api.output import open_output

    counts = open_output(output).metrics().get("counts", {})
    why = ("the filter's keep decisions as it ran here" if filtered
           else "without --filter every image is kept, so every trajectory with all its scales counts")
    return (f"metrics count {counts.get('n_trajectories_complete')} of {counts.get('n_trajectories_total')} "
            f"trajectories: the complete ones (every scale present and kept; {why})")



def register(subparsers: Any) -> None:
    """Register ``cnsbench evaluate`` on an argparse ``subparsers`` object (``func(args) -> int``)."""
    s = subparsers.add_parser(
        "evaluate",
        help="run the classifiers (and optionally the OOC filter) over existing images",
        description="Evaluate existing images: the published CNS-Bench layout (annotations_cns.json), "
        "a WebDataset / build output, or class folders. Output and report as for `build`; "
        "running it again on the same --output resumes.",
    )
    s.add_argument("source", help="directory or URI of the images (or an annotations_cns.json file)")
    s.add_argument("--config", help="config supplying classifiers, filter, resources (default: a build output's own)")
    add_set_argument(s)
    s.add_argument("--output", required=True, help="output directory or URI")
    s.add_argument("--filter", action="store_true", help="also run the OOC filter (default: keep every image)")
    s.add_argument("--classifiers", help="comma-separated classifier names of the config (default: all)")
    s.add_argument("--source-kind", choices=SOURCE_KINDS, help="skip auto-detection of the source layout")
    s.add_argument("--label-map", help="class folders: JSON file {folder name: class id}")
    s.add_argument(
        "--follow-symlinks", action="store_true", help="read images through symlinks that lead outside the source"
    )
    s.add_argument("--filter-thresholds", metavar="YAML", help="merge a `cnsbench calibrate-filter` result")
    s.add_argument("--runner", choices=("ray", "local"), default="ray", help="'local' runs in-process, no Ray")
    s.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    s.set_defaults(func=run_cli)


def output_config(location: str) -> BuildConfig | None:
    """The config a build output was made with, so ``evaluate BUILD_OUTPUT`` needs no --config."""
    from pipeline.aggregate.run import load_output_config
    from pipeline.io.store import OutputStore

    store = OutputStore(location)
    return load_output_config(store) if store.exists("config.json") else None
