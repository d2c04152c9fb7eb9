"""A build from start to finish: check, plan against what is committed, run, aggregate.

What is already done is read from the output itself (the shard manifests), never from
memory or logs, so running the same build again resumes it, and a config that adds
classes, seeds or shifts computes only the new trajectories.
"""

from __future__ import annotations

import contextlib
import logging
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable

from pipeline import __version__, plan

from pipeline.plan import schema
from pipeline.assets import check_build
from pipeline.config import BuildConfig, config_hash, dump_yaml, resolved_dict
from pipeline.config.resources import OUTPUT_CHANGING
from pipeline.executors import StageSpec, get_executor
from pipeline.io.lease_file import LEASE
from pipeline.io.manifest import quarantine
from pipeline.io.ownership import ARCHIVE, claim_output
from pipeline.io.safejson import dumps as strict_dumps
from pipeline.io.shard_check import check_committed, quarantine_shard
from pipeline.io.store import OutputStore

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.io.lease import Lease

log = logging.getLogger(__name__)

# Config sections a build may change on an existing output: they extend the plan or only
# affect how the work runs.  Any other difference would make old and new rows disagree.
EXTENSIBLE = {
    "benchmark.classes",
    "benchmark.seeds",
    "benchmark.shifts",
    "benchmark.name",
    "output.path",
    "aggregate",
    "slider_training",
}


WEIGHTS_HINT = ("give the classifier another name (its predictions are then made anew from its present weights), "
                "or pass --new-version to archive the output and build it again")


class IncompatibleOutput(ValueError):
    """The output was built with settings that would change existing rows."""


@dataclass
class BuildSummary:
    output: str
    config_hash: str
    trajectories_planned: int
    trajectories_done_before: int
    trajectories_written: int
    trajectories_failed: int
    images_written: int
    shards_written: int
    unet_evals_per_image: float | None
    images_per_s_per_generator: float | None
    wall_seconds: float
    failed: dict[str, str] = field(default_factory=dict)
    report: str | None = None

    def lines(self) -> list[str]:
        out = [
            f"output: {self.output}",
            f"trajectories: {self.trajectories_done_before} already done, {self.trajectories_written} written, "
            f"{self.trajectories_failed} failed (of {self.trajectories_planned} planned)",
            f"images written: {self.images_written} in {self.shards_written} shards, {self.wall_seconds:.1f} s",
        ]
        if self.unet_evals_per_image is not None:
            out.append(
                f"generation: {self.unet_evals_per_image:.1f} UNet sample-evaluations per image, "
                f"{self.images_per_s_per_generator:.2f} images/s per generation actor"
            )
        for tid, err in list(self.failed.items())[:10]:
            out.append(f"FAILED {tid}: {err.splitlines()[0]}")
        if self.report:
            out.append(f"report: {self.report}")
        return out


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else k))
        return out
    return {prefix: d}


