"""One run of a command that writes an output: the lifecycle every driver shares.

Every command that writes an output (``build``, ``evaluate``, a card adding its model,
``refine``) runs the same steps, and only :class:`OutputRun` performs them:

1. claim the output and hold its lease for the run's life (:meth:`OutputRun.claim`);
2. compare with the config it was made with, or archive it (``--new-version``), read
   the committed set, check the classifiers' weights against those that made the
   predictions (:meth:`OutputRun.prepare`, nothing written yet);
3. clean what no manifest vouches for, write the config, start the tally
   (:meth:`OutputRun.start`);
4. run one or more chains of stages (:meth:`Running.run_chain`, each a
   :class:`~pipeline.executors.chain.Chain`; committing stages get the lease's token from
   :meth:`Running.commit_kwargs`) and add classifiers to the committed shards
   (:meth:`Running.add_classifiers`: all or nothing, an addition that fails or is
   interrupted is rolled back, :mod:`pipeline.io.rollback`);
5. finish: drop crash bookkeeping, aggregate, record the summary (:meth:`Running.finish`).

Steps 4 and 5 exist only on the :class:`Running` object that step 3 returns, so they cannot
be called before it.

What is already done is read from the output itself (the shard manifests), never from
memory or logs, so running the same command again resumes it.  The lease is the run's
own: no other module takes it as a parameter.
"""

from __future__ import annotations

import contextlib
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Iterator

from pipeline import __version__
from pipeline.config import BuildConfig, config_hash, dump_yaml, resolved_dict
from pipeline.config.resources import OUTPUT_CHANGING
from pipeline.errors import CnsbenchError
from pipeline.executors import Chain, StageSpec, get_executor
from pipeline.io.dataset_card import CARD, dataset_card
from pipeline.io.lease_file import LEASE
from pipeline.io.manifest import quarantine
from pipeline.io.ownership import ARCHIVE, claim_output, read_marker
from pipeline.io.safejson import dumps as strict_dumps
from pipeline.io.shard_check import check_committed, quarantine_shard
from pipeline.io.store import OutputStore

Echo = Callable[[str], None]

# Config sections a run may change on an existing output: they extend the plan or only
# affect how the work runs.  Any other difference would make old and new rows disagree.
EXTENSIBLE = {
    "benchmark.classes",
    "benchmark.seeds",
    "benchmark.shifts",
    "benchmark.name",
    "output.path",
    "aggregate",
    "slider_training",
    "refine",
    "sampling",  # an adaptive build's targets and cap: changing them extends the rounds
}

WEIGHTS_HINT = ("give the classifier another name (its predictions are then made anew from its present weights), "
                "or pass --new-version to archive the output and build it again")


class IncompatibleOutput(CnsbenchError):
    """The output was made with settings that would change existing rows."""


# --------------------------------------------------------------------------- summary
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


class ShardTally:
    """Counts the shards a runner reports as committed and shows the run's progress
    (:class:`pipeline.runtime.progress.Progress`: a live line on a terminal, periodic lines otherwise)."""

    def __init__(self, total: int, done_before: int, echo: Echo, what: str = "build") -> None:
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


# --------------------------------------------------------------------------- compatibility
def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else k))
        return out
    return {prefix: d}


def differing_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Key paths whose values differ, ignoring resources and sections a run may extend."""
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


def with_current_defaults(old: dict[str, Any]) -> dict[str, Any]:
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
    """Claim the output and compare with the config it was made with; raise if incompatible.

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
    old = with_current_defaults(old)
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
    """Move an existing output's files to ``previous/<old config hash>/`` (nothing is deleted)."""
    marker = read_marker(store)
    if marker is None:
        return None
    old_hash = marker["config_hash"][:12]
    dest = f"{ARCHIVE}/{old_hash}-{time.strftime('%Y%m%dT%H%M%S')}"
    for name in store.top_level():
        if name not in (ARCHIVE, LEASE):  # the lease stays with its holder
            store.move(name, f"{dest}/{name}")
    return dest


