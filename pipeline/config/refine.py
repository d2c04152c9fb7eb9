"""``refine``: defaults of ``cnsbench refine`` (failure points bisected below the grid, docs/refine.md)."""

from __future__ import annotations

from pydantic import Field

from pipeline.config.base import Strict

MAX_ROUNDS = 8
"""The most bisection rounds a refinement runs: 2**8 = 256 steps per grid interval."""


class RefineSpec(Strict):
    """How ``cnsbench refine`` bisects each trajectory's first failing grid interval.

    Part of the config an output keeps (``config.json``), and one a run may change on an
    existing output (:data:`pipeline.output_run.EXTENSIBLE`): it changes no committed row.
    """

    rounds: int = Field(3, ge=1, le=MAX_ROUNDS, description="bisection rounds: the interval shrinks to 1/2**rounds")
