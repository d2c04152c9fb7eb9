"""``cnsbench validate SUITE``: what a suite's benchmarks need, checked before any model loads.

Per benchmark: its config parses and names files that exist (as ``cnsbench validate``
checks a config; a release's evaluate config only for what evaluating uses), a release's
folder and an existing output are there, a stated protocol is the one the benchmark is
evaluated with, and the corruption baseline is a classifier of that benchmark (and the one
its report normalises by).  Across benchmarks: no two entries make one output with
different settings.  Returns the lines to print and the problems, each naming the
benchmark and the key.
"""

from __future__ import annotations

import os

from pipeline.card.suite import ALEXNET, Benchmark, Suite, shared_output_problems
from pipeline.config import BuildConfig, ConfigError


def _exists(location: str) -> bool:
    """Whether a local path or a URI (a release folder) exists."""
    if "://" not in location:
        return os.path.exists(location)
    import fsspec

    fs, root = fsspec.core.url_to_fs(location)
    return fs.exists(root)


def _is_output(location: str) -> bool:
    from pipeline.io.store import OutputStore

    return OutputStore(location).exists("config.json")


def _config(b: Benchmark, problems: list[str]) -> BuildConfig | None:
    if not os.path.isfile(b.config):
        problems.append(f"{b.where}.config: {b.config}: not found")
        return None
    try:
        return b.load_config()
    except ConfigError as err:
        problems.append(f"{b.where}.config: {err}")
        return None


def _output_config(b: Benchmark, problems: list[str]) -> BuildConfig | None:
    from pipeline.aggregate.run import load_output_config
    from pipeline.io.store import OutputStore

    try:
        return load_output_config(OutputStore(b.output))
    except (ConfigError, OSError, ValueError) as err:
        problems.append(f"{b.where}.output: {err}")
        return None


def _asset_problems(b: Benchmark, cfg: BuildConfig) -> list[str]:
    from pipeline.assets import check_registry_keys, missing_assets

    if b.kind == "release":  # only the card's model is evaluated (and the baseline): not the config's list
        cfg = cfg.model_copy(update={"classifiers": cfg.classifiers[:1]})
    found = check_registry_keys(cfg) + missing_assets(cfg, [] if b.kind == "release" else None)
    if b.kind == "release":  # evaluating uses no generator, and only the card's model of the classifiers
        found = [p for p in found if not p.startswith(("generator", "classifiers"))]
    return [f"{b.where}: {p}" for p in found]


def _baseline_problems(b: Benchmark, cfg: BuildConfig | None, baseline: str | None) -> list[str]:
    if b.family != "corruptions" or baseline in (None, ALEXNET) or cfg is None:
        return []
    names = [c.name for c in cfg.classifiers]
    where = b.config or b.output
    if baseline not in names:
        return [f"{b.where}: the suite's baseline {baseline!r} is not a classifier of {where} ({', '.join(names)})"]
    configured = dict(cfg.aggregate.analysis_entries()).get("corruption_error", {}).get("baseline")
    # A release is evaluated with the suite's baseline in its report (pipeline.card.outputs); a
    # build or an output must say it itself, or its report's mCE is not the card's.
    if configured != baseline and not (b.kind == "release" and configured is None):
        return [f"{b.where}: the suite's baseline {baseline!r} differs from aggregate.analyses[corruption_error].baseline "
                f"{configured!r} of {where}: the card's mCE would not be its report's"]
    return []


def _protocol_problem(b: Benchmark, cfg: BuildConfig | None) -> str | None:
    from pipeline.sources.detect import protocol_of

    stated = b.entry.protocol
    if stated is None:
        return None
    if b.kind == "release":
        kind = b.entry.source_kind
        if kind is None:
            return None  # detected from the folder when it is evaluated, and checked then
        proto = protocol_of(kind)
        actual = proto.name if proto is not None else (cfg.protocol if cfg is not None else None)
    elif b.kind == "output" and cfg is not None:
        from pipeline.card.outputs import protocol_of_output, release_kind
        from pipeline.io.store import OutputStore

        actual = protocol_of_output(cfg, release_kind(OutputStore(b.output)))["name"]
    else:
        actual = cfg.protocol if cfg is not None else None
    if actual is not None and actual != stated:
        return f"{b.where}.protocol: {stated!r}, but the benchmark is evaluated with the {actual!r} protocol"
    return None


def check_suite(suite: Suite) -> tuple[list[str], list[str]]:
    """(lines describing the suite, problems) -- see the module doc."""
    from pipeline.sources import SOURCE_KINDS

    lines = [f"suite {suite.path}: {suite.name} (hash {suite.hash[:12]})"]
    if suite.baseline:
        lines.append(f"  corruption baseline: {suite.baseline}")
    problems: list[str] = []
    for b in suite.benchmarks:
        cfg = None
        if b.kind != "output":  # a build or a release: its config is read
            cfg = _config(b, problems)
        if b.kind == "build":
            state = "present" if _is_output(b.output) else "built on first use"
            lines.append(f"  {b.name} ({b.family}): build {b.config} -> {b.output} ({state})")
        elif b.kind == "release":
            lines.append(f"  {b.name} ({b.family}): release {b.release} ({b.entry.source_kind or 'layout detected'}, "
                         f"protocol {b.entry.protocol or 'of its layout'}) -> {b.output}")
            if not _exists(b.release):
                problems.append(f"{b.where}.release: {b.release}: not found (fill in the folder of the released dataset)")
            if b.entry.source_kind is not None and b.entry.source_kind not in SOURCE_KINDS:
                problems.append(f"{b.where}.source_kind: {b.entry.source_kind!r} is not one of {', '.join(SOURCE_KINDS)}")
        else:
            lines.append(f"  {b.name} ({b.family}): output {b.output}")
            if not _is_output(b.output):
                problems.append(f"{b.where}.output: {b.output}: no cnsbench output there (config.json not found)")
            else:
                cfg = _output_config(b, problems)
        if cfg is not None and b.kind != "output":
            problems += _asset_problems(b, cfg)
        problems += _baseline_problems(b, cfg, suite.baseline)
        proto = _protocol_problem(b, cfg)
        if proto:
            problems.append(proto)
    problems += shared_output_problems(suite)
    return lines, problems
