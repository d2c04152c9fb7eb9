"""The filter contract (``filter.kind``, registry :data:`pipeline.registry.FILTERS`).

A filter is built once per actor as ``cls(spec, device)`` (``spec``: the config's
``filter`` section) and scores trajectories with :meth:`Filter.evaluate`.  A filter that
holds models also implements ``set_precision`` (:class:`pipeline.models.detectors.OOCFilter`);
the ``none`` filter (:class:`pipeline.models.keep_all.KeepAll`) holds none.  This module
imports no torch.
"""

from __future__ import annotations

from typing import Any, Sequence


class Filter:
    """Base of every registered filter: ``__init__(spec, device)`` and :meth:`evaluate`."""

    def __init__(self, spec: Any, device: str) -> None:
        self.spec = spec
        self.device = device

    def evaluate(self, items: Sequence[tuple]) -> list[dict[str, list]]:  # pragma: no cover - overridden
        """One result per trajectory ``(images, scales, class name, shift)`` of ``items``: the
        score columns, ``n_pass`` and ``kept``, one value per image."""
        raise NotImplementedError
