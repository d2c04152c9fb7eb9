"""A chain: the stages of a run with their resolved resources, batch sizes and projected memory.

Whoever builds a run's stages (a build, an evaluation, slider training, adding classifiers)
hands the executor a :class:`Chain`; the executor asks it for its pools (:meth:`Chain.pools`)
and sizes a local Ray from it (:func:`pipeline.executors.ray_data.init_ray` names no stage).
Every pool of a generate, filter, classify or write stage declares its actor's projected host
memory (:func:`pipeline.perf.memory.actor_host_bytes`) unless its spec gives its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

from pipeline.executors.base import StageSpec

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import BuildConfig, StageResources

# Stages whose actor's host memory the projection knows.
PROJECTED = ("generate", "filter", "classify", "write")


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
    """The stages of a run, in order (a sequence of :class:`StageSpec`), for the config ``cfg``."""

    def __init__(self, cfg: "BuildConfig", specs: Iterable[StageSpec], *, project_memory: bool = True) -> None:
        self.cfg = cfg
        self.specs = list(specs)
        # False: only a spec's own ``memory`` is declared (a chain of hand-made specs).
        self.project_memory = project_memory

    def __getitem__(self, i):  # type: ignore[override]
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


def as_chain(cfg: "BuildConfig", chain: Sequence[StageSpec]) -> Chain:
    """``chain`` as a :class:`Chain` of ``cfg``: a plain list of specs is wrapped, each declaring
    only the memory its spec gives."""
    return chain if isinstance(chain, Chain) else Chain(cfg, chain, project_memory=False)
