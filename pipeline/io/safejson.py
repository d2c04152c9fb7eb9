"""JSON from files we did not write ourselves: bounded, finite, and errors that name the file.

``json.loads`` accepts ``NaN``/``Infinity`` (and ``1e400``, read as infinity) and recurses without limit (a deeply nested
document ends in ``RecursionError``); both turn into tracebacks or nonsense later
(``round(inf)``).  :func:`loads` refuses them up front with a :class:`JSONInputError`
(a ``ValueError``) naming where the text came from.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 64  # nesting of objects/arrays; our own files need fewer than 10


class JSONInputError(ValueError):
    """Text that is not acceptable JSON; the message names its source."""


def _reject_constant(name: str) -> Any:
    raise JSONInputError(f"non-finite number {name} (use a finite number)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JSONInputError(f"non-finite number {text[:40]} (use a finite number)")
    return value


def _depth_ok(text: str | bytes, max_depth: int) -> bool:
    """Whether brackets nest at most ``max_depth`` deep (brackets inside strings ignored)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    depth, in_str, esc = 0, False, False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def loads(text: str | bytes, source: str, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``text``; :class:`JSONInputError` naming ``source`` when it is malformed,
    nested deeper than ``max_depth`` or holds NaN/Infinity."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise JSONInputError(f"{source}: not UTF-8 text: {err}") from None
    if not _depth_ok(text, max_depth):
        raise JSONInputError(f"{source}: JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except JSONInputError as err:
        raise JSONInputError(f"{source}: {err}") from None
    except (ValueError, RecursionError) as err:
        raise JSONInputError(f"{source}: not valid JSON: {err}") from None