def differing_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Key paths whose values differ, ignoring resources and sections a build may extend."""
    a, b = _flatten(old), _flatten(new)
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))

    def allowed(k: str) -> bool:
        # A stage's precision changes scores and predictions: shards of two precisions must not mix.
        if k.startswith("resources."):
            return k not in OUTPUT_CHANGING
        return any(k == e or k.startswith(e + ".") for e in EXTENSIBLE)

    # Scales are not extensible: they define every trajectory and its failure point.
    return [k for k in keys if not allowed(k)]


def _by_name(classifiers: list[dict[str, Any]]) -> dict[str, Any]:
    return {c["name"]: {k: v for k, v in c.items() if k != "name"} for c in classifiers}


def _with_current_defaults(old: dict[str, Any]) -> dict[str, Any]:
    """An older output's config with the keys added since filled with their defaults.

    Keys a newer version added (``families``, ``source``, ...) are absent from an older
    ``config.json``; their defaults reproduce what the older version did, so they must not
    count as changes.  A config the current version cannot parse is compared as stored.
    """
    from pipeline.config import ConfigError, parse_config

    if isinstance(old, dict) and "protocol" not in old:
        # Written before the protocol existed: its rows were made with each model's own
        # preprocessing and the label space's names, which is what ``custom`` does.
        old = {**old, "protocol": "custom"}
    try:
        return resolved_dict(parse_config(old, source="config.json"))
    except (ConfigError, ValueError):
        return old


def check_compatible(store: OutputStore, cfg: BuildConfig) -> dict[str, Any] | None:
    """Claim the output and compare with the config it was built with; raise if incompatible.

    The output must be ours (:func:`pipeline.io.ownership.claim_output`: a new or empty
    directory, or one with our marker), else OwnershipError and nothing is touched.
    Classifiers are compared by name: adding or dropping one is fine (only the new ones
    run, on the committed images), changing the spec behind a name is not.
    ``output.trajectories_per_shard`` may not change: it decides which trajectories share
    a shard, and committed shards must not overlap new ones.
    """
    marker = claim_output(store)
    if marker is None:
        return None
    old = marker["config"]
    stored = old
    old = _with_current_defaults(old)
    new = resolved_dict(cfg)
    old_c, new_c = _by_name(old.get("classifiers", [])), _by_name(new["classifiers"])
    old = {**old, "classifiers": {n: old_c[n] for n in old_c if n in new_c}}
    new = {**new, "classifiers": {n: new_c[n] for n in new_c if n in old_c}}
    bad = differing_keys(old, new)
    if bad:
        flat_old, flat_new = _flatten(old), _flatten(new)
        detail = "\n".join(f"  {k}: {flat_old.get(k)!r} -> {flat_new.get(k)!r}" for k in bad[:30])
        raise IncompatibleOutput(
            f"{store.uri} was built with a different config; these keys would change existing outputs:\n{detail}\n"
            "Pass --new-version to archive the existing build under previous/ and start a new one, "
            "or use a new output directory."
        )
    return stored


def archive_previous(store: OutputStore) -> str | None:
    """Move an existing build's files to ``previous/<old config hash>/`` (nothing is deleted)."""
    from pipeline.io.ownership import read_marker

    marker = read_marker(store)
    if marker is None:
        return None
    old_hash = marker["config_hash"][:12]
    dest = f"{ARCHIVE}/{old_hash}-{time.strftime('%Y%m%dT%H%M%S')}"
    for name in store.top_level():
        if name not in (ARCHIVE, LEASE):  # the lease stays with its holder
            store.move(name, f"{dest}/{name}")
    return dest


def committed_trajectories(
    store: OutputStore, repair: bool = True, deep: bool = False, echo: Callable[[str], None] | None = None
) -> tuple[set[str], dict[str, str]]:
    """Trajectory ids of sound committed shards, and failures not since redone.

    A shard whose files are missing, have the wrong size (truncated), with ``deep`` the
    wrong SHA-256 (corrupted), or whose tables are not readable as their schemas with the
    manifest's row counts (:mod:`pipeline.io.shard_check`) does not count; with ``repair``
    it is moved to ``previous/quarantine/`` (manifest first, then its files), so its
    trajectories are planned and written again.  A manifest that is malformed or overlaps
    an earlier one never counts; with ``repair`` it is quarantined too
    (:func:`pipeline.io.manifest.quarantine`).
    """
    committed = check_committed(store, deep=deep)
    if repair and committed.problems:
        quarantine(store, committed.problems, echo)
    for shard, (manifest, problems) in committed.damaged.items():
        if echo:
            echo(f"[cnsbench] shard {shard} is damaged ({'; '.join(problems)})")
        if repair:
            quarantine_shard(store, manifest, echo)
    return committed.done, committed.failed


def clean_uncommitted(store: OutputStore, echo: Callable[[str], None]) -> None:
    """Remove files no manifest vouches for, and the previous run's attempt markers."""
    orphans = store.orphans(list(store.manifests()))
    for rel in orphans:
        store.remove(rel)
    if orphans:
        echo(f"[cnsbench] removed {len(orphans)} uncommitted file(s) left by an interrupted run")
    store.remove_tree("attempts")


def add_classifiers(
    store: OutputStore, cfg: BuildConfig, built_with: list[str], runner: str, address: str | None, echo,
    lease: Lease | None = None,
) -> None:
    """Run newly configured classifiers on the images of already committed shards."""
    from pipeline.stages.reclassify import (
        RECLASSIFY,
        ReclassifyStage,
        missing_classifiers,
    )

    rows = missing_classifiers(store, [c.name for c in cfg.classifiers], built_with)
    if not rows:
        return
    names = sorted({n for r in rows for n in r["classifiers"]})
    echo(f"[cnsbench] adding predictions of {', '.join(names)} to {len(rows)} committed shard(s)")
    executor = get_executor(runner, cfg, address)
    # The reclassify stage commits each shard itself (one shard per batch): no writer after it.
    chain = [StageSpec(ReclassifyStage, {"built_with": built_with, **lease_kwargs(lease)}, batch_size=1)]
    with guarding(lease):
        for _ in executor.run(rows, store.uri, chain, num_blocks=len(rows), first_schema=RECLASSIFY):
            pass


