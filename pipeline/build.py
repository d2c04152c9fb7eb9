"""A build from start to finish: check, plan against what is committed, run, aggregate.

A recipe over :class:`pipeline.output_run.OutputRun`, which owns the output's lifecycle
(lease, compatibility, committed set, cleaning, config, tally, finish).  What is already
done is read from the output itself (the shard manifests), so running the same build again
resumes it, and a config that adds classes, seeds or shifts computes only the new
trajectories.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from pipeline import plan
from pipeline.assets import check_build
from pipeline.config import BuildConfig
from pipeline.executors import Chain, StageSpec
from pipeline.output_run import BuildSummary, OutputRun
from pipeline.plan import schema

log = logging.getLogger(__name__)


def build(
    cfg: BuildConfig,
    output: str,
    *,
    address: str | None = None,
    runner: str = "ray",
    aggregate: bool = True,
    new_version: bool = False,
    verify: bool = False,
    echo: Callable[[str], None] = print,
    stages: "Stages | None" = None,
) -> BuildSummary:
    """Run (or resume) a build of ``cfg`` into ``output`` and aggregate its report.

    Holds the output's lease throughout (:mod:`pipeline.io.lease`: one writer per output).
    ``new_version`` archives an incompatible existing build instead of refusing it;
    ``verify`` checks every committed file's SHA-256, not only its size; ``stages`` is what
    runs (:class:`Stages`, default :data:`MODEL_STAGES`).
    """
    from pipeline.io.ownership import refuse_inside_output

    stages = stages or MODEL_STAGES
    refuse_inside_output(output)  # e.g. an output's refinement store: never archived or built into
    with OutputRun.claim(output, "build", echo, runner=runner, address=address) as run:
        # 1. compare with the output's config, read what is committed, check the weights
        run.prepare(cfg, new_version=new_version, verify=verify)
        if cfg.sampling is not None:  # rounds until the headline numbers are known (docs/adaptive.md)
            return _adaptive(run, cfg, stages, aggregate, echo)
        # 2. plan what is not committed, and check that everything it loads is there
        units = plan.plan_units(cfg, run.done)
        stages.check(cfg, {(u.class_id, s) for u in units for s in u.shifts})
        total = plan.summarize(cfg).n_trajectories
        todo = sum(len(u.shifts) for u in units)
        # 3. clean, write the config, start counting
        running = run.start(total, total - todo)
        echo(f"[cnsbench] {total} trajectories planned, {total - todo} already done, {todo} to make")
        # 4. new classifiers on the committed images, then the plan (one work unit per block,
        #    so generation spreads across the actors from the start)
        running.add_classifiers()
        running.run_chain([u.to_row() for u in units], stages.chain(cfg, running.commit_kwargs()),
                          num_blocks=len(units), first_schema=schema.UNIT)
        # 5. report and summary
        return running.finish(aggregate=aggregate)


def _adaptive(run: OutputRun, cfg: BuildConfig, stages: "Stages", aggregate: bool,
              echo: Callable[[str], None]) -> BuildSummary:
    """An adaptive build: each round a build of the trajectories its allocation adds, the next
    allocation replayed from what is then committed (so a resumed build makes the same one)."""
    from pipeline.aggregate.adaptive import replay, steering_classifiers
    from pipeline.aggregate.run import load_sound_tables
    from pipeline.output_run import committed_trajectories
    from pipeline.plan.adaptive import adaptive_units, strata_of

    stages.check(cfg, set(strata_of(cfg.benchmark.classes, cfg.all_shifts())))  # any stratum may get seeds
    total = plan.summarize(cfg).n_trajectories
    running = run.start(total, len(run.done))
    echo(f"[cnsbench] adaptive build: up to {total} trajectories (the uniform design), "
         f"{len(run.done)} already done, cap {cfg.sampling.max_images} images")
    running.add_classifiers()
    done, failed = set(run.done), set(run.failed)
    tried: set[str] = set()  # failed in this run: not retried round after round
    while True:
        samples, predictions, _ = load_sound_tables(run.store)
        sched = replay(cfg, samples, predictions, done | failed, steering_classifiers(run.store, cfg))
        if sched.stop is not None:
            echo(f"[cnsbench] adaptive build: {sched.stop} after {len(sched.rounds)} round(s), "
                 f"{sum(sched.current)} trajectories")
            break
        units = adaptive_units(sched, cfg.benchmark.seeds, cfg.benchmark.class_name, done | tried)
        if not units:
            break  # nothing left to make this run (failures retried by the next run)
        echo(f"[cnsbench] round {len(sched.rounds) - 1}: {sum(len(u.shifts) for u in units)} trajectories to make")
        running.run_chain([u.to_row() for u in units], stages.chain(cfg, running.commit_kwargs()),
                          num_blocks=len(units), first_schema=schema.UNIT)
        tried |= {plan.trajectory_id(s, u.class_id, u.seed) for u in units for s in u.shifts}
        committed, failures = committed_trajectories(run.store, repair=False)
        done, failed = set(committed), set(failures) | failed
    return running.finish(aggregate=aggregate)


def build_chain(cfg: BuildConfig, commit: dict[str, str] | None = None) -> Chain:
    """The stages of a build: generate -> filter -> classify (a stage per classifier group) -> write,
    each with its actor's projected memory (:class:`Chain`); ``commit``: the writer's commit
    kwargs (:meth:`pipeline.output_run.Running.commit_kwargs`)."""
    from pipeline.stages.classify import classify_specs
    from pipeline.stages.filter import FilterStage
    from pipeline.stages.generate import GenerateStage
    from pipeline.stages.write import WriteStage

    return Chain(cfg, [
        StageSpec(GenerateStage),
        StageSpec(FilterStage),
        *classify_specs(cfg),
        StageSpec(WriteStage, dict(commit or {}), batch_size=cfg.output.trajectories_per_shard),
    ])


@dataclass(frozen=True)
class Stages:
    """What a build runs: its chain of stages (``chain(cfg, commit kwargs)``) and the check, before
    the run, that what they load is there (``check(cfg, (class_id, shift) pairs to make)``).
    :data:`MODEL_STAGES` is the build's own; a simulation hands :func:`build` stand-ins."""

    chain: Callable[[BuildConfig, dict[str, str]], Chain]
    check: Callable[[BuildConfig, set[tuple[int, str]]], None]


MODEL_STAGES = Stages(build_chain, check_build)
