"""JSON in and out: bounded and finite on the way in, strict on the way out.

``json.loads`` accepts ``NaN``/``Infinity`` (and ``1e400``, read as infinity) and recurses without limit (a deeply nested
document ends in ``RecursionError``); both turn into tracebacks or nonsense later
(``round(inf)``).  :func:`loads` refuses them up front with a :class:`JSONInputError`
(a ``ValueError``) naming where the text came from.

``json.dumps`` writes ``NaN`` and ``Infinity``, which are not JSON: a browser's
``JSON.parse``, ``jq`` and strict parsers refuse the whole file.  Every JSON file the
project writes goes through :func:`dumps`, which writes a non-finite number as ``null``
(a metric of degenerate data -- one class, constant accuracies, nothing kept -- is
undefined, not an error) and turns NumPy scalars and arrays into plain numbers and lists.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pipeline.errors import CnsbenchError

MAX_DEPTH = 64  # nesting of objects/arrays; our own files need fewer than 10


class JSONInputError(CnsbenchError):
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


def finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, +-inf) replaced by None, NumPy values made
    plain Python, tuples and sets made lists; mappings keep their keys."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [finite_or_none(v) for v in value]
    tolist = getattr(value, "tolist", None)  # NumPy scalars and arrays (without importing NumPy)
    if callable(tolist):
        return finite_or_none(tolist())
    item = getattr(value, "item", None)
    if callable(item):
        return finite_or_none(item())
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """Strict JSON text of ``value``: non-finite numbers as ``null`` (:func:`finite_or_none`);
    ``kwargs`` as for ``json.dumps`` (``allow_nan`` is always False)."""
    kwargs["allow_nan"] = False
    return json.dumps(finite_or_none(value), **kwargs)
