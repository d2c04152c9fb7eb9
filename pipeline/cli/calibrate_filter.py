"""``cnsbench`` command: the filter's thresholds from human labels."""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.io.files import write_text_atomic
from pipeline.models.calibrate import (
    DEFAULT_MAX_CANDIDATES,
    DEFAULT_MIN_PASS,
    DEFAULT_TARGET_TPR,
    calibrate,
    read_labels,
    thresholds_yaml,
)


def run_cli(args: argparse.Namespace) -> int:
    """``cnsbench calibrate-filter``; bad input raises CalibrationError (a ValueError: exit 2)."""
    scores, ooc = read_labels(args.labels)
    cal = calibrate(scores, ooc, args.target_tpr, args.min_pass, args.max_candidates)
    print(cal.table())
    text = thresholds_yaml(cal, args.labels)
    write_text_atomic(args.output, text)  # a half-written thresholds file must never be merged into a build
    print(f"wrote {args.output}; use it with: cnsbench build CONFIG --filter-thresholds {args.output}")
    return 0


def register(subparsers: Any) -> None:
    """Register ``cnsbench calibrate-filter`` (``func(args) -> int``)."""
    s = subparsers.add_parser(
        "calibrate-filter",
        help="choose OOC filter thresholds from human-labelled detector scores",
        description="Minimise the share of in-class images removed subject to removing at least "
        "--target-tpr of the OOC images; writes filter.thresholds/min_pass as YAML.",
    )
    s.add_argument("labels", help="Parquet or CSV with clip_text, clip_shift_text, clip_image, dino_image, ooc")
    s.add_argument("--output", required=True, help="YAML file to write (a partial config)")
    s.add_argument("--target-tpr", type=float, default=DEFAULT_TARGET_TPR, help="share of OOC images to remove")
    s.add_argument("--min-pass", type=int, default=DEFAULT_MIN_PASS, help="keep an image when this many detectors pass")
    s.add_argument("--max-candidates", type=int, default=DEFAULT_MAX_CANDIDATES, help="thresholds tried per detector")
    s.set_defaults(func=run_cli)