def check_weights(store: OutputStore, cfg: BuildConfig, hint: str) -> dict[str, str | None]:
    """The weights digest of each of ``cfg``'s classifiers, after checking that none of those
    with predictions in ``store`` changed (:func:`pipeline.assets.weights.check_weights`)."""
    from pipeline.assets import weights
    from pipeline.io.ownership import read_marker

    current = weights.digests(cfg)
    weights.check_weights(store.uri, read_marker(store), current, hint)
    return current


def write_config(
    store: OutputStore, cfg: BuildConfig, weights: dict[str, str | None] | None = None, forget: set[str] = frozenset()
) -> str:
    """Write the marker ``config.json`` (with each classifier's weights digest, ``weights``:
    those recorded before, updated with the given ones, less ``forget``'s: classifiers no
    shard holds), then ``config.yaml`` (never before the marker: a ``config.yaml`` alone is a
    user's, :mod:`pipeline.io.ownership`).  A classifier dropped from the config keeps its
    record: its predictions stay in the shards."""
    from pipeline.assets.weights import merged
    from pipeline.io.ownership import read_marker

    digest = config_hash(cfg)
    recorded = {k: v for k, v in merged(read_marker(store), weights or {}).items() if k not in forget}
    store.write_text(
        "config.json",
        strict_dumps({"config_hash": digest, "config": resolved_dict(cfg), "cnsbench": __version__,
                      "weights": recorded}, indent=1),
    )
    store.write_text("config.yaml", dump_yaml(cfg))
    return digest


class ShardTally:
    """Counts the shards a runner reports as committed and shows the run's progress
    (:class:`pipeline.runtime.progress.Progress`: a live line on a terminal, periodic lines otherwise)."""

    def __init__(self, total: int, done_before: int, echo: Callable[[str], None], what: str = "build") -> None:
        from pipeline.runtime.progress import Progress

        self.total, self.done_before, self.echo = total, done_before, echo
        self.traj = self.images = self.shards = self.failed = 0
        self.evals = self.gen_s = 0.0
        # The live line only when printing to a terminal; a caller's own echo gets plain lines.
        self.progress = Progress(what, total, done=done_before, echo=None if echo is print else echo)

    def __call__(self, row: dict) -> None:
        self.traj += row["n_trajectories"]
        self.images += row["n_samples"]
        self.shards += 1
        self.failed += row["n_failed"]
        self.evals += row["unet_evals"]
        self.gen_s += row["gen_seconds"]
        if row["n_failed"]:
            self.progress.log(f"[cnsbench] shard {row['shard']}: {row['n_failed']} trajectories failed")
        self.progress.update(done=row["n_trajectories"], images=row["n_samples"], failed=row["n_failed"])


def finish_run(
    store: OutputStore,
    cfg: BuildConfig,
    digest: str,
    tally: ShardTally,
    *,
    start: float,
    runner: str,
    aggregate: bool,
    run_name: str = "",
    run_info: dict | None = None,
    lease: Lease | None = None,
) -> BuildSummary:
    """After a run: drop crash bookkeeping, aggregate, and record the run's summary
    (each write only while ``lease`` is still ours)."""
    tally.progress.close()
    ensure_held(lease)
    store.remove_tree("attempts")  # crash bookkeeping is per run
    _, failed = committed_trajectories(store, repair=False)
    report = None
    if aggregate:
        from pipeline.aggregate.run import aggregate_output

        ensure_held(lease)
        report = aggregate_output(store, cfg, digest, echo=tally.echo)
    summary = BuildSummary(
        output=store.uri,
        config_hash=digest,
        trajectories_planned=tally.total,
        trajectories_done_before=tally.done_before,
        trajectories_written=tally.traj,
        trajectories_failed=len(failed),
        images_written=tally.images,
        shards_written=tally.shards,
        unet_evals_per_image=tally.evals / tally.images if tally.evals and tally.images else None,
        images_per_s_per_generator=tally.images / tally.gen_s if tally.gen_s else None,
        wall_seconds=time.perf_counter() - start,
        failed=failed,
        report=report,
    )
    ensure_held(lease)
    store.write_text(
        f"runs/{time.strftime('%Y%m%dT%H%M%S')}-{digest[:8]}{run_name}.json",
        strict_dumps({**asdict(summary), "host": platform.node(), "runner": runner, **(run_info or {})}, indent=1),
    )
    return summary


def build(cfg: BuildConfig, output: str, *, echo: Callable[[str], None] = print, **kwargs: Any) -> BuildSummary:
    """Run (or resume) a build of ``cfg`` into ``output`` and aggregate its report.

    Holds the output's lease throughout (:mod:`pipeline.io.lease`: one writer per output).
    ``new_version`` archives an incompatible existing build instead of refusing it;
    ``verify`` checks every committed file's SHA-256, not only its size; ``stages`` is what
    runs (:class:`Stages`, default :data:`MODEL_STAGES`).
    """
    from pipeline.io.lease import hold_lease

    with hold_lease(output, "build", echo) as lease:
        return _build(cfg, output, echo=echo, lease=lease, **kwargs)


