"""``cnsbench ls``: the registries: families, sources, mask providers, filters, classifiers, analyses, executors."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from pipeline.registry import ALL

    for title, reg in ALL.items():
        print(f"{title}:")
        for key, doc in reg.describe().items():
            print(f"  {key:<20} {doc}")
    return 0


def register(sub) -> None:
    s = sub.add_parser("ls", help="list the registries: families, sources, mask providers, filters, classifiers, analyses, executors")
    s.set_defaults(func=run)
