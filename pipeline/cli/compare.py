"""``cnsbench`` command: one report over several outputs side by side."""

from __future__ import annotations

from pipeline.aggregate.compare import compare_outputs
from pipeline.errors import CnsbenchError


def register(sub) -> None:
    s = sub.add_parser("compare", help="one report over several outputs of the same benchmark (classifiers side by side)")
    s.add_argument("outputs", nargs="+", metavar="OUTPUT", help="build or evaluate outputs (at least two)")
    s.add_argument("--output", required=True, help="folder (or URI) of the comparison report")
    s.add_argument("--labels", help="comma-separated names of the outputs (default: their folder names)")
    s.add_argument("--image-check", type=int, default=64, metavar="N",
                   help="compare the pixels of N sampled images (0: all) (default 64)")
    s.set_defaults(func=_cmd_compare)



def _cmd_compare(args) -> int:
    if args.image_check < 0:
        raise CnsbenchError(f"--image-check must be >= 0, got {args.image_check}")
    labels = [x.strip() for x in args.labels.split(",")] if args.labels else None
    url = compare_outputs(args.outputs, args.output, labels=labels, image_check=args.image_check)
    print(f"[cnsbench] comparison: {url}")
    return 0
