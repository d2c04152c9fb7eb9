"""The verbs ``cnsbench.build``, ``cnsbench.refine``, ``cnsbench.card``, ``cnsbench.leaderboard``.

Each is the one definition of its verb: the command parses its arguments, calls the function
and prints what it returns (``cnsbench.evaluate``: :mod:`pipeline.api.evaluate`).  They take
plain values, return plain data, and raise :class:`pipeline.errors.CnsbenchError` for bad
input with the message the command line prints for it.  Their order: what is scored first,
then where from, then keyword-only output and options.  The runner defaults to ``local``
(one process, no Ray), the natural choice in a notebook; ``runner="ray"`` is the commands'.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from pipeline.api.common import check_runner, load_config_file, path_arg as _path, user_errors
from pipeline.errors import CnsbenchError

if TYPE_CHECKING:
    import pandas as pd

    from pipeline.config import BuildConfig
    from pipeline.output_run import BuildSummary
    from pipeline.refine import RefineSummary

Echo = Callable[[str], None]


def build(
    config: "str | os.PathLike[str] | BuildConfig",
    output: str | os.PathLike[str] | None = None,
    *,
    sets: Sequence[str] = (),
    filter_thresholds: str | None = None,
    runner: str = "local",
    address: str | None = None,
    new_version: bool = False,
    verify: bool = False,
    echo: Echo = print,
) -> "BuildSummary":
    """Build (or resume) the benchmark of ``config`` (a file, with ``sets`` as ``--set``
    items, or a :class:`BuildConfig`) into ``output`` (default: its ``output.path``)."""
    from pipeline.build import build as run_build

    with user_errors():
        check_runner(runner)
        overrides = None
        if filter_thresholds:  # a `cnsbench calibrate-filter` result
            from pipeline.models.calibrate import threshold_overrides

            overrides = threshold_overrides(filter_thresholds)
        cfg = load_config_file(config, sets, overrides)
        where = _path(output, "output") if output is not None else cfg.output.path
        if not where:
            raise CnsbenchError("no output: pass --output or set output.path in the config")
        return run_build(cfg, where, address=address, runner=runner, new_version=new_version, verify=verify, echo=echo)


def refine(
    classifier: str | Sequence[str],
    output: str | os.PathLike[str],
    *,
    rounds: int | None = None,
    runner: str = "local",
    address: str | None = None,
    models: dict[str, Any] | None = None,
    echo: Echo = print,
) -> "RefineSummary":
    """Bisect ``classifier``'s failure points (a name, a comma list, a list, or ``"all"``) below
    the grid of the benchmark or evaluation output ``output`` (docs/refine.md); the refined
    points are in ``summary.table`` and the report, and their images go into ``output``.  A
    classifier held in memory is refined with its object: ``models={name: model}``."""
    from pipeline.refine import refine as run_refine

    asked = classifier if isinstance(classifier, str) else ",".join(classifier)
    with user_errors():
        check_runner(runner)
        return run_refine(_path(output, "output"), asked, rounds=rounds, runner=runner, address=address, echo=echo,
                          models=models)


def card(
    model: Any,
    suite: str | os.PathLike[str],
    *,
    output: str | os.PathLike[str],
    name: str | None = None,
    preprocess: Any = None,
    label_map: dict[int, int] | None = None,
    model_kind: str | None = None,
    checkpoint: str | None = None,
    model_config_file: str | None = None,
    outputs: str | os.PathLike[str] | None = None,
    refine: int | None = None,
    force: bool = False,
    report: bool = True,
    runner: str = "local",
    echo: Echo = print,
) -> dict[str, Any]:
    """The robustness card of ``model`` over ``suite`` (a suite file, or one output), written
    with ``card.html`` into ``output``; returns ``card.json``'s content.  An output the suite
    names is only read: a model it lacks is scored into ``output``'s own ``outputs/<name>``,
    which refers to its images (docs/card.md).

    ``model``: a classifier name of the suite's configs, a YAML file with one entry, a model
    with ``model_kind`` (and ``checkpoint``, ``model_config_file``), or a model held in memory
    (an ``nn.Module`` or callable, with ``name`` and ``preprocess``, optionally ``label_map``).
    ``refine``: refine its failure points for that many rounds on each CNS build entry."""
    from pipeline.card.make import make_card
    from pipeline.card.suite import load_suite, shared_output_problems
    from pipeline.config.refine import MAX_ROUNDS
    from pipeline.demo.assets import ensure_config_assets

    dest = _path(output, "output")
    with user_errors():
        if refine is not None and not 1 <= refine <= MAX_ROUNDS:
            raise CnsbenchError(f"card: --refine must be 1..{MAX_ROUNDS} rounds, got {refine}")
        check_runner(runner)
        s = load_suite(_path(suite, "suite"), None if outputs is None else _path(outputs, "outputs"))
        shared = shared_output_problems(s)
        if shared:
            raise CnsbenchError(f"invalid suite {s.path}:\n" + "\n".join(f"  {p}" for p in shared))
        spec = _card_model(model, s, name=name, preprocess=preprocess, label_map=label_map, model_kind=model_kind,
                           checkpoint=checkpoint, model_config_file=model_config_file, runner=runner)
        return make_card(spec, s, dest, runner=runner, echo=echo, ready=ensure_config_assets, report=report,
                         force=force, refine=refine)


def _card_model(model: Any, suite: Any, *, name: str | None, preprocess: Any, label_map: dict[int, int] | None,
                model_kind: str | None, checkpoint: str | None, model_config_file: str | None, runner: str) -> Any:
    """The card's classifier entry: a model named (a configured name, a YAML file, an inline
    kind) or held in memory (checked on each benchmark's label space before any write)."""
    from pipeline.card.model import resolve_model

    if isinstance(model, (str, os.PathLike)):
        if preprocess is not None or label_map is not None:
            raise CnsbenchError("preprocess= and label_map= describe a model held in memory; a named model's "
                                "entry states its own")
        return resolve_model(os.fspath(model), kind=model_kind, checkpoint=checkpoint,
                             model_config_file=model_config_file, name=name, configs=config_loaders(suite))
    from pipeline.api.models import check_held, held_entry, output_config

    spec = held_entry(model, name=name, preprocess=preprocess, label_map=label_map, where="on the card and in the outputs")
    for b in suite.benchmarks:
        check_held(spec, b.load_config() if b.kind != "output" else output_config(b.output), runner)
    return spec


def config_loaders(suite: Any) -> list[Callable[[], Any]]:
    """Loaders of the configs of the suite's entries (a build's or a release's config, an
    existing output's, and the benchmark's an evaluation output refers to), where a model
    named by a classifier name is looked up."""
    from pipeline.aggregate.run import load_output_config
    from pipeline.api.evaluate import with_referenced
    from pipeline.io.store import OutputStore

    loaders: list[Callable[[], Any]] = []
    for b in suite.benchmarks:
        if b.kind in ("build", "release"):
            loaders.append(b.load_config)
        elif b.kind == "output":  # an evaluation output: the classifiers of its benchmark's config too
            loaders.append(lambda uri=b.output: with_referenced(uri, load_output_config(OutputStore(uri))))
    return loaders


@dataclass(frozen=True)
class Leaderboard:
    """A leaderboard: one row per (model, benchmark) ranked, the rank correlations between
    benchmarks, and its page."""

    table: "pd.DataFrame"
    correlations: "pd.DataFrame"
    page: str


def leaderboard(cards: Sequence[str | os.PathLike[str]] | str | os.PathLike[str], *, output: str | os.PathLike[str],
                echo: Echo = print) -> Leaderboard:
    """Rank the models of ``cards`` (card folders of one suite) into ``output``."""
    from pipeline.card.leaderboard import make_leaderboard
    from pipeline.io.store import OutputStore

    dest = _path(output, "output")
    if isinstance(cards, (str, os.PathLike)):
        cards = [cards]
    with user_errors():
        table, corr = make_leaderboard([os.fspath(c) for c in cards], dest, echo=echo)
        return Leaderboard(table, corr, OutputStore(dest).url("index.html"))