# --------------------------------------------------------------------------- committed set
def committed_trajectories(
    store: OutputStore, repair: bool = True, deep: bool = False, echo: Echo | None = None
) -> tuple[set[str], dict[str, str]]:
    """Trajectory ids of sound committed shards, and failures not since redone.

    A shard whose files are missing, have the wrong size (truncated), with ``deep`` the
    wrong SHA-256 (corrupted), or whose tables are not readable as their schemas with the
    manifest's row counts (:mod:`pipeline.io.shard_check`) does not count; with ``repair``
    it is moved to ``previous/quarantine/`` (manifest first, then its files), so its
    trajectories are planned and written again.  A manifest that is malformed or overlaps
    an earlier one never counts; with ``repair`` it is quarantined too
    (:func:`pipeline.io.manifest.quarantine`).  Read-only without ``repair``.
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


def clean_uncommitted(store: OutputStore, echo: Echo) -> None:
    """Remove files no manifest vouches for, and the previous run's attempt markers."""
    orphans = store.orphans(list(store.manifests()))
    for rel in orphans:
        store.remove(rel)
    if orphans:
        echo(f"[cnsbench] removed {len(orphans)} uncommitted file(s) left by an interrupted run")
    store.remove_tree("attempts")


def write_config(
    store: OutputStore, cfg: BuildConfig, weights: dict[str, str | None] | None = None, forget: Iterable[str] = (),
    probes: dict[str, dict[str, str]] | None = None,
) -> str:
    """Write the marker ``config.json`` (with each classifier's weights digest, ``weights``:
    those recorded before, updated with the given ones, less ``forget``'s: classifiers no
    shard holds; and so the probe records of models held in memory, ``probes``:
    :mod:`pipeline.stages.probe`), then ``config.yaml`` (never before the marker: a
    ``config.yaml`` alone is a user's, :mod:`pipeline.io.ownership`).  A classifier dropped
    from the config keeps its records: its predictions stay in the shards."""
    from pipeline.assets.weights import merged
    from pipeline.stages import probe

    digest = config_hash(cfg)
    forget = set(forget)
    marker = read_marker(store)
    recorded = {k: v for k, v in merged(marker, weights or {}).items() if k not in forget}
    probed = {k: v for k, v in {**probe.recorded(marker), **(probes or {})}.items() if k not in forget}
    store.write_text(
        "config.json",
        strict_dumps({"config_hash": digest, "config": resolved_dict(cfg), "cnsbench": __version__,
                      "weights": recorded, **({probe.KEY: probed} if probed else {})}, indent=1),
    )
    store.write_text("config.yaml", dump_yaml(cfg))
    write_dataset_card(store, cfg, digest)
    return digest


def write_dataset_card(store: OutputStore, cfg: BuildConfig, digest: str) -> None:
    """The output's ``README.md``, what the ecosystem's loaders read: it lists the committed
    files, so it is rewritten whenever they change (:mod:`pipeline.io.dataset_card`)."""
    store.write_text(CARD, dataset_card(cfg.benchmark.name, digest, store.manifests()))


# --------------------------------------------------------------------------- the run
class HeldStore:
    """A store whose lease this run holds, and how it runs chains (runner, address)."""

    def __init__(self, store: OutputStore, lease: Any, command: str, echo: Echo,
                 runner: str = "ray", address: str | None = None) -> None:
        self.store, self._lease, self.command, self.echo = store, lease, command, echo
        self.runner, self.address = runner, address

    @property
    def uri(self) -> str:
        return self.store.uri

    def ensure_held(self) -> None:
        """Stop (:class:`pipeline.io.lease.LeaseLost`) unless the run still holds its lease."""
        self._lease.ensure_held()


