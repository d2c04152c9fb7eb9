"""Batch sizes from memory: what ``resources.<stage>.batch_size: auto`` resolves to.

A filter or classify stage with ``batch_size: auto`` runs the largest batch (rows per call)
whose projected actor memory (:mod:`pipeline.perf.memory`) fits its budget:
``resources.<stage>.memory_budget_gb``, else its share of one GPU (``num_gpus`` x
``resources.device_memory_gb``).  The batch is at most the rows whose images fill one model
forward (the classify stage's ``PREDICT_CHUNK``, the filter's ``MAX_FORWARD``): the projection
does not grow beyond it, and more rows per call only hold more decoded images.
:func:`pipeline.perf.memory.auto_batch` applies this to a config; ``cnsbench validate`` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from pipeline.errors import CnsbenchError

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import BuildConfig

GB = 1024**3


@dataclass(frozen=True)
class AutoBatch:
    """The batch ``auto`` chose for a stage, and why."""

    stage: str
    batch: int
    budget_bytes: int
    budget_from: str  # the config keys the budget came from
    projected_bytes: int  # the actor's projected memory at ``batch``
    cap: int  # rows whose images fill one forward
    images_per_forward: int
    fits: bool  # False: not even one row fits the budget (the batch is then 1)
    projected_of: str = ""  # whose projection it is, when not the whole actor's

    def line(self) -> str:
        """One line for ``cnsbench validate``."""
        head = f"{self.stage} batch_size auto: {self.batch} row{'s' if self.batch > 1 else ''}"
        budget = f"budget {self.budget_bytes / GB:.2f} GB from {self.budget_from}"
        if not self.fits:
            return f"{head}: even one row needs {self.projected_bytes / GB:.2f} GB, over the {budget}"
        limit = (f"; at most {self.cap}, whose images fill a forward of {self.images_per_forward}"
                 if self.batch == self.cap else "")
        whose = f" ({self.projected_of})" if self.projected_of else ""
        return f"{head}: projected {self.projected_bytes / GB:.2f} GB{whose}, {budget}{limit}"


def stage_budget(cfg: "BuildConfig", stage: str) -> tuple[int, str]:
    """Bytes one actor of ``stage`` may use, and the config keys that say so."""
    res = getattr(cfg.resources, stage)
    if res.memory_budget_gb == "auto":  # the classify actor's share of the run's device
        from pipeline.perf.device import classify_budget

        return classify_budget(cfg)
    if res.memory_budget_gb is not None:
        return int(res.memory_budget_gb * GB), f"resources.{stage}.memory_budget_gb"
    device = cfg.resources.device_memory_gb
    if device is None or res.num_gpus <= 0:  # the config's own validation refuses this
        raise CnsbenchError(f"resources.{stage}.batch_size auto: no memory_budget_gb and no device_memory_gb share")
    return int(device * res.num_gpus * GB), f"{res.num_gpus:g} x resources.device_memory_gb"


def largest_fitting(need: Callable[[int], int], budget: int, cap: int) -> int:
    """The largest batch in 1..``cap`` with ``need(batch) <= budget`` (``need`` non-decreasing);
    0 when not even 1 fits."""
    lo, hi = 0, cap  # need(lo) fits (0: nothing), the answer is in lo..hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo
