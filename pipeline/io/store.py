"""The output store: a directory or URI (local, ``s3://``, ``gs://``) with atomic commits.

Layout of a build output::

    config.yaml            resolved config (and config.json with its hash)
    images/<shard>.tar     WebDataset shard: <sample_id>.<png|jpg> + <sample_id>.json
    samples/<shard>.parquet
    predictions/<shard>.parquet
    manifest/<shard>.json  the shard's done-marker, written last
    report/                aggregated metrics and plots

A shard counts only once its manifest exists.  The manifest lists the shard's files
with their sizes and SHA-256, and the trajectories it holds, so a crash mid-write leaves
files no manifest vouches for (ignored, then overwritten or removed on resume) and a
truncated or corrupted file is detected by its size or hash.
"""

from __future__ import annotations

import errno
import hashlib
import posixpath
import uuid
from typing import Any, Iterator

from pipeline.io.access import check_endpoint
from pipeline.io.fs import confined_local, normalize_relpath
from pipeline.io.manifest import (
    MANIFEST_DIR,
    ManifestScan,
    ShardManifest,
    is_own_file,
    scan_manifests,
)
from pipeline.io.retry import StorageError, retrying, store_filesystem

__all__ = ["MANIFEST_DIR", "SHARD_DIRS", "OutputStore", "ShardManifest"]
SHARD_DIRS = {"images": ".tar", "samples": ".parquet", "predictions": ".parquet", "failures": ".parquet"}


def _join(root: str, rel: str) -> str:
    return posixpath.join(root, rel) if root else rel


