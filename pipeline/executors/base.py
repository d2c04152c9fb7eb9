"""The executor contract: an executor runs a :class:`~pipeline.executors.chain.Chain`, nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from pipeline.errors import CnsbenchError
from pipeline.executors.chain import Chain

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import BuildConfig, StageResources


def stage_threads(resources: "StageResources") -> int:
    """A stage's torch intra-op threads under every runner: its ``num_cpus`` (at least 1).
    The runners must agree on it: a CPU's float reductions, so the images, depend on it."""
    return max(1, int(resources.num_cpus))


def _print_notice(message: str) -> None:
    print(f"[cnsbench] {message}", flush=True)


@dataclass(frozen=True)
class RunOptions:
    """How :meth:`Executor.run` feeds its chain (see there)."""

    num_blocks: int | None = None
    first_schema: Any = None
    on_shard: Callable[[dict], None] | None = None


class Executor:
    """Runs ``rows`` through ``chain`` (the last stage writes shards); yields one row per shard."""

    name = ""

    @classmethod
    def check_held(cls, spec: Any) -> None:
        """Refuse a classifier entry holding a model in memory (kind ``module``) that this
        executor cannot hand to its stages; in one process every object can be."""

    def __init__(self, cfg: "BuildConfig", address: str | None = None, notice=None) -> None:
        self.cfg = cfg
        self.address = address
        # Where the executor tells the user about a change it made to the plan's resources
        # (a GPU request on a CPU-only local cluster, the GPU budget's split, requests scaled
        # to fit a cluster): the command's own output, by default a [cnsbench] line.
        self.notice = notice or _print_notice

    def run(
        self,
        rows: Iterable[dict],
        output: str,
        chain: Chain,
        *,
        num_blocks: int | None = None,
        first_schema: Any = None,
        on_shard: Callable[[dict], None] | None = None,
    ) -> Iterator[dict]:
        """Run ``rows`` (of Arrow schema ``first_schema``) through ``chain`` into ``output``, split
        into ``num_blocks`` blocks (default one per row); yield, and pass to ``on_shard``, each
        row the last stage returns (one per committed shard).  ``chain`` is a :class:`Chain`: whoever
        builds the stages states their config and memory there, never the executor."""
        if not isinstance(chain, Chain):
            raise TypeError(f"an executor runs a pipeline.executors.chain.Chain, not {type(chain).__name__}: "
                            "build it with Chain(cfg, specs)")
        return self.execute(rows, output, chain, RunOptions(num_blocks, first_schema, on_shard))

    def execute(self, rows: Iterable[dict], output: str, chain: Chain, options: RunOptions) -> Iterator[dict]:
        """What :meth:`run` does, per executor."""
        raise NotImplementedError


def executor_class(runner: str) -> type[Executor]:
    """The executor class registered as ``runner`` (``ray``/``local`` are accepted aliases)."""
    from pipeline.registry import EXECUTOR_ALIASES, EXECUTORS

    try:
        return EXECUTORS.get(EXECUTOR_ALIASES.get(runner, runner))
    except KeyError as err:
        raise CnsbenchError(f"--runner: {err.args[0]} (or one of {', '.join(EXECUTOR_ALIASES)})") from None


def get_executor(runner: str, cfg: "BuildConfig", address: str | None = None, notice=None) -> Executor:
    """The executor registered as ``runner`` (``ray``/``local`` are accepted aliases)."""
    return executor_class(runner)(cfg, address, notice)
