"""``cnsbench`` command: the web app over an output on Ray Serve."""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.serve.launch import DEFAULT_HOST, DEFAULT_PORT, TOKEN_ENV, run_server


def _cmd_serve(args: "argparse.Namespace") -> int:
    run_server(args.config, args.output, host=args.host, port=args.port, token=args.token, blocking=True)
    return 0



def register(subparsers: Any) -> None:
    """Register ``cnsbench serve`` on the CLI's subparsers (``func(args) -> exit code``)."""
    s = subparsers.add_parser(
        "serve",
        help="web UI + API: browse a build (--output) and preview sliders live (--config)",
        description="Serve the cnsbench web page and JSON API with Ray Serve. Give --output to browse "
        "a built benchmark, --config to generate, filter and classify trajectories live, or both.",
    )
    s.add_argument("--output", help="build output directory or URI to browse")
    s.add_argument("--config", help="build config whose generator, filter and classifiers run the live preview")
    s.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}: this machine only)")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    s.add_argument(
        "--token",
        default=None,
        help=f"require 'Authorization: Bearer TOKEN' on the API (default: ${TOKEN_ENV}; prefer the env var, "
        "a command line is visible to other local users)",
    )
    s.set_defaults(func=_cmd_serve)
