"""The ``none`` filter (``filter.kind: none``, or ``filter.enabled: false``).

It loads no model and imports no torch, so a build without a filter pays for neither: its
filter actors only add the filter's columns (scores NaN, ``n_pass`` 0, every image kept).
"""

from __future__ import annotations

import math
from typing import Sequence

from pipeline.models.filter_base import Filter
from pipeline.plan.schema import REALISATION_COLUMNS, SCORE_COLUMNS


class KeepAll(Filter):
    """No detector runs, every image is kept, scores are NaN."""

    def evaluate(self, items: Sequence[tuple]) -> list[dict[str, list]]:
        """One result per trajectory ``(images, scales, class name, shift)`` of ``items``."""
        results = []
        for images, _, _, _ in items:
            n = len(images)
            results.append(
                {
                    **{k: [math.nan] * n for k in (*SCORE_COLUMNS, *REALISATION_COLUMNS)},
                    "n_pass": [0] * n,
                    "kept": [True] * n,
                }
            )
        return results