class OutputStore:
    """Atomic writes and committed-shard listing on any fsspec filesystem."""

    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/") if "://" in uri else uri
        self.fs, self.root = store_filesystem(self.uri)  # retries in one layer: pipeline.io.retry
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        if not self.local:
            check_endpoint(self.uri, self.fs)  # a closed endpoint fails now, not after a minute of retries
        # Opening a store creates nothing: readers (status, aggregate, serve) must not make
        # directories; a build claims its output first (pipeline.io.ownership.claim_output).

    def path(self, rel: str) -> str:
        """The location of ``rel`` inside the output; a path leaving it raises PathEscape."""
        if rel in ("", "."):
            return _join(self.root, "")
        return _join(self.root, normalize_relpath(rel, f"{self.uri}: entry"))

    def _checked(self, rel: str) -> str:
        """:meth:`path`, and locally also no symlink leading outside the output (for writes and deletes)."""
        target = self.path(rel)
        if self.local and self.fs.exists(self.root):
            confined_local(self.root, target, what=f"{self.uri}: entry {rel!r}")
        return target

    def url(self, rel: str) -> str:
        return self.fs.unstrip_protocol(self.path(rel)) if not self.local else self.path(rel)

    # ------------------------------------------------------------------ primitives
    @retrying("stat")
    def exists(self, rel: str) -> bool:
        return self.fs.exists(self.path(rel))

    @retrying("read")
    def read_bytes(self, rel: str) -> bytes:
        with self.fs.open(self.path(rel), "rb") as fh:
            data = fh.read()
            expected = getattr(fh, "size", None)
        # A connection cut mid-body can reach us as a short read rather than an error: treat
        # it as the transient fault it is (retried), never as the file's content.
        if isinstance(expected, int) and len(data) != expected:
            raise ConnectionResetError(f"short read: {len(data)} of {expected} bytes")
        return data

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode("utf-8")

    @retrying("write")
    def write_bytes(self, rel: str, data: bytes) -> dict[str, Any]:
        """Write ``data`` so that readers see the old file or the whole new one, never a part.

        Locally: a temporary name in the same directory, then a rename.  On object stores a
        single PUT is already atomic, so the object is written directly.
        """
        target = self._checked(rel)
        parent = posixpath.dirname(target)
        if self.local:
            self.fs.makedirs(parent, exist_ok=True)
            tmp = _join(parent, f".tmp-{uuid.uuid4().hex}-{posixpath.basename(target)}")
            try:
                with self.fs.open(tmp, "wb") as fh:
                    fh.write(data)
            except OSError as err:
                if self.fs.exists(tmp):
                    self.fs.rm(tmp)  # no partial file stays behind (and a full disk gets its space back)
                if err.errno == errno.ENOSPC:
                    raise StorageError(err.errno, f"no space left on the device writing {target}: "
                                       "free space (or move the output) and run the same command again") from err
                raise
            self.fs.mv(tmp, target)
        else:
            with self.fs.open(target, "wb") as fh:
                fh.write(data)
        return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def write_text(self, rel: str, text: str) -> dict[str, Any]:
        return self.write_bytes(rel, text.encode("utf-8"))

    @retrying("list")
    def list(self, rel_dir: str, suffix: str = "") -> list[str]:
        """Relative paths of the files directly in ``rel_dir`` ending in ``suffix`` (sorted)."""
        base = self.path(rel_dir)
        if not self.local:
            self.fs.invalidate_cache()  # object-store listings are cached; another worker may have written
        if not self.fs.exists(base):
            return []
        names = []
        for p in self.fs.ls(base, detail=False):
            name = posixpath.basename(p.rstrip("/"))
            if name.endswith(suffix) and not name.startswith(".tmp-"):
                names.append(f"{rel_dir}/{name}")
        return sorted(names)

    @retrying("delete")
    def remove(self, rel: str) -> None:
        target = self._checked(rel)
        if self.fs.exists(target):
            self.fs.rm(target)

    @retrying("delete")
    def remove_tree(self, rel_dir: str) -> None:
        if not self.local:
            self.fs.invalidate_cache()
        target = self._checked(rel_dir)
        if self.fs.exists(target):
            self.fs.rm(target, recursive=True)

    def move(self, rel_src: str, rel_dst: str) -> None:
        """Move a file or directory: a rename locally, copy-then-delete per object elsewhere."""
        src, dst = self._checked(rel_src), self._checked(rel_dst)
        if self.local:
            self.fs.makedirs(posixpath.dirname(dst), exist_ok=True)
            self.fs.mv(src, dst, recursive=True)
            return
        self.fs.invalidate_cache()
        files = self.fs.find(src) if self.fs.isdir(src) else [src]
        for f in files:
            self.fs.copy(f, dst + f[len(src) :])
        for f in files:
            self.fs.rm(f)

    def top_level(self, rel_dir: str = "") -> list[str]:
        """Names of the entries at the root of the output (or directly in ``rel_dir``)."""
        if not self.local:
            self.fs.invalidate_cache()
        base = self.path(rel_dir) if rel_dir else self.root
        if not self.fs.exists(base):
            return []
        return sorted(posixpath.basename(p.rstrip("/")) for p in self.fs.ls(base, detail=False))

    # ------------------------------------------------------------------ shards
    def scan(self) -> ManifestScan:
        """Trusted manifests and the problems of the others (:func:`pipeline.io.manifest.scan_manifests`)."""
        return scan_manifests(self)

    def manifests(self) -> Iterator[ShardManifest]:
        """Committed shards: manifests that parse and do not overlap an earlier one."""
        yield from self.scan().manifests

    def commit_manifest(self, manifest: ShardManifest) -> None:
        self.write_text(f"{MANIFEST_DIR}/{manifest.shard}.json", manifest.to_json())

    def orphans(self, manifests: list[ShardManifest]) -> list[str]:
        """Shard files no manifest vouches for (left by a crash between a file and its
        manifest) and temporary files of interrupted writes."""
        referenced = {rel for m in manifests for rel in m.files}
        found = []
        # Only names of our own scheme are candidates: anything else in these folders is
        # not ours to delete (pipeline.io.manifest.OWN_FILE).
        for kind in SHARD_DIRS:
            for rel in self.list(kind):
                if is_own_file(rel) and rel not in referenced:
                    found.append(rel)
        if self.local:
            for kind in list(SHARD_DIRS) + [MANIFEST_DIR]:
                base = self.path(kind)
                if self.fs.exists(base):
                    found += [
                        f"{kind}/{posixpath.basename(p)}"
                        for p in self.fs.ls(base, detail=False)
                        if posixpath.basename(p).startswith(".tmp-") and is_own_file(f"{kind}/{posixpath.basename(p)}")
                    ]
        return sorted(set(found))

    def verify_shard(self, manifest: ShardManifest, deep: bool = False) -> list[str]:
        """Problems with a committed shard's files: missing, wrong size, or (deep) wrong hash."""
        problems = []
        for rel, meta in manifest.files.items():
            try:
                info = self.fs.info(self.path(rel))
            except FileNotFoundError:
                problems.append(f"{rel}: missing")
                continue
            if int(info.get("size", -1)) != int(meta["size"]):
                problems.append(f"{rel}: size {info.get('size')} != {meta['size']} (truncated?)")
            elif deep and hashlib.sha256(self.read_bytes(rel)).hexdigest() != meta["sha256"]:
                problems.append(f"{rel}: sha256 mismatch (corrupted)")
        return problems