class StoreRun(HeldStore):
    """A held store with the chains run into it (:meth:`run_chain`).

    Made by :meth:`OutputRun.claim_store` for a store that is not an output (a slider store:
    no config, no tally, no report), and the base of :class:`Running`, an output's run after
    :meth:`OutputRun.start`."""

    def run_chain(self, rows: list[dict], chain: Chain, *, num_blocks: int | None = None, first_schema: Any = None,
                  on_shard: Callable[[dict], None] | None = None, notice: Echo | None = None) -> None:
        """Run ``rows`` through ``chain`` on the run's executor, with the chain's config; each row
        the chain returns goes to ``on_shard``; ``notice``: where the executor says what it
        changed about the resources."""
        if not rows:
            return
        executor = get_executor(self.runner, chain.cfg, self.address,
                                notice=notice or (lambda m: self.echo(f"[cnsbench] {m}")))
        with self._lease.guarding():
            for _ in executor.run(rows, self.uri, chain, num_blocks=num_blocks, first_schema=first_schema,
                                  on_shard=on_shard):
                pass


class OutputRun(HeldStore):
    """An output claimed for one run (see the module doc): made by :meth:`claim`, which holds the
    lease.  :meth:`prepare` reads what is there; :meth:`start` (or :meth:`start_on_committed`)
    begins writing and returns the :class:`Running` run, the only object that runs chains, adds
    classifiers and finishes: a step out of order cannot be written."""

    def __init__(self, store: OutputStore, lease: Any, command: str, echo: Echo,
                 runner: str = "ray", address: str | None = None) -> None:
        super().__init__(store, lease, command, echo, runner, address)
        self.cfg: BuildConfig | None = None
        self.stored: dict[str, Any] | None = None  # the config the output was made with
        self.done: set[str] = set()
        self.failed: dict[str, str] = {}
        self.weights_hint = WEIGHTS_HINT
        self.start_time = time.perf_counter()

    @classmethod
    @contextlib.contextmanager
    def claim(cls, uri: str, command: str, echo: Echo = print, *, runner: str = "ray",
              address: str | None = None) -> Iterator["OutputRun"]:
        """Claim the output ``uri`` (ours or new), hold its lease while the block runs, give it back."""
        from pipeline.io.lease import acquire

        from pipeline.io import rollback

        store = OutputStore(uri)
        claim_output(store)
        lease = acquire(store, command, echo)
        try:
            lease.ensure_held()
            rollback.roll_back(store, echo)  # an addition a killed process left unfinished
            yield cls(store, lease, command, echo, runner, address)
        finally:
            lease.release()

    @staticmethod
    @contextlib.contextmanager
    def claim_store(uri: str, command: str, echo: Echo = print, *, runner: str = "ray",
                    address: str | None = None) -> Iterator[StoreRun]:
        """Hold the lease of ``uri``, a store that is not an output (a slider store, which may hold
        the user's own files: not claimed), while the block runs (one writer at a time)."""
        from pipeline.io.lease import acquire

        store = OutputStore(uri)
        lease = acquire(store, command, echo)
        try:
            yield StoreRun(store, lease, command, echo, runner, address)
        finally:
            lease.release()

    @property
    def built_with(self) -> list[str]:
        """The classifiers the output's config named before this run."""
        return [c["name"] for c in self.stored["classifiers"]] if self.stored else []

    # 2. read what is there
    def prepare(self, cfg: BuildConfig, *, new_version: bool = False, verify: bool = False, repair: bool = True,
                weights_hint: str = WEIGHTS_HINT) -> "OutputRun":
        """Compare with the output's config (archive it with ``new_version``) and read the
        committed set (``verify``: every file's SHA-256; ``repair``: quarantine damaged
        shards); writes nothing but an archive or a quarantine.  ``weights_hint``: what a
        refusal of changed weights (:meth:`start`) tells the user to do."""
        self.cfg, self.weights_hint = cfg, weights_hint
        try:
            self.stored = check_compatible(self.store, cfg)
        except IncompatibleOutput:
            if not new_version:
                raise
            self.ensure_held()  # never archive an output another writer holds
            self.echo(f"[cnsbench] archived the previous build under {archive_previous(self.store)}")
            self.stored = None
        self.done, self.failed = committed_trajectories(self.store, repair=repair, deep=verify, echo=self.echo)
        return self

    def _check_weights(self, new_work: bool) -> tuple[dict[str, str | None], list[dict]]:
        """Digest the weights of the classifiers this run makes predictions with (all of them
        when it makes new trajectories, else those committed shards lack) and refuse one whose
        weights differ from those that made its earlier predictions: shards of one name never
        mix two models.  A model held in memory is checked whether it runs or not: its name
        must not get another model's numbers.  Classifiers that do not run keep their record.
        Returns the digests of those that run and the committed shards lacking classifiers
        (the rows of :meth:`Running.add_classifiers`)."""
        from pipeline.assets import weights
        from pipeline.stages.reclassify import missing_classifiers

        names = [c.name for c in self.cfg.classifiers]
        missing = missing_classifiers(self.store, names, self.built_with)
        running = set(names) if new_work else {n for r in missing for n in r["classifiers"]}
        held = {c.name for c in self.cfg.classifiers if c.held is not None}
        digests = weights.digests(self.cfg, running | held)
        weights.check_weights(self.uri, read_marker(self.store), digests, self.weights_hint)
        return {k: v for k, v in digests.items() if k in running}, missing

    # 3. begin writing
    def start(self, total: int, done_before: int, what: str | None = None) -> "Running":
        """Check the weights of the classifiers that will run (``total > done_before``: new
        trajectories, every classifier), clean files of an interrupted run, write the config,
        start the tally: the run, now :class:`Running`."""
        if self.cfg is None:
            raise RuntimeError("OutputRun.start() before prepare(): nothing is known of the output yet")
        from pipeline.io import rollback
        from pipeline.stages import probe

        weights, missing = self._check_weights(new_work=total > done_before)
        records, pending = probe.check_run(self.store, self.cfg, weights, self.weights_hint)
        clean_uncommitted(self.store, self.echo)
        self.ensure_held()
        if missing:  # the config, these manifests and records as they are, until every shard holds the additions
            rollback.begin(self.store, sorted({n for r in missing for n in r["classifiers"]}),
                           [r["shard"] for r in missing], [rel for rel, _ in records.values()])
        probes = {name: probe.write(self.store, *found) for name, found in records.items()}
        digest = write_config(self.store, self.cfg, weights, probes=probes)
        return Running(self, digest, missing, ShardTally(total, done_before, self.echo, what=what or self.command),
                       probe.Pending(self.store, self.cfg, pending, weights, self.ensure_held))

    def start_on_committed(self, what: str | None = None) -> "Running":
        """:meth:`start` for a run that makes no new trajectories (a card adding its classifier,
        a refinement re-aggregating the report): the tally counts the committed ones."""
        return self.start(len(self.done), len(self.done), what=what)

    # an output's config rewritten without work (classifiers no shard holds)
    def rewrite_config(self, cfg: BuildConfig, forget: Iterable[str]) -> None:
        """Write ``cfg`` as the output's config, forgetting the weights of ``forget``."""
        self.ensure_held()
        write_config(self.store, cfg, forget=forget)


