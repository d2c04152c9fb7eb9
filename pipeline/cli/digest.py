"""``cnsbench digest OUTPUT [OTHER]``: the content digest of an output, or whether two outputs hold the same."""

from __future__ import annotations

import argparse
import json

from pipeline.errors import CnsbenchError

PARTS = ("samples", "predictions", "images")


def digest_of(location: str) -> dict[str, str]:
    """:func:`pipeline.io.digest.output_digest` of a committed output (ValueError when it holds none)."""
    from pipeline.io.digest import output_digest
    from pipeline.io.store import OutputStore

    store = OutputStore(location)
    if not store.exists(""):
        raise CnsbenchError(f"{location}: not found")
    if next(iter(store.manifests()), None) is None:
        raise CnsbenchError(f"{location}: no committed shards (not a cnsbench output, or nothing committed yet)")
    return output_digest(location)


def run(args: argparse.Namespace) -> int:
    first = digest_of(args.output)
    if args.other is None:
        print(json.dumps(first))
        return 0
    second = digest_of(args.other)
    differ = [p for p in PARTS if first[p] != second[p]]
    for part in PARTS:
        print(f"{part:12s} {first[part][:16]}  {second[part][:16]}  {'differs' if part in differ else 'equal'}")
    print("the same output" if not differ else f"different: {', '.join(differ)}")
    return 1 if differ else 0


def register(sub) -> None:
    s = sub.add_parser(
        "digest", help="content digest of an output (samples, predictions, image pixels); with two, compare them",
        description="SHA-256 digests of an output's committed sample ids and coordinates, predictions and decoded "
        "image pixels, whatever its shard layout (pipeline/io/digest.py): e.g. whether a resumed build equals a "
        "clean one. With two outputs, exit 0 when all three are equal, 1 when any differs. Pixels are exact on one "
        "machine under either runner (each stage computes with its resources.<stage>.num_cpus threads); across "
        "CPUs, or with other num_cpus, a few may move by one level.",
    )
    s.add_argument("output", help="an output folder or URL")
    s.add_argument("other", nargs="?", help="a second output to compare with")
    s.set_defaults(func=run)
