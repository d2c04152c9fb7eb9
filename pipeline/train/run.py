"""Training every (class, shift) slider of a config: plan, skip the done ones, run, summarise.

Role: the driver of ``cnsbench train-sliders`` (:mod:`pipeline.cli.train_sliders`).  The
pairs are :class:`~pipeline.train.sliders.SliderJob` rows handed to the same executors as
a build (:mod:`pipeline.executors`) through the train stage
(:mod:`pipeline.train.stage`), whose workers train with
:class:`~pipeline.train.sliders.SliderTrainer`.  A pair whose slider file and metadata
JSON exist is skipped, so running again resumes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from pipeline.config import BuildConfig
from pipeline.errors import CnsbenchError
from pipeline.train.sliders import (
    LOG_PREFIX,
    SliderJob,
    is_done,
    missing_training_assets,
    plan_slider_jobs,
    positive_prompt,
)


@dataclass
class TrainSummary:
    total: int
    trained: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # job labels
    failed: dict[str, str] = field(default_factory=dict)  # job label -> error
    seconds: float = 0.0

    def lines(self) -> list[str]:
        out = [
            f"sliders: {self.total} pairs, {len(self.trained)} trained, {len(self.skipped)} skipped (done), "
            f"{len(self.failed)} failed in {self.seconds:.1f} s"
        ]
        for label, err in sorted(self.failed.items()):
            out.append(f"failed {label}: {err.strip().splitlines()[0] if err.strip() else err}")
        return out


def train_sliders(
    cfg: BuildConfig,
    store: str,
    *,
    address: str | None = None,
    runner: str = "ray",
    echo: Callable[[str], None] = print,
) -> TrainSummary:
    """Train every (class, shift) slider of ``cfg.benchmark`` into ``store``; resumable.

    A pair whose slider file and metadata JSON both exist is skipped.  ``runner="ray"``
    runs one actor per worker (``slider_training.resources``: GPUs, CPUs, pool size,
    retries), connecting to ``address`` or starting a local Ray (and stopping it after);
    ``runner="local"`` trains in this process.  One progress line per pair goes to
    ``echo``.  A pair that fails is reported in the summary; the others go on.
    """
    if runner not in ("ray", "local"):
        raise CnsbenchError(f"train_sliders: runner must be 'ray' or 'local', got {runner!r}")
    start = time.perf_counter()
    positive_prompt(cfg.slider_training, "<token>", "some_shift")  # a bad placeholder fails here, not per pair
    jobs = plan_slider_jobs(cfg, store)
    done = [is_done(job) for job in jobs]
    todo = [job for job, d in zip(jobs, done) if not d]
    # Check everything training will load before any worker starts or model loads.
    missing = missing_training_assets(cfg) if todo else []
    if missing:
        from pipeline.assets import AssetError

        raise AssetError("slider training needs files that are missing:\n  " + "\n  ".join(missing))
    from pipeline.runtime.progress import Progress

    summary = TrainSummary(total=len(jobs))
    # Printing (the CLI): a progress line, live on a terminal, with the per-slider lines above
    # it.  A caller's own echo gets the per-slider lines only.
    progress = Progress("train-sliders", len(jobs), unit="sliders", done=len(jobs) - len(todo)) if echo is print else None
    echo = progress.log if progress else echo
    counter = iter(range(1, len(jobs) + 1))
    for job, d in zip(jobs, done):
        if d:
            summary.skipped.append(job.label)
            echo(f"{LOG_PREFIX} {next(counter)}/{len(jobs)} {job.label}: skipped (done: {job.meta_path})")

    def record(job: SliderJob, result: dict[str, Any] | None, error: str | None) -> None:
        n = next(counter)
        if error is not None:
            summary.failed[job.label] = error
            first = error.strip().splitlines()[0] if error.strip() else error
            echo(f"{LOG_PREFIX} {n}/{len(jobs)} {job.label}: FAILED: {first}")
            if progress:
                progress.update(failed=1)
        else:
            summary.trained.append(result)
            echo(f"{LOG_PREFIX} {n}/{len(jobs)} {job.label}: final loss {result['final_loss']:.6g} "
                 f"({result['seconds']:.1f} s) -> {job.path}")
            if progress:
                progress.update(done=1)

    if todo:
        from pipeline.output_run import OutputRun
        from pipeline.train.stage import JOB, train_chain

        def on_row(row: dict[str, Any]) -> None:
            job = SliderJob(**json.loads(row["job"]))
            record(job, json.loads(row["result"]) if row["result"] else None, row["error"])

        # The slider store is not an output (it may hold the user's own sliders): only its
        # lease is held, so two trainings never write one store at once.
        with OutputRun.claim_store(store, "train-sliders", echo, runner=runner, address=address) as run:
            rows = [job.to_dict() for job in todo]
            # The chain sizes a local Ray: its one pool, the train stage at slider_training.resources.
            run.run_chain(rows, train_chain(cfg, store), num_blocks=len(rows),
                          first_schema=JOB, on_shard=on_row, notice=lambda m: echo(f"{LOG_PREFIX} {m}"))
    if progress:
        progress.close()
    summary.seconds = time.perf_counter() - start
    return summary
