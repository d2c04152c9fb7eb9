"""Shard manifests: their schema, our file naming scheme, and a scan that survives damage.

A manifest (``manifest/shard-<16 hex>.json``) is a shard's done-marker: it lists the
shard's files (size, SHA-256) and trajectories.  Everything in it is data from disk or a
bucket someone else may write to, so :func:`parse_manifest` checks it completely before
anything acts on it (:class:`ManifestDocument`, a model on the project's strict base):

- the document is a JSON object of exactly the manifest's keys with the right types;
- ``shard`` is the file's own name and looks like ``shard-<16 hex digits>``;
- every entry of ``files`` is a path of *this shard* in our naming scheme
  (:data:`OWN_FILE`: ``images/<shard>.tar``, ``samples|predictions|failures/<shard>.parquet``,
  ``predictions/<shard>.<8 hex>.parquet``), so a manifest can never make a repair read or
  delete anything else (``../../victim``, ``/etc/passwd``, another shard's files);
- sizes are integers >= 0 and hashes 64 hex digits; statistics are finite numbers.

:func:`scan_manifests` parses all manifests of an output.  A manifest that does not parse
(corrupt, truncated, schema-invalid) or whose trajectories overlap those of an earlier
committed manifest is a :class:`ManifestProblem`: it is left out of everything that
counts (aggregate, status, serve, resume), ``cnsbench status`` lists it, and a build or
evaluate moves it to ``previous/quarantine/`` (:func:`quarantine`) so its shard is redone.
"""

from __future__ import annotations

import logging
import posixpath
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import Field, StrictFloat, StrictInt, StrictStr, ValidationError, ValidationInfo, field_validator, model_validator

from pipeline.errors import CnsbenchError
from pipeline.io.retry import StorageError
from pipeline.io.safejson import dumps as strict_dumps, loads
from pipeline.io.strict import Strict, errors_of_type, first_problem

log = logging.getLogger(__name__)

MANIFEST_DIR = "manifest"
QUARANTINE_DIR = "previous/quarantine"
SHARD_NAME = re.compile(r"shard-[0-9a-f]{16}")
# Files a build writes for a shard (reclassify adds predictions/<shard>.<tag>.parquet).
OWN_FILE = re.compile(
    r"(?:images/(?P<tar>shard-[0-9a-f]{16})\.tar"
    r"|(?:samples|failures)/(?P<pq>shard-[0-9a-f]{16})\.parquet"
    r"|predictions/(?P<pred>shard-[0-9a-f]{16})(?:\.[0-9a-f]{8})?\.parquet)"
)
# An interrupted local write: .tmp-<uuid hex>-<own file name>
OWN_TMP = re.compile(r"\.tmp-[0-9a-f]{32}-(?P<name>.+)")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class ManifestError(CnsbenchError):
    """A manifest that cannot be trusted; the message names the file and the problem."""


@dataclass
class ShardManifest:
    shard: str
    trajectories: list[str]
    files: dict[str, dict[str, Any]]  # relative path -> {"size": int, "sha256": str}
    n_samples: int
    failed: dict[str, str]  # trajectory id -> error message
    stats: dict[str, float]
    classifiers: list[str] | None = None  # whose predictions it holds (None: the build config's)

    def to_json(self) -> str:
        return strict_dumps(self.__dict__, sort_keys=True, indent=1)

    @staticmethod
    def from_json(text: str | bytes, source: str) -> "ShardManifest":
        return parse_manifest(text, source)


def own_file_shard(rel: str) -> str | None:
    """The shard a relative path belongs to when it is in our naming scheme, else None."""
    m = OWN_FILE.fullmatch(rel)
    return (m.group("tar") or m.group("pq") or m.group("pred")) if m else None


def is_own_file(rel: str) -> bool:
    """Whether ``kind/name`` is a shard file or an interrupted write of one (ours to clean)."""
    if own_file_shard(rel):
        return True
    kind, _, name = rel.partition("/")
    m = OWN_TMP.fullmatch(name)
    if not m:
        return False
    inner = m.group("name")
    if kind == MANIFEST_DIR:
        return inner.endswith(".json") and SHARD_NAME.fullmatch(inner[:-5]) is not None
    return own_file_shard(f"{kind}/{inner}") is not None


