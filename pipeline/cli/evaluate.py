"""``cnsbench`` command: evaluate classifiers on existing images (a published layout, a collection, a build output)."""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.cli.options import add_set_argument
from pipeline.sources import SOURCE_KINDS


def run_cli(args: argparse.Namespace) -> int:
    """``cnsbench evaluate``: exit 0, 3 when trajectories failed; bad input raises (the CLI maps it to 2)."""
    from pipeline.api import evaluate as api

    summary = api.evaluate(
        args.classifiers, args.source, output=args.output, in_place=args.in_place, config=args.config,
        sets=args.sets, filter=args.filter, filter_thresholds=args.filter_thresholds,
        source_kind=args.source_kind, source_labels=args.label_map, follow_symlinks=args.follow_symlinks,
        runner=args.runner, address=args.address,
    )
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
           else "without --filter a built benchmark's own keep decisions, other images all kept")
    return (f"metrics count {counts.get('n_trajectories_complete')} of {counts.get('n_trajectories_total')} "
            f"trajectories: the complete ones (every scale present and kept; {why})")



def register(subparsers: Any) -> None:
    """Register ``cnsbench evaluate`` on an argparse ``subparsers`` object (``func(args) -> int``)."""
    s = subparsers.add_parser(
        "evaluate",
        help="run the classifiers (and optionally the OOC filter) over existing images",
        description="Evaluate existing images: a built benchmark, the published CNS-Bench layout "
        "(annotations_cns.json), WebDataset tars, or class folders. The source is only read: predictions and "
        "report go to --output (of a built benchmark: its own keep decisions, its images referred to, not "
        "copied). Running it again on the same --output resumes. The same as cnsbench.evaluate.",
    )
    s.add_argument("source", help="directory or URI of the images (or an annotations_cns.json file)")
    s.add_argument("--config", help="config supplying classifiers, filter, resources (default: a build output's own)")
    add_set_argument(s)
    s.add_argument("--output", required=True, help="output directory or URI (the source is only read)")
    s.add_argument("--in-place", action="store_true",
                   help="add the classifiers to the source itself (a built benchmark; --output names it too)")
    s.add_argument("--filter", action="store_true",
                   help="run the OOC filter again (default: a built benchmark's own keep decisions; other images all kept)")
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
