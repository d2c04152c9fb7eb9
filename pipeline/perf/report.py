"""How the estimate prints: durations at three significant digits, aligned columns."""

from __future__ import annotations

import math
from typing import Sequence

TWO_HOURS = 2 * 3600


def significant(x: float, digits: int = 3) -> str:
    """``x`` rounded to ``digits`` significant digits, without an exponent (1,250 / 45.3 / 0.0123)."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    decimals = digits - 1 - math.floor(math.log10(abs(x)))
    rounded = round(x, decimals)
    if decimals <= 0:
        return f"{rounded:,.0f}"
    return f"{rounded:,.{decimals}f}"


def duration(seconds: float) -> str:
    """Minutes below two hours, hours from there, three significant digits (``45.3 min``, ``12.5 h``)."""
    if seconds < TWO_HOURS:
        return f"{significant(seconds / 60)} min"
    return f"{significant(seconds / 3600)} h"


def table(rows: Sequence[Sequence[str]], numeric: Sequence[int] = (), indent: str = "  ") -> list[str]:
    """``rows`` as lines of aligned columns: ``numeric`` columns right-aligned, the rest left;
    the last column is left as is (free text)."""
    widths = [max(len(str(r[i])) for r in rows if i < len(r)) for i in range(max(len(r) for r in rows))]
    lines = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            last = i == len(row) - 1
            text = str(cell)
            cells.append(text if last else text.rjust(widths[i]) if i in numeric else text.ljust(widths[i]))
        lines.append((indent + "   ".join(cells)).rstrip())
    return lines
