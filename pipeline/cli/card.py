"""``cnsbench card MODEL --suite SUITE --output DIR``: a model's robustness card over a suite's benchmarks."""

from __future__ import annotations

import argparse

from pipeline.config import ConfigError


def validate_suite(path: str, outputs: str | None = None) -> int:
    """``cnsbench validate SUITE``: print the suite and its problems; 2 when there are any."""
    from pipeline.card.check import check_suite
    from pipeline.card.suite import load_suite

    lines, problems = check_suite(load_suite(path, outputs))
    for line in lines:
        print(line)
    if problems:
        print(f"{len(problems)} problem(s):")
        for p in problems:
            print(f"  - {p}")
        return 2
    print("  all benchmarks ready")
    return 0


def run(args: argparse.Namespace) -> int:
    from pipeline.api import commands

    model = args.model_arg or args.model
    if args.model_arg and args.model and args.model_arg != args.model:
        raise ConfigError(f"card: the model is named twice ({args.model_arg!r} and --model {args.model!r})")
    if not model:
        raise ConfigError("card: name the model (MODEL or --model)")
    card = commands.card(
        model, args.suite, output=args.output, name=args.name, model_kind=args.model_kind, checkpoint=args.checkpoint,
        model_config_file=args.model_config_file, outputs=args.outputs, refine=args.refine, force=args.force,
        report=not args.no_report, runner=args.runner,
    )
    for b in card["benchmarks"]:
        value = "n/a" if b["value"] is None else f"{b['value']:.4f}"
        ci = "" if b["ci_low"] is None else f" [{b['ci_low']:.4f}, {b['ci_high']:.4f}]"
        print(f"[cnsbench] {b['benchmark']:<14} {b['metric']:<20} {value}{ci}")
        fp = b.get("failure_point")
        if fp and fp.get("refined") is not None:
            print(f"[cnsbench] {'':<14} {'failure point':<20} grid {_num(fp['grid'])}, refined {_num(fp['refined'])} "
                  f"[{_num(fp['refined_ci_low'])}, {_num(fp['refined_ci_high'])}] (intervals "
                  f"{_num(fp['refined_interval_width'])} wide, {fp['rounds']} rounds)")
    print(f"[cnsbench] card: {args.output.rstrip('/')}/card.html")
    return 0


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


DESCRIPTION = " ".join((
    "Score a model on every benchmark of a suite (building a build entry's output or evaluating a release when",
    "missing, else running only the model on the committed images) and write its headline metrics with bootstrap",
    "intervals. An existing output the suite names is only read: a model it lacks is scored into",
    "OUTPUT/outputs/<benchmark>, which refers to its images. Running it again resumes, and does nothing when the",
    "card is complete.",
))


def register(sub) -> None:
    s = sub.add_parser(
        "card", help="a model's robustness card over a suite of benchmarks (card.json, card.html)",
        description=DESCRIPTION,
    )
    s.add_argument("model_arg", nargs="?", metavar="MODEL",
                   help="a YAML file with one classifier entry, a model with --model-kind, or a classifier name of the suite's configs")
    s.add_argument("--model", help="the model (as MODEL)")
    s.add_argument("--model-kind", help="classifier kind of an inline model (timm, open_clip_zeroshot, torchscript, exported, ...)")
    s.add_argument("--checkpoint", help="inline model: its weights / program file")
    s.add_argument("--model-config-file", help="inline open_clip model: its architecture JSON")
    s.add_argument("--name", help="the model's name on the card and in the outputs (default: the entry's)")
    s.add_argument("--suite", required=True, help="suite file (configs/suite_world.yaml), or one output (folder or URI)")
    s.add_argument("--output", required=True,
                   help="folder of the card: a new or empty one, or one of an earlier card of this model")
    s.add_argument("--outputs", help="folder of the benchmarks' outputs (default: the suite's `outputs`)")
    s.add_argument("--runner", choices=("ray", "local"), default="ray", help="'local' runs in-process, no Ray")
    s.add_argument("--force", action="store_true",
                   help="replace the card of another model in --output (without it, such a folder is refused)")
    s.add_argument("--refine", type=int, metavar="R",
                   help="refine the model's failure points for R rounds (1..8) on each CNS benchmark "
                        "(`cnsbench refine`; an output the suite names: in the card's own output): its entry "
                        "carries them beside the grid's")
    s.add_argument("--no-report", action="store_true",
                   help="leave an output's report as it was after adding the model (`cnsbench aggregate` updates it)")
    s.set_defaults(func=run)