def _build(
    cfg: BuildConfig,
    output: str,
    *,
    address: str | None = None,
    runner: str = "ray",
    aggregate: bool = True,
    new_version: bool = False,
    verify: bool = False,
    echo: Callable[[str], None] = print,
    lease: Lease | None = None,
    stages: Stages | None = None,
) -> BuildSummary:
    stages = stages or MODEL_STAGES
    start = time.perf_counter()
    store = OutputStore(output)
    stored = None
    try:
        stored = check_compatible(store, cfg)
    except IncompatibleOutput:
        if not new_version:
            raise
        ensure_held(lease)  # never archive an output another writer holds
        echo(f"[cnsbench] archived the previous build under {archive_previous(store)}")
    done, _ = committed_trajectories(store, deep=verify, echo=echo)
    built_with = [c["name"] for c in stored["classifiers"]] if stored else []
    weights = check_weights(store, cfg, WEIGHTS_HINT)
    units = plan.plan_units(cfg, done)
    summary_plan = plan.summarize(cfg)
    stages.check(cfg, {(u.class_id, s) for u in units for s in u.shifts})
    clean_uncommitted(store, echo)
    ensure_held(lease)
    digest = write_config(store, cfg, weights)
    todo = sum(len(u.shifts) for u in units)
    done_before = summary_plan.n_trajectories - todo
    echo(f"[cnsbench] {summary_plan.n_trajectories} trajectories planned, {done_before} already done, {todo} to make")

    tally = ShardTally(summary_plan.n_trajectories, done_before, echo)

    add_classifiers(store, cfg, built_with, runner, address, echo, lease)
    if units:
        executor = get_executor(runner, cfg, address)
        # One work unit per block, so generation spreads across the actors from the start.
        rows = [u.to_row() for u in units]
        chain = stages.chain(cfg, lease)
        with guarding(lease):
            for _ in executor.run(rows, store.uri, chain, num_blocks=len(rows), first_schema=schema.UNIT, on_shard=tally):
                pass

    return finish_run(store, cfg, digest, tally, start=start, runner=runner, aggregate=aggregate, lease=lease)


def ensure_held(lease: Lease | None) -> None:
    """Stop (:class:`pipeline.io.lease.LeaseLost`) unless the run still holds its output's lease."""
    if lease is not None:
        lease.ensure_held()


def guarding(lease: Lease | None):
    """:meth:`pipeline.io.lease.Lease.guarding`, or nothing without a lease."""
    return lease.guarding() if lease is not None else contextlib.nullcontext()


def lease_kwargs(lease: Lease | None) -> dict[str, str]:
    """Constructor kwargs of a committing stage: the token it checks before each commit."""
    return {"lease_token": lease.info.token} if lease is not None else {}


def build_chain(cfg: BuildConfig, lease: Lease | None = None) -> list[StageSpec]:
    """The stages of a build: generate -> filter -> classify (a stage per classifier group) -> write,
    each with its actor's projected memory (:func:`pipeline.perf.memory.actor_host_bytes`)."""
    from pipeline.perf.memory import actor_host_bytes
    from pipeline.stages.classify import classify_specs
    from pipeline.stages.filter import FilterStage
    from pipeline.stages.generate import GenerateStage
    from pipeline.stages.write import WriteStage

    def memory(stage: str, members: list[int] | None = None) -> Callable[[], int | None]:
        return lambda: actor_host_bytes(cfg, stage, members)

    return [
        StageSpec(GenerateStage, memory=memory("generate")),
        StageSpec(FilterStage, memory=memory("filter")),
        *[replace(s, memory=memory("classify", s.kwargs.get("classifiers"))) for s in classify_specs(cfg)],
        StageSpec(WriteStage, lease_kwargs(lease), batch_size=cfg.output.trajectories_per_shard, memory=memory("write")),
    ]


@dataclass(frozen=True)
class Stages:
    """What a build runs: its chain of stages (``chain(cfg, lease)``) and the check, before the
    run, that what they load is there (``check(cfg, (class_id, shift) pairs to make)``).
    :data:`MODEL_STAGES` is the build's own; a simulation hands :func:`build` stand-ins."""

    chain: Callable[[BuildConfig, "Lease | None"], list[StageSpec]]
    check: Callable[[BuildConfig, set[tuple[int, str]]], None]


MODEL_STAGES = Stages(build_chain, check_build)
