"""Which analyses a build's report runs, with their options: part of the plan, known before any model loads.

The configured ones (``aggregate.analyses``), then the ones every report runs
(``pipeline.registry.REPORT_ANALYSES``), then those the build's families add (a family's
``analyses``).  ``validate`` and ``build`` check each one's options from this list, and the
aggregation driver (:func:`pipeline.aggregate.run.render_report`) runs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import BuildConfig


def analysis_plan(cfg: BuildConfig) -> list[tuple[str, dict]]:
    """(analysis key, options): the configured ones, then those the build's families add."""
    from pipeline.registry import FAMILIES, REPORT_ANALYSES

    plan = list(cfg.aggregate.analysis_entries())
    names = {name for name, _ in plan}
    for name in REPORT_ANALYSES:
        if name not in names:
            plan.append((name, {}))
            names.add(name)
    for group in cfg.family_groups():
        for name in FAMILIES.get(group.kind).analyses:
            if name not in names:
                plan.append((name, {}))
                names.add(name)
    return plan
