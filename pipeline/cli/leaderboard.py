"""``cnsbench leaderboard CARDS... --output DIR``: models x benchmarks from robustness cards."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from pipeline.api import commands

    commands.leaderboard(args.cards, output=args.output)  # it says where its page is
    return 0


def register(sub) -> None:
    s = sub.add_parser(
        "leaderboard", help="rank the models of several cards of one suite (leaderboard.csv, index.html)",
        description="Rank the models of cards made on the same suite, protocols and outputs per benchmark, with "
        "intervals, and correlate the benchmarks' rankings. Cards of another suite, protocol or output are refused.",
    )
    s.add_argument("cards", nargs="+", metavar="CARD", help="card folders (cnsbench card --output)")
    s.add_argument("--output", required=True,
                   help="folder of the leaderboard: a new or empty one, or an earlier leaderboard's")
    s.set_defaults(func=run)
