"""Evaluate-only mode: run the classifier pool (and optionally the OOC filter) over existing images.

Role: ``cnsbench evaluate SOURCE --config CONFIG --output DIR``.  The images come from a
source (:mod:`pipeline.sources`: the published CNS-Bench layout, a WebDataset / build
output, or class folders) instead of the generator; everything after that is the build's
own machinery, so the output has the build's layout and contract (``images/``,
``samples/``, ``predictions/``, ``manifest/``, ``report/``, ``config.json``) and
``cnsbench aggregate`` / ``status`` work on it:

    source pointer rows --LoadStage--> [--FilterStage-->] --ClassifyStage--> --WriteStage-->

run by the same executors as a build (:mod:`pipeline.executors`).

The config supplies the classifiers, the filter models and thresholds, output format and
resources; its ``benchmark`` section is replaced by what the source holds (classes, seeds,
shifts, scales; :func:`effective_config`), and that effective config is what
``config.json`` records.  Without ``--filter`` the filter is disabled (scores NaN,
``n_pass`` 0, every image kept).  Resuming works as for a build: trajectories of committed
shards are skipped, and a second run with settings that would change existing rows
(other classifiers, filter on/off, thresholds, scales) is refused.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

from pipeline.build import (
    BuildSummary,
    ShardTally,
    check_compatible,
    clean_uncommitted,
    committed_trajectories,
    finish_run,
    write_config,
)
from pipeline.config import (
    BuildConfig,
    ConfigError,
    StageResources,
    deep_merge,
    load_config,
    parse_config,
    resolved_dict,
)
from pipeline.executors import StageSpec, get_executor
from pipeline.io.store import OutputStore
from pipeline.sources import SOURCE_KINDS, LoadStage, Source, open_source


def select_classifiers(cfg: BuildConfig, names: list[str] | None) -> list[dict[str, Any]]:
    """The config's classifier specs named in ``names`` (in that order), all when None."""
    specs = {c.name: c.model_dump(mode="json") for c in cfg.classifiers}
    if not names:
        return list(specs.values())
    unknown = [n for n in names if n not in specs]
    if unknown:
        raise ConfigError(f"--classifiers: {unknown} not in the config; known: {', '.join(specs)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"--classifiers: names repeat: {names}")
    return [specs[n] for n in names]


def effective_config(
    cfg: BuildConfig, source: Source, *, use_filter: bool, classifiers: list[str] | None = None
) -> BuildConfig:
    """``cfg`` with its benchmark replaced by the source's coordinates.

    classes / seeds / shifts / scales become those present in the source, the filter is
    enabled only with ``use_filter``, the classifiers are narrowed to ``classifiers``, and
    ``output.image_format`` becomes the source's dominant format so its images are stored
    unchanged.  Raises ConfigError (e.g. scales without 0, a margin below the largest scale).
    """
    raw = resolved_dict(cfg)
    raw["benchmark"].update(
        classes=source.classes, seeds=source.seeds, shifts=source.shifts, scales=source.scales
    )
    raw["filter"]["enabled"] = bool(use_filter)
    raw["classifiers"] = select_classifiers(cfg, classifiers)
    raw["output"]["image_format"] = source.image_format
    named = {a if isinstance(a, str) else a.get("name") for a in raw["aggregate"]["analyses"]}
    raw["aggregate"]["analyses"] += [a for a in source.analyses if a not in named]
    return parse_config(raw, source=f"evaluate config for {source.location}")


def _check_assets(cfg: BuildConfig) -> None:
    """Missing filter/classifier files, all at once (the generator is not used here)."""
    from pipeline.assets import AssetError, check_registry_keys, missing_assets

    problems = [p for p in check_registry_keys(cfg) + missing_assets(cfg, []) if not p.startswith("generator")]
    if problems:
        raise AssetError("missing or unknown assets:\n  " + "\n  ".join(problems))


def _stages(cfg: BuildConfig) -> list[StageSpec]:
    """load -> [filter ->] classify -> write."""
    from pipeline.stages.classify import ClassifyStage
    from pipeline.stages.filter import FilterStage
    from pipeline.stages.write import WriteStage

    res = cfg.resources
    # Load batches the size of the next stage's, so each batch feeds one model forward.
    nxt = res.filter if cfg.filter.enabled else res.classify
    chain = [StageSpec(LoadStage, {"fill_filter": not cfg.filter.enabled}, batch_size=nxt.batch_size)]
    if cfg.filter.enabled:
        chain.append(StageSpec(FilterStage))
    chain.append(StageSpec(ClassifyStage))
    chain.append(StageSpec(WriteStage, batch_size=cfg.output.trajectories_per_shard))
    return chain


def evaluate(
    cfg: BuildConfig,
    source: Source,
    output: str,
    *,
    runner: str = "ray",
    address: str | None = None,
    aggregate: bool = True,
    echo: Callable[[str], None] = print,
) -> BuildSummary:
    """Run (or resume) the evaluation of ``source`` with the effective config ``cfg``.

    ``cfg`` should come from :func:`effective_config`.  Returns the same summary as a
    build (generation fields None).
    """

    start = time.perf_counter()
    store = OutputStore(output)
    check_compatible(store, cfg)
    done, _ = committed_trajectories(store, echo=echo)
    todo = [r for r in source.rows if r["trajectory_id"] not in done]
    _check_assets(cfg)
    clean_uncommitted(store, echo)  # files of an interrupted run, stale attempt markers
    digest = write_config(store, cfg)
    store.write_text("source.json", json.dumps(source.describe(), indent=1))
    total = len(source.rows)
    done_before = total - len(todo)
    echo(
        f"[cnsbench] {source.kind} source {source.location}: {total} trajectories ({source.n_images} images), "
        f"{done_before} already done, {len(todo)} to evaluate"
    )
    for note in source.notes:
        echo(f"[cnsbench] note: {note}")

    tally = ShardTally(total, done_before, echo)

    if todo:
        executor = get_executor(runner, cfg, address)
        # Rows are light pointers; a few per block keeps the load pool busy from the start.
        for _ in executor.run(todo, store.uri, _stages(cfg), num_blocks=min(len(todo), 1000), on_shard=tally):
            pass

    return finish_run(
        store,
        cfg,
        digest,
        tally,
        start=start,
        runner=runner,
        aggregate=aggregate,
        run_name="-evaluate",
        run_info={"source": source.describe()},
    )


# --------------------------------------------------------------------------- CLI
def _source_config(location: str) -> BuildConfig | None:
    """The config a build output was made with, so ``evaluate BUILD_OUTPUT`` needs no --config."""
    from pipeline.aggregate.run import load_output_config

    store = OutputStore(location)
    return load_output_config(store) if store.exists("config.json") else None


def run_cli(args: argparse.Namespace) -> int:
    """``cnsbench evaluate``: exit 0, 3 when trajectories failed; bad input raises (the CLI maps it to 2)."""
    overrides = None
    if args.filter_thresholds:  # a `cnsbench calibrate-filter` result
        from pipeline.calibrate import threshold_overrides

        overrides = threshold_overrides(args.filter_thresholds)
    if args.config:
        cfg = load_config(args.config, overrides)
    else:
        cfg = _source_config(args.source)
        if cfg is None:
            raise ConfigError("evaluate: pass --config CONFIG (it supplies the classifiers, filter and resources)")
        if overrides:
            cfg = parse_config(deep_merge(resolved_dict(cfg), overrides), source=f"{args.source}/config.json")
    names = [n.strip() for n in args.classifiers.split(",") if n.strip()] if args.classifiers else None
    source = open_source(args.source, cfg.benchmark.label_space, kind=args.source_kind, label_map=args.label_map)
    eff = effective_config(cfg, source, use_filter=args.filter, classifiers=names)
    summary = evaluate(eff, source, args.output, runner=args.runner, address=args.address)
    for line in summary.lines():
        print(f"[cnsbench] {line}")
    return 0 if not summary.trajectories_failed else 3


def add_cli(subparsers: Any) -> None:
    """Register ``cnsbench evaluate`` on an argparse ``subparsers`` object (``func(args) -> int``)."""
    s = subparsers.add_parser(
        "evaluate",
        help="run the classifiers (and optionally the OOC filter) over existing images",
        description="Evaluate existing images: the published CNS-Bench layout (annotations_cns.json), "
        "a WebDataset / build output, or class folders. Output and report as for `build`; "
        "running it again on the same --output resumes.",
    )
    s.add_argument("source", help="directory or URI of the images (or an annotations_cns.json file)")
    s.add_argument("--config", help="config supplying classifiers, filter, resources (default: a build output's own)")
    s.add_argument("--output", required=True, help="output directory or URI")
    s.add_argument("--filter", action="store_true", help="also run the OOC filter (default: keep every image)")
    s.add_argument("--classifiers", help="comma-separated classifier names of the config (default: all)")
    s.add_argument("--source-kind", choices=SOURCE_KINDS, help="skip auto-detection of the source layout")
    s.add_argument("--label-map", help="class folders: JSON file {folder name: class id}")
    s.add_argument("--filter-thresholds", metavar="YAML", help="merge a `cnsbench calibrate-filter` result")
    s.add_argument("--runner", choices=("ray", "local"), default="ray", help="'local' runs in-process, no Ray")
    s.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    s.set_defaults(func=run_cli)