class Running(StoreRun):
    """An output's run after :meth:`OutputRun.start`: runs chains (4), adds classifiers to the
    committed shards (4) and finishes (5)."""

    def __init__(self, run: OutputRun, digest: str, missing: list[dict], tally: ShardTally,
                 probing: Any = None) -> None:
        super().__init__(run.store, run._lease, run.command, run.echo, run.runner, run.address)
        self.cfg: BuildConfig = run.cfg
        self.done, self.built_with = run.done, run.built_with
        self.digest, self.tally, self.start_time = digest, tally, run.start_time
        self._missing = missing  # committed shards lacking classifiers
        self._probing = probing  # held models to probe once images are committed (pipeline.stages.probe.Pending)

    def commit_kwargs(self) -> dict[str, str]:
        """Constructor kwargs of a stage that commits: the token it checks before each commit."""
        return {"lease_token": self._lease.info.token}

    # 4. run chains
    def run_chain(self, rows: list[dict], chain: Chain, *, num_blocks: int | None = None, first_schema: Any = None,
                  count: bool = True, on_shard: Callable[[dict], None] | None = None,
                  notice: Echo | None = None) -> None:
        """:meth:`StoreRun.run_chain`, each row the chain returns counted by the tally unless
        ``on_shard`` is given or ``count`` is False; the first committed shard lets the held
        models this run makes predictions with be probed."""
        handler = on_shard or (self.tally if count else None)
        if self._probing is not None and self._probing.waiting:
            handler = self._probing.after(handler)
        super().run_chain(rows, chain, num_blocks=num_blocks, first_schema=first_schema,
                          on_shard=handler, notice=notice)

    def add_classifiers(self) -> None:
        """Run the config's classifiers that committed shards lack on their images (the
        reclassify stage, which commits each shard itself: no writer after it).  All or
        nothing (:mod:`pipeline.io.rollback`): a failure or an interruption (Ctrl-C) puts
        the config and the shards back as they were before :meth:`OutputRun.start`."""
        from pipeline.io import rollback
        from pipeline.stages.reclassify import RECLASSIFY, ReclassifyStage

        rows = self._missing
        if not rows:
            return
        names = sorted({n for r in rows for n in r["classifiers"]})
        self.echo(f"[cnsbench] adding predictions of {', '.join(names)} to {len(rows)} committed shard(s)")
        chain = Chain(self.cfg, [StageSpec(ReclassifyStage, {"built_with": self.built_with, **self.commit_kwargs()},
                                           batch_size=1)])
        try:
            self.run_chain(rows, chain, num_blocks=len(rows), first_schema=RECLASSIFY, count=False)
        except BaseException:
            self._roll_back()
            raise
        rollback.end(self.store)
        self._missing = []
        self.ensure_held()
        write_dataset_card(self.store, self.cfg, self.digest)  # the loaders' card names the new predictions

    def _roll_back(self) -> None:
        """Undo this run's additions while the lease is still ours (else the next holder does)."""
        from pipeline.io import rollback

        try:
            self.ensure_held()
            rollback.roll_back(self.store, self.echo)
        except Exception as err:  # noqa: BLE001 - the run's own error is the one to raise
            self.echo(f"[cnsbench] could not roll back the addition ({type(err).__name__}: {err}); "
                      f"the next run on {self.uri} rolls it back, or `cnsbench status {self.uri} --roll-back`")

    # 5. finish
    def finish(self, *, aggregate: bool, run_name: str = "", run_info: dict | None = None) -> BuildSummary:
        """Drop crash bookkeeping, aggregate (with ``aggregate``), and record the run's summary
        (each write only while the lease is still ours)."""
        from pipeline.io import rollback

        tally = self.tally
        tally.progress.close()
        if self._probing is not None:
            self._probing.at_end()
        self.ensure_held()
        self.store.remove_tree("attempts")  # crash bookkeeping is per run
        rollback.end(self.store)  # a run that did not add what its config names says so in status
        write_dataset_card(self.store, self.cfg, self.digest)  # the shards this run committed
        _, failed = committed_trajectories(self.store, repair=False)
        report = None
        if aggregate:
            from pipeline.aggregate.run import aggregate_output

            self.ensure_held()
            report = aggregate_output(self.store, self.cfg, self.digest, echo=tally.echo)
        summary = BuildSummary(
            output=self.uri,
            config_hash=self.digest,
            trajectories_planned=tally.total,
            trajectories_done_before=tally.done_before,
            trajectories_written=tally.traj,
            trajectories_failed=len(failed),
            images_written=tally.images,
            shards_written=tally.shards,
            unet_evals_per_image=tally.evals / tally.images if tally.evals and tally.images else None,
            images_per_s_per_generator=tally.images / tally.gen_s if tally.gen_s else None,
            wall_seconds=time.perf_counter() - self.start_time,
            failed=failed,
            report=report,
        )
        self.ensure_held()
        self.store.write_text(
            f"runs/{time.strftime('%Y%m%dT%H%M%S')}-{self.digest[:8]}{run_name}.json",
            strict_dumps({**asdict(summary), "host": platform.node(), "runner": self.runner, **(run_info or {})},
                         indent=1),
        )
        return summary
