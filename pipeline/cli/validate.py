"""``cnsbench validate``: check a config: its plan, the registry keys it names and the files it needs."""

from __future__ import annotations

import argparse
import os

from pipeline.cli.options import add_set_argument, load_cli_config, set_args

VALIDATE_SHOWN = 40  # problem lines `validate` prints (a paper-size build misses thousands of sliders)


def run(args: argparse.Namespace) -> int:
    from pipeline import plan
    from pipeline.assets import build_problems, resolve_assets
    from pipeline.config import config_hash

    from pipeline.card.suite import is_suite_file

    if is_suite_file(args.config):  # a card's suite of benchmarks, not a build config
        from pipeline.cli.card import validate_suite

        return validate_suite(args.config)
    cfg = load_cli_config(args)
    summary = plan.summarize(cfg)
    print(f"config {args.config}: valid (hash {config_hash(cfg)[:12]})")
    for line in summary.lines():
        print(f"  {line}")
    print(f"  classifiers: {', '.join(c.name for c in cfg.classifiers)}")
    print(f"  protocol: {cfg.protocol} (see docs/protocol.md)")
    precisions = {stage: getattr(cfg.resources, stage).precision for stage in ("filter", "classify")}
    if set(precisions.values()) != {"float32"}:
        shown = ", ".join(f"{stage} {value}" for stage, value in precisions.items())
        print(f"  precision: {shown} (float32 gives the paper's numbers; docs/protocol.md, \"Precision\")")
    assets = resolve_assets(cfg)
    problems = assets.lines() + build_problems(cfg) + report_hub_artefacts(assets.hub(), command_line(args))
    if problems:  # the projection builds every model's shapes: worth it once the config can run
        print("  projected memory per actor: shown once the problems below are fixed")
    else:
        report_memory(cfg)
    report_pools(cfg)
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


def command_line(args: argparse.Namespace) -> str:
    """The config and ``--set`` items as they would be typed again (for the prefetch hint)."""
    import shlex

    return " ".join(shlex.quote(a) for a in [args.config, *set_args(args)])


def report_hub_artefacts(artefacts, config_args: str) -> list[str]:
    """Print the config's hub artefacts, cached or not; offline, the missing ones are problems."""
    from pipeline.assets.hub import PREFETCH_HINT

    missing = [a for a in artefacts if not a.cached]
    if not artefacts:
        return []
    print(f"  hub artefacts: {len(artefacts) - len(missing)} of {len(artefacts)} cached here")
    if not missing:
        return []
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    state = "offline (HF_HUB_OFFLINE): a build cannot load them" if offline else "fetched on first use"
    print(f"  not cached here, {state} ({len(missing)}):")
    for a in missing:
        print(f"    {a.line()}")
    print(f"  {PREFETCH_HINT.format(config=config_args)}")
    return [f"{a.line()}: not cached here (offline)" for a in missing] if offline else []


def report_memory(cfg) -> None:
    """Print each stage actor's projected peak memory (GPU at the config's dtype, and CPU)."""
    from pipeline.perf.memory import GB, auto_batch, classifier_groups, project_stage_memory

    gpu, cpu = project_stage_memory(cfg, "cuda"), project_stage_memory(cfg, "cpu")
    groups = classifier_groups(cfg)
    print(f"  projected memory per actor (weights + peak activations; GPU at {cfg.generator.dtype} / CPU float32; "
          "filter and classify at their precision):")
    for stage in gpu:
        shown = [f"{v / GB:.2f} GB" if v is not None else "unknown (model config not cached)" for v in (gpu[stage], cpu[stage])]
        note = f", {len(groups)} classifier groups" if stage == "classify" and len(groups) > 1 else ""
        print(f"    {stage:<9} {shown[0]} / {shown[1]}{note}")
    for stage in ("filter", "classify"):  # batch_size auto: the batch the projection chose
        if getattr(cfg.resources, stage).batch_size == "auto":
            print(f"  {auto_batch(cfg, stage).line()}")


def report_pools(cfg) -> None:
    """Print each GPU pool's actor range: under ``resources.max_gpus`` the budget's split
    (:func:`pipeline.perf.estimate.config_split`, as the build sizes its pools), else as configured."""
    from pipeline.perf.budget import config_pools
    from pipeline.perf.estimate import config_split

    budget = cfg.resources.max_gpus
    if budget is None:
        pools = config_pools(cfg)
        if pools:
            shown = ", ".join(f"{name} {size}-{getattr(cfg.resources, stage).max_pool_size or size}"
                              for name, stage, _, size, _ in pools)
            print(f"  GPU actor pools (no GPU budget; resources.max_gpus or --max-gpus sets one): {shown}")
        return
    ranges = config_split(cfg, budget)
    used = sum(r.gpus for r in ranges)
    print(f"  GPU budget {budget} (resources.max_gpus), split by projected GPU time (pipeline/perf/budget.py); "
          f"{used:g} GPUs at the pools' largest:")
    for r in ranges:
        print(f"    {r.name:<22} {r.min_size}-{r.max_size} actors of {r.num_gpus:g} GPU "
              f"(share {r.share:.2f} GPUs, {r.share / budget:.0%} of the GPU time)")


def register(sub) -> None:
    s = sub.add_parser("validate", help="check a config (or a card's suite) and print its plan and missing assets")
    s.add_argument("config")
    add_set_argument(s)
    s.set_defaults(func=run)
