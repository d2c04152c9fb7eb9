"""A chain: the stages of a run with their resolved resources, batch sizes and projected memory.

Whoever builds a run's stages (a build, an evaluation, a refinement, slider training, adding
classifiers) hands the executor a :class:`Chain`, the only thing an executor runs; the executor
asks it for its pools (:meth:`Chain.pools`) and sizes a local Ray from it
(:func:`pipeline.executors.ray_data.init_ray` names no stage).  Every pool of a generate,
filter, classify or write stage declares its actor's projected host memory
(:func:`pipeline.perf.memory.actor_host_bytes`), here and nowhere else, unless its spec gives
its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import BuildConfig, StageResources

# Stages whose actor's host memory the projection knows.
PROJECTED = ("generate", "filter", "classify", "write")


@dataclass(frozen=True)
class StageSpec:
    """One stage of a chain: its class, extra constructor kwargs, resources and batch size.

    ``resources`` is ``resources.<stage.name>`` of the config unless given; the batch size
    is the resources' unless given (the write stage batches one shard of trajectories).
    ``memory`` gives the bytes one actor is projected to hold in its host's memory (None: not
    known), asked for only where it is declared to Ray (:mod:`pipeline.executors.ray_data`).
    """

    stage: type
    kwargs: dict[str, Any] = field(default_factory=dict)
    resources: "StageResources | None" = None
    batch_size: int | None = None
    memory: Callable[[], int | None] | None = field(default=None, compare=False)

    def resolved(self, cfg: "BuildConfig") -> tuple["StageResources", int]:
        res = self.resources or getattr(cfg.resources, self.stage.name)
        if self.batch_size or res.batch_size != "auto":
            return res, self.batch_size or res.batch_size
        from pipeline.perf.memory import stage_batch_size  # batch_size auto: from the memory projection

        return res, stage_batch_size(cfg, self.stage.name)


def stage_name(spec: StageSpec) -> str:
    """The stage's registered name (``generate``, ``classify``, ...)."""
    return getattr(spec.stage, "name", None) or spec.stage.__name__


@dataclass(frozen=True)
class Pool:
    """One stage of a chain as an actor pool."""

    name: str  # the stage, or "classify group k of n"
    spec: StageSpec
    resources: "StageResources"
    batch_size: int
    memory: Callable[[], int | None]  # bytes one actor holds in its host's memory (None: not known)

    @property
    def stage(self) -> str:
        return stage_name(self.spec)

    @property
    def members(self) -> list[int] | None:
        """A classify group's classifiers (indices into the config's), None for every other pool."""
        members = self.spec.kwargs.get("classifiers")
        return list(members) if members is not None else None


class Chain(Sequence[StageSpec]):
    """The stages of a run, in order (a sequence of :class:`StageSpec`), for the config ``cfg``.

    A pool's memory is its spec's own ``memory`` where it gives one, else its stage's projection
    (:data:`PROJECTED`); ``project_memory=False`` declares only the specs' own (stand-in stages
    that hold no model, as the bench's)."""

    def __init__(self, cfg: "BuildConfig", specs: Iterable[StageSpec], *, project_memory: bool = True) -> None:
        self.cfg = cfg
        self.specs = list(specs)
        self.project_memory = project_memory

    def __getitem__(self, i):  # type: ignore[override]
        """A stage, or for a slice the chain of those stages."""
        if isinstance(i, slice):
            return Chain(self.cfg, self.specs[i], project_memory=self.project_memory)
        return self.specs[i]

    def __len__(self) -> int:
        return len(self.specs)

    def __iter__(self) -> Iterator[StageSpec]:
        return iter(self.specs)

    def __repr__(self) -> str:
        return f"Chain({', '.join(p.name for p in self.pools)})"

    @cached_property
    def pools(self) -> list[Pool]:
        """Each stage's pool: resources and batch size resolved, memory projected on demand."""
        n_classify = sum(1 for s in self.specs if stage_name(s) == "classify")
        out, k = [], 0
        for spec in self.specs:
            res, batch = spec.resolved(self.cfg)
            name = stage_name(spec)
            if name == "classify" and n_classify > 1:
                k += 1
                name = f"classify group {k} of {n_classify}"
            out.append(Pool(name, spec, res, batch, spec.memory or self._projection(spec)))
        return out

    def _projection(self, spec: StageSpec) -> Callable[[], int | None]:
        stage, cfg = stage_name(spec), self.cfg
        if stage not in PROJECTED or not self.project_memory:
            return lambda: None

        def project() -> int | None:
            from pipeline.perf.memory import actor_host_bytes

            return actor_host_bytes(cfg, stage, spec.kwargs.get("classifiers"))

        return project

    def local_cpus(self) -> float:
        """Logical CPUs for one actor of every pool at its ``pool_size``."""
        return sum(p.resources.num_cpus * p.resources.pool_size for p in self.pools)

