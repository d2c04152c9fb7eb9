"""Executors: how a chain of stages runs (Ray Data actor pools, or in this process).

A stage is described once as a :class:`~pipeline.executors.chain.StageSpec` (stage class,
constructor arguments, resources, batch size), and a run's stages as a
:class:`~pipeline.executors.chain.Chain` (their resolved resources and projected memory); the
executor chosen by ``--runner`` (registry :data:`pipeline.registry.EXECUTORS`) runs the chain,
and nothing else, and yields one row per committed shard.  This is the only place that knows how work is executed.
"""

from pipeline.executors.base import Executor, executor_class, get_executor
from pipeline.executors.chain import Chain, StageSpec

__all__ = ["Chain", "Executor", "StageSpec", "executor_class", "get_executor"]