class FileEntry(Strict):
    """One file of a shard: its size and SHA-256."""

    size: StrictInt = Field(ge=0)
    sha256: StrictStr = Field(pattern=_SHA256.pattern)


class ManifestDocument(Strict):
    """The schema of ``manifest/<shard>.json`` (what :func:`parse_manifest` accepts)."""

    shard: StrictStr = Field(pattern=f"^{SHARD_NAME.pattern}$")
    trajectories: list[StrictStr]
    files: dict[str, FileEntry]
    n_samples: StrictInt = Field(ge=0)
    failed: dict[str, StrictStr]
    stats: dict[str, StrictInt | StrictFloat]
    classifiers: list[StrictStr] | None = None

    @field_validator("shard")
    @classmethod
    def _named_as_its_file(cls, value: str, info: ValidationInfo) -> str:
        stem = (info.context or {}).get("file")  # the manifest's file name, when read from one
        if stem is not None and stem.endswith(".json") and stem[:-5] != value:
            raise CnsbenchError(f"names shard {value!r} but the file is {stem!r}")
        return value

    @field_validator("trajectories")
    @classmethod
    def _once(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise CnsbenchError("'trajectories' lists a trajectory twice")
        return value

    @model_validator(mode="after")
    def _own_files(self) -> "ManifestDocument":
        for rel in self.files:
            if own_file_shard(rel) != self.shard:
                raise CnsbenchError(
                    f"file entry {rel!r} is not a file of shard {self.shard} "
                    "(expected images/<shard>.tar, samples|predictions|failures/<shard>.parquet)"[:400]
                )
        return self


def _problem(loc: tuple[Any, ...], kind: str, value: Any) -> str:
    """The refusal of a value of the wrong type or range at ``loc`` (a key path of the manifest)."""
    key = loc[0]
    if key == "files":
        if len(loc) == 1:
            return f"'files' must map file paths to {{size, sha256}}, got {type(value).__name__}"
        rel = loc[1]
        if kind in ("missing", "extra_forbidden", "model_type"):
            return f"file entry {rel!r} must be {{\"size\": int, \"sha256\": hex}}"
        if len(loc) >= 3 and loc[2] == "size":
            return f"file entry {rel!r}: size must be an integer >= 0, got {value!r}"
        if len(loc) >= 3 and loc[2] == "sha256":
            return f"file entry {rel!r}: sha256 must be 64 hex digits"
        return f"file entry {rel!r} must be {{\"size\": int, \"sha256\": hex}}"
    return {
        "shard": f"'shard' must look like 'shard-<16 hex digits>', got {value!r}"[:300],
        "trajectories": "'trajectories' must be a list of strings",
        "n_samples": f"'n_samples' must be an integer >= 0, got {value!r}",
        "failed": "'failed' must map trajectory ids to error messages",
        "stats": "'stats' must map names to finite numbers",
        "classifiers": "'classifiers' must be a list of strings",
    }.get(key, f"{key!r} is not valid")


def parse_manifest(text: str | bytes, source: str) -> ShardManifest:
    """A fully checked :class:`ShardManifest` from ``text`` (:class:`ManifestDocument`);
    :class:`ManifestError` naming ``source`` and the key otherwise.

    ``source`` is the manifest's location; its file name must be ``<shard>.json``.
    """
    where = f"malformed manifest {source}"
    try:
        data = loads(text, source)
    except ValueError as err:
        raise ManifestError(f"{where}: {err}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{where}: must be a JSON object, got {type(data).__name__}")
    try:
        doc = ManifestDocument.model_validate(data, context={"file": posixpath.basename(source.rstrip("/"))})
    except ValidationError as err:
        missing, unknown = errors_of_type(err, "missing"), errors_of_type(err, "extra_forbidden")
        if missing or unknown:
            raise ManifestError(f"{where}: missing keys {missing}, unknown keys {unknown}") from None
        loc, kind, value, message = first_problem(err)
        raise ManifestError(f"{where}: {message if kind == 'value_error' else _problem(loc, kind, value)}") from None
    return ShardManifest(
        shard=doc.shard,
        trajectories=list(doc.trajectories),
        files={rel: entry.model_dump() for rel, entry in doc.files.items()},
        n_samples=doc.n_samples,
        failed=dict(doc.failed),
        stats=dict(doc.stats),
        classifiers=None if doc.classifiers is None else list(doc.classifiers),
    )


@dataclass(frozen=True)
class ManifestProblem:
    file: str  # relative to the output: manifest/<name>.json
    reason: str
    kind: str  # "malformed" | "overlap"

    def line(self) -> str:
        return f"{self.file}: {self.reason}"


@dataclass
class ManifestScan:
    manifests: list[ShardManifest] = field(default_factory=list)  # trusted, in name order
    problems: list[ManifestProblem] = field(default_factory=list)


def _listing(store: Any) -> list[tuple[str, float]]:
    """(relative path, modification time) of every ``manifest/*.json`` (one listing call)."""
    fs, base = store.fs, store.path(MANIFEST_DIR)
    if not store.local:
        fs.invalidate_cache()
    if not fs.exists(base):
        return []
    out = []
    for info in fs.ls(base, detail=True):
        name = posixpath.basename(str(info["name"]).rstrip("/"))
        if not name.endswith(".json") or name.startswith(".tmp-") or info.get("type") == "directory":
            continue
        mtime = info.get("mtime") or info.get("LastModified") or info.get("updated") or 0
        if hasattr(mtime, "timestamp"):
            mtime = mtime.timestamp()
        try:
            mtime = float(mtime)
        except (TypeError, ValueError):
            mtime = 0.0
        out.append((f"{MANIFEST_DIR}/{name}", mtime))
    return sorted(out)


def scan_manifests(store: Any) -> ManifestScan:
    """Every trusted manifest of ``store``, and the problems of the others.

    Overlaps: manifests are taken in commit order (modification time, then name); one
    whose trajectories were already claimed by an earlier one is a problem ("overlap"),
    so a trajectory is counted once.
    """
    scan = ManifestScan()
    parsed: list[tuple[float, str, ShardManifest]] = []
    for rel, mtime in _listing(store):
        try:
            text = store.read_bytes(rel)
            parsed.append((mtime, rel, parse_manifest(text, rel)))
        except FileNotFoundError:
            continue  # removed since the listing (a concurrent repair)
        except StorageError:
            raise  # the store failed us (out of retries): the manifest may be fine, never quarantine it
        except (ValueError, OSError) as err:
            reason, prefix = str(err), f"malformed manifest {rel}: "
            reason = "malformed manifest: " + reason[len(prefix) :] if reason.startswith(prefix) else reason
            scan.problems.append(ManifestProblem(rel, reason, "malformed"))
    owner: dict[str, str] = {}
    for _, rel, man in sorted(parsed, key=lambda t: (t[0], t[1])):
        clash = [t for t in man.trajectories if t in owner]
        if clash:
            other = owner[clash[0]]
            scan.problems.append(
                ManifestProblem(
                    rel,
                    f"{len(clash)} of its trajectories (e.g. {clash[0]}) are already committed by {other}",
                    "overlap",
                )
            )
            continue
        for t in man.trajectories:
            owner[t] = rel
        scan.manifests.append(man)
    scan.manifests.sort(key=lambda m: m.shard)
    for p in scan.problems:
        log.warning("ignoring %s", p.line())
    return scan


def quarantine(store: Any, problems: list[ManifestProblem], echo: Callable[[str], None] | None = None) -> list[str]:
    """Move problem manifests to ``previous/quarantine/<time>/manifest/`` (kept, not deleted).

    Their shards' files are then vouched for by nobody: the build's cleanup removes them
    and the trajectories are planned again.  Returns the new locations.
    """
    moved = []
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for p in problems:
        dest = f"{QUARANTINE_DIR}/{stamp}/{p.file}"
        try:
            store.move(p.file, dest)
        except FileNotFoundError:
            continue
        moved.append(dest)
        msg = f"[cnsbench] warning: {p.line()}; moved it to {dest} and its shard will be redone"
        if echo:
            echo(msg)
        else:
            log.warning(msg)
    return moved
