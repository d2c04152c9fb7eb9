"""Models shared inside one worker process.

A worker may need the same text-to-image pipeline for several roles (the slider family,
the ``seed`` source of a corruption family, cross-attention masks): :func:`shared` builds
it once per process and key, so a build with several families loads its weights once.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable

_LOCK = threading.Lock()
_MODELS: dict[Hashable, Any] = {}


def shared(key: Hashable, factory: Callable[[], Any]) -> Any:
    """The object cached under ``key``, made by ``factory()`` on first use."""
    with _LOCK:
        if key not in _MODELS:
            _MODELS[key] = factory()
        return _MODELS[key]


def clear() -> None:
    """Drop every cached model (tests)."""
    with _LOCK:
        _MODELS.clear()
