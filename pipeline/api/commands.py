"""The commands' work from Python: ``pipeline.build``, ``pipeline.refine``, ``pipeline.leaderboard``.

Each is what its command runs (the command is a thin wrapper that prints the result), takes
plain values, returns plain data, and raises :class:`pipeline.errors.CnsbenchError` for bad
input with the message the command line prints for it.  The runner defaults to ``local``
(one process, no Ray), the natural choice in a notebook; ``runner="ray"`` is the commands'.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from pipeline.api.common import load_config_file, user_errors
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
        overrides = None
        if filter_thresholds:  # a `cnsbench calibrate-filter` result
            from pipeline.models.calibrate import threshold_overrides

            overrides = threshold_overrides(filter_thresholds)
        cfg = load_config_file(config, sets, overrides)
        where = os.fspath(output) if output else cfg.output.path
        if not where:
            raise CnsbenchError("no output: pass --output DIR or set output.path in the config")
        return run_build(cfg, where, address=address, runner=runner, new_version=new_version, verify=verify, echo=echo)


def refine(
    output: str | os.PathLike[str],
    classifier: str,
    rounds: int | None = None,
    runner: str = "local",
    *,
    address: str | None = None,
    echo: Echo = print,
    models: dict[str, Any] | None = None,
) -> "RefineSummary":
    """Bisect ``classifier``'s failure points below the grid of the build ``output``
    (docs/refine.md); the refined points are in ``summary.table`` and the report.  A classifier
    held in memory (``pipeline.evaluate``) is refined with its object: ``models={name: model}``."""
    from pipeline.refine import refine as run_refine

    with user_errors():
        return run_refine(os.fspath(output), classifier, rounds=rounds, runner=runner, address=address, echo=echo,
                          models=models)


@dataclass(frozen=True)
class Leaderboard:
    """A leaderboard: one row per (model, benchmark) ranked, the rank correlations between
    benchmarks, and its page."""

    table: "pd.DataFrame"
    correlations: "pd.DataFrame"
    page: str


def leaderboard(cards: Sequence[str | os.PathLike[str]], output: str | os.PathLike[str], *,
                echo: Echo = print) -> Leaderboard:
    """Rank the models of ``cards`` (card folders of one suite) into ``output``."""
    from pipeline.card.leaderboard import make_leaderboard
    from pipeline.io.store import OutputStore

    dest = os.fspath(output)
    if not dest.strip():
        raise CnsbenchError("leaderboard: --output is empty: give the leaderboard's folder")
    if isinstance(cards, (str, os.PathLike)):
        cards = [cards]
    with user_errors():
        table, corr = make_leaderboard([os.fspath(c) for c in cards], dest, echo=echo)
        return Leaderboard(table, corr, OutputStore(dest).url("index.html"))
