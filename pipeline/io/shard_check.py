"""Whether a committed shard's tables are what its manifest says, read from their footers.

A manifest vouches for its files by size (and, with ``--verify``, SHA-256), but a file
of the right size can still hold something else: garbage bytes, a Parquet of another
schema, or the right rows repeated a million times.  :func:`table_problems` reads only
the Parquet footer of each ``samples`` / ``predictions`` / ``failures`` file (a few KB,
whatever the file's size) and checks

- that it parses as Parquet at all;
- that it holds the columns every version of its schema has (:data:`REQUIRED`), with
  the types of :mod:`pipeline.io.tables` (newer optional columns may be absent: older
  outputs still read);
- its row counts against the manifest: ``samples`` rows = ``n_samples``, ``predictions``
  rows = ``n_samples`` x the classifiers the manifest lists (a multiple of ``n_samples``
  when it lists none), ``failures`` rows = the failed trajectories;
- that the shard holds no more trajectories than ``output.trajectories_per_shard`` of the
  output's ``config.json`` (a shard written under another config, e.g. by a second writer).

``cnsbench status`` lists a shard with problems and exits 3, a build quarantines it and
redoes its trajectories, ``aggregate`` leaves it out and says so on the report page.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io.manifest import (
    MANIFEST_DIR,
    QUARANTINE_DIR,
    ManifestProblem,
    ShardManifest,
)
from pipeline.io.ownership import OwnershipError, read_marker
from pipeline.io.tables import FAILURES, PREDICTIONS, SAMPLES

CHECK_THREADS = 8  # shards checked at once
TABLES = {"samples": SAMPLES, "predictions": PREDICTIONS, "failures": FAILURES}
# The columns of the first version of each table: every file of it must hold them.
REQUIRED = {
    "samples": ("sample_id", "trajectory_id", "class_id", "shift", "scale", "shard", "key", "kept"),
    "predictions": ("sample_id", "classifier", "top1", "correct"),
    "failures": ("trajectory_id", "error"),
}


def _footer(store: Any, rel: str) -> pq.FileMetaData:
    with store.fs.open(store.path(rel), "rb") as fh:
        return pq.ParquetFile(fh).metadata


def schema_problem(found: pa.Schema, kind: str) -> str | None:
    """Why a file with schema ``found`` cannot be read as the ``kind`` table, or None."""
    expected = TABLES[kind]
    missing = [c for c in REQUIRED[kind] if c not in found.names]
    if missing:
        return f"not a {kind} table: no column(s) {', '.join(missing)} (has {', '.join(found.names[:8])})"
    for want in expected:
        if want.name in found.names:
            have = found.field(want.name).type
            if have != want.type:
                return f"not a {kind} table: column {want.name} is {have}, expected {want.type}"
    return None


def table_problems(store: Any, manifest: ShardManifest, per_shard: int | None = None) -> list[str]:
    """What is wrong with the tables of a committed shard (empty when they are sound)."""
    problems: list[str] = []
    n_items = len(manifest.trajectories) + len(manifest.failed)
    if per_shard is not None and n_items > per_shard:
        problems.append(
            f"holds {n_items} trajectories but config.json says output.trajectories_per_shard: {per_shard} "
            "(written under another config, e.g. by a second writer)"
        )
    rows = {kind: 0 for kind in TABLES}
    readable = True
    for rel in sorted(manifest.files):
        kind = rel.split("/", 1)[0]
        if kind not in TABLES:
            continue
        try:
            meta = _footer(store, rel)
            bad = schema_problem(meta.schema.to_arrow_schema(), kind)
        except FileNotFoundError:
            bad = "missing"
        except (pa.ArrowException, OSError, ValueError) as err:
            bad = f"not readable as Parquet ({str(err).splitlines()[0][:160]})"
        if bad:
            problems.append(f"{rel}: {bad}")
            readable = False
            continue
        rows[kind] += meta.num_rows
    if not readable:
        return problems
    n = manifest.n_samples
    if any(r.startswith("samples/") for r in manifest.files) and rows["samples"] != n:
        problems.append(f"samples: {rows['samples']} rows, the manifest says {n} images")
    if any(r.startswith("failures/") for r in manifest.files) and rows["failures"] != len(manifest.failed):
        problems.append(f"failures: {rows['failures']} rows for {len(manifest.failed)} failed trajectories")
    if any(r.startswith("predictions/") for r in manifest.files):
        k = len(manifest.classifiers) if manifest.classifiers is not None else None
        want = n * k if k is not None else None
        if (want is not None and rows["predictions"] != want) or (want is None and n and rows["predictions"] % n):
            expected = f"{n} images x {k} classifiers" if k is not None else f"a multiple of its {n} images"
            problems.append(f"predictions: {rows['predictions']} rows, expected {expected}")
    return problems


@dataclass
class Committed:
    """The committed shards of an output, checked: sound ones, damaged ones, manifest problems."""

    sound: list[ShardManifest] = field(default_factory=list)
    damaged: dict[str, tuple[ShardManifest, list[str]]] = field(default_factory=dict)  # shard -> (manifest, problems)
    problems: list[ManifestProblem] = field(default_factory=list)

    @property
    def done(self) -> set[str]:
        return {t for m in self.sound for t in m.trajectories}

    @property
    def failed(self) -> dict[str, str]:
        """Failures recorded by sound shards, not since redone."""
        done = self.done
        return {k: v for m in self.sound for k, v in m.failed.items() if k not in done}


def per_shard_of(store: Any) -> int | None:
    """``output.trajectories_per_shard`` of the output's ``config.json`` (None when not there)."""
    try:
        marker = read_marker(store)
    except OwnershipError:
        return None
    value = ((marker or {}).get("config", {}).get("output") or {}).get("trajectories_per_shard")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_committed(store: Any, deep: bool = False) -> Committed:
    """Every committed shard of ``store`` checked: files present with their sizes (``deep``:
    hashes), tables readable as their schemas with the manifest's row counts."""
    scan = store.scan()
    per_shard = per_shard_of(store)
    out = Committed(problems=list(scan.problems))

    def check(manifest: ShardManifest) -> list[str]:
        return store.verify_shard(manifest, deep=deep) or table_problems(store, manifest, per_shard)

    # Each shard costs a few small reads (a stat and a footer per file): overlap them, which
    # is what matters on object stores, where each is a request.
    with ThreadPoolExecutor(max_workers=CHECK_THREADS) as pool:
        results = list(pool.map(check, scan.manifests))
    for manifest, problems in zip(scan.manifests, results):
        if problems:
            out.damaged[manifest.shard] = (manifest, problems)
        else:
            out.sound.append(manifest)
    return out


def quarantine_shard(store: Any, manifest: ShardManifest, echo: Callable[[str], None] | None = None) -> str:
    """Move a damaged shard (its manifest first, which un-commits it, then its files) to
    ``previous/quarantine/<time>/``: kept for a look, never deleted; returns the folder."""
    dest = f"{QUARANTINE_DIR}/{time.strftime('%Y%m%dT%H%M%S')}"
    for rel in [f"{MANIFEST_DIR}/{manifest.shard}.json", *sorted(manifest.files)]:
        try:
            if store.exists(rel):
                store.move(rel, f"{dest}/{rel}")
        except FileNotFoundError:
            continue
    if echo:
        echo(f"[cnsbench] moved damaged shard {manifest.shard} to {dest}/; regenerating its trajectories")
    return dest
