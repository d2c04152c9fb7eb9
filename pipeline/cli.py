"""Command line: ``cnsbench validate|build|aggregate|compare|status|ls|demo|submit|jobs``.

Every command is reachable in-process as ``main(argv) -> exit code`` (tests call it
that way); errors in the user's input print one clear message and return 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Sequence

from pipeline.checkout import DEMO_CONFIG, REPO_ROOT, TINY_CONFIG  # noqa: F401 (TINY_CONFIG: for callers)
from pipeline.config import ConfigError, load_config
from pipeline.io.retry import StorageError
from pipeline.stopping import EXIT_INTERRUPTED, interrupted, stop_on_signals

VALIDATE_SHOWN = 40  # problem lines `validate` prints (a paper-size build misses thousands of sliders)


def _cmd_validate(args: argparse.Namespace) -> int:
    from pipeline import plan
    from pipeline.assets import check_registry_keys, missing_assets, remote_weights_not_cached
    from pipeline.config import config_hash

    cfg = load_config(args.config)
    summary = plan.summarize(cfg)
    print(f"config {args.config}: valid (hash {config_hash(cfg)[:12]})")
    for line in summary.lines():
        print(f"  {line}")
    print(f"  classifiers: {', '.join(c.name for c in cfg.classifiers)}")
    print(f"  protocol: {cfg.protocol} (see docs/protocol.md)")
    problems = check_registry_keys(cfg) + missing_assets(cfg)
    remote = remote_weights_not_cached(cfg)
    if remote:
        print(f"  weights fetched on first use, not in this machine's caches ({len(remote)}):")
        for line in remote:
            print(f"    {line}")
    if problems:
        # Bad input, as for `build`: the config names things that do not exist.
        print(f"{len(problems)} problem(s):")
        for p in problems[:VALIDATE_SHOWN]:
            print(f"  - {p}")
        if len(problems) > VALIDATE_SHOWN:
            print(f"  ... and {len(problems) - VALIDATE_SHOWN} more")
        return 2
    print("  all assets present")
    return 0


def _cmd_build(args: argparse.Namespace) -> int:
    from pipeline.build import build

    overrides = None
    if getattr(args, "filter_thresholds", None):  # a `cnsbench calibrate-filter` result
        from pipeline.calibrate import threshold_overrides

        overrides = threshold_overrides(args.filter_thresholds)
    cfg = load_config(args.config, overrides)
    output = args.output or cfg.output.path
    if not output:
        raise ConfigError("no output: pass --output DIR or set output.path in the config")
    summary = build(
        cfg, output, address=args.address, runner=args.runner, new_version=args.new_version, verify=args.verify
    )
    for line in summary.lines():
        print(f"[cnsbench] {line}")
    return 0 if not summary.trajectories_failed else 3


def _cmd_aggregate(args: argparse.Namespace) -> int:
    from pipeline.aggregate.run import aggregate_output, load_output_config
    from pipeline.config import config_hash
    from pipeline.io.store import OutputStore

    store = OutputStore(args.output)
    cfg = load_output_config(store)
    report = aggregate_output(store, cfg, config_hash(cfg))
    print(f"[cnsbench] report: {report}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from pipeline import plan
    from pipeline.aggregate.run import load_output_config
    from pipeline.build import committed_trajectories
    from pipeline.io.store import OutputStore

    store = OutputStore(args.output)
    cfg = load_output_config(store)
    done, failed = committed_trajectories(store, repair=False, deep=args.verify, echo=print)
    problems = store.scan().problems
    total = plan.summarize(cfg).n_trajectories
    n_scales = len(cfg.benchmark.scales)
    # Stages commit together per shard, so a committed trajectory has passed all three;
    # a failed one stopped at the stage its error names.
    failed_at = {s: sum(1 for e in failed.values() if e.startswith(f"[{s}]")) for s in ("generate", "filter", "classify")}
    from pipeline.io.lease import lease_status

    print(f"{store.uri}")
    print(f"  lease       {lease_status(store)}")
    reached = len(done)
    for stage, key in (("generated", "generate"), ("filtered", "filter"), ("classified", "classify")):
        note = f", {failed_at[key]} failed here" if failed_at[key] else ""
        print(f"  {stage:<11} {reached * n_scales}/{total * n_scales} images ({reached}/{total} trajectories{note})")
    aggregated = False
    if store.exists("report/metrics.json"):
        import json

        metrics = json.loads(store.read_text("report/metrics.json"))
        aggregated = metrics.get("counts", {}).get("n_trajectories_total") == len(done)
    print(f"  {'aggregated':<11} {'yes' if aggregated else 'no (run cnsbench aggregate)'}")
    if problems:
        print(f"  problems: {len(problems)} manifest(s) not counted (the next build moves them to previous/quarantine/ and redoes their shards)")
        for p in problems:
            print(f"    {p.line()}")
    if failed:
        print(f"  failed trajectories: {len(failed)}")
        for tid, err in sorted(failed.items()):
            print(f"    {tid}: {err.splitlines()[0] if err else ''}")
    return 0 if not (failed or problems) else 3


def _cmd_ls(args: argparse.Namespace) -> int:
    from pipeline.registry import ALL

    for title, reg in ALL.items():
        print(f"{title}:")
        for key, doc in reg.describe().items():
            print(f"  {key:<20} {doc}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    world = REPO_ROOT / "assets" / "world" / "world.json"
    if not world.is_file():
        print(
            f"error: the demo's trained world is missing ({world} not found); it ships with the "
            "repository -- restore it with `git checkout -- assets/world` or retrain it with "
            "`python -m pipeline.demo.train_world --output assets/world`",
            file=sys.stderr,
        )
        return 2
    config = DEMO_CONFIG
    if args.family:
        config = REPO_ROOT / "configs" / f"world_{args.family}.yaml"
        if not config.is_file():
            known = sorted(p.stem[len("world_"):] for p in config.parent.glob("world_*.yaml"))
            print(
                f"cnsbench demo: error: no world configuration for family {args.family!r} "
                f"({config} not found); known: {', '.join(known) or 'none'}",
                file=sys.stderr,
            )
            return 2
    return main(["build", str(config), "--output", args.output, "--runner", args.runner])


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cnsbench", description="Robustness benchmarks from continuous nuisance shifts.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("validate", help="check a config and print its plan and missing assets")
    s.add_argument("config")
    s.set_defaults(func=_cmd_validate)

    s = sub.add_parser("build", help="build (or resume) a benchmark")
    s.add_argument("config")
    s.add_argument("--output", help="directory or URI (default: output.path of the config)")
    s.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    s.add_argument("--runner", choices=("ray", "local"), default="ray", help="'local' runs in-process, no Ray")
    s.add_argument("--new-version", action="store_true", help="archive an incompatible existing build and start anew")
    s.add_argument("--verify", action="store_true", help="check the SHA-256 of every committed file, not only sizes")
    s.add_argument(
        "--filter-thresholds", metavar="YAML", help="merge filter.thresholds/min_pass from `cnsbench calibrate-filter`"
    )
    s.set_defaults(func=_cmd_build)

    s = sub.add_parser("aggregate", help="recompute the report of a build output")
    s.add_argument("output")
    s.set_defaults(func=_cmd_aggregate)

    s = sub.add_parser("status", help="done/total per stage and failed items of a build output")
    s.add_argument("output")
    s.add_argument("--verify", action="store_true", help="also check every committed file's SHA-256")
    s.set_defaults(func=_cmd_status)

    s = sub.add_parser("ls", help="list registered generators, filters and classifiers")
    s.set_defaults(func=_cmd_ls)

    s = sub.add_parser("demo", help="build configs/demo.yaml (the shipped miniature world) on a local Ray")
    s.add_argument("--output", default="runs/demo")
    s.add_argument("--runner", choices=("ray", "local"), default="ray")
    s.add_argument(
        "--family", metavar="NAME", help="build the world of another benchmark family (configs/world_NAME.yaml)"
    )
    s.set_defaults(func=_cmd_demo)

    from pipeline import calibrate, evaluate, jobs
    from pipeline.aggregate import compare
    from pipeline.serve import app as serve_app
    from pipeline.train import sliders as train_sliders

    evaluate.add_cli(sub)
    calibrate.add_cli(sub)
    train_sliders.add_cli(sub)
    serve_app.add_cli(sub)
    jobs.add_cli(sub)
    compare.add_cli(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from pipeline.progress import set_verbose

    set_verbose(args.verbose)
    try:
        with stop_on_signals():
            return args.func(args)
    except KeyboardInterrupt:
        print(interrupted(args.command, argv), file=sys.stderr)
        return EXIT_INTERRUPTED
    except StorageError as err:  # out of retries, or a full disk: committed work is kept
        print(f"cnsbench {args.command}: {err.strerror or err}", file=sys.stderr)
        return 1
    except (ConfigError, FileNotFoundError, ValueError, KeyError) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"cnsbench {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except OSError as err:  # a path of the wrong kind, unreadable or unwritable, a full disk
        print(f"cnsbench {args.command}: error: {describe_os_error(err)}", file=sys.stderr)
        return 2


def describe_os_error(err: OSError) -> str:
    """``[Errno 21] Is a directory: 'x'`` -> ``x: is a directory`` (the path first)."""
    path = err.filename if err.filename is not None else ""
    reason = (err.strerror or str(err)).lower() if err.strerror else str(err)
    return f"{path}: {reason}" if path else reason


if __name__ == "__main__":
    sys.exit(main())
