"""Walking nested JSON-like values (dicts, lists, scalars), as configs are after ``model_dump``."""

from __future__ import annotations

from typing import Any, Iterator


def iter_strings(value: Any) -> Iterator[str]:
    """Every string of ``value``, depth first: dict values and list items (not dict keys)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from iter_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from iter_strings(v)
