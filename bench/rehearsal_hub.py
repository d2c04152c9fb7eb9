"""A Hugging Face hub cache written by hand, in the layout ``huggingface_hub`` itself writes.

    <root>/hub/models--<org>--<name>/blobs/<hash>                 the file contents
    <root>/hub/models--<org>--<name>/snapshots/<commit>/<path>   relative symlinks to the blobs
    <root>/hub/models--<org>--<name>/refs/main                   the commit hash

A blob is named by the SHA-256 of its content for files the hub keeps in LFS (weights)
and by the git blob SHA-1 for the others, as the hub's ETags are; the commit hash is a
SHA-1 over the repository's file list.  ``from_pretrained(repo_id)`` with
``HF_HUB_OFFLINE=1`` and ``HF_HOME=<root>`` then resolves every file through ``refs/main``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".npz", ".msgpack", ".h5")


def hub_root(root: str | os.PathLike[str]) -> Path:
    """``HF_HUB_CACHE`` of a cache root (``HF_HOME``)."""
    return Path(root) / "hub"


def repo_folder(root: str | os.PathLike[str], repo_id: str) -> Path:
    return hub_root(root) / ("models--" + repo_id.replace("/", "--"))


def _file_hash(path: Path) -> str:
    if path.name.endswith(LFS_SUFFIXES):
        digest = hashlib.sha256()
    else:
        digest = hashlib.sha1()
        digest.update(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def is_published(root: str | os.PathLike[str], repo_id: str, files: list[str]) -> bool:
    """True when ``refs/main`` exists and its snapshot holds every one of ``files``."""
    folder = repo_folder(root, repo_id)
    ref = folder / "refs" / "main"
    if not ref.is_file():
        return False
    snap = folder / "snapshots" / ref.read_text().strip()
    return all((snap / f).exists() for f in files)


def publish(root: str | os.PathLike[str], repo_id: str, staged: str | os.PathLike[str]) -> Path:
    """Move every file under ``staged`` into the cache as one snapshot of ``repo_id``; returns it.

    Files of an earlier snapshot of the same repository stay (a repository may be
    published in several parts, e.g. a diffusers model one component at a time).
    """
    folder = repo_folder(root, repo_id)
    blobs = folder / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    staged = Path(staged)
    ref = folder / "refs" / "main"
    entries: dict[str, str] = {}
    if ref.is_file():  # carry the earlier snapshot's files over
        old = folder / "snapshots" / ref.read_text().strip()
        for link in old.rglob("*"):
            if link.is_symlink():
                entries[link.relative_to(old).as_posix()] = Path(os.readlink(link)).name
    for path in sorted(p for p in staged.rglob("*") if p.is_file()):
        digest = _file_hash(path)
        target = blobs / digest
        if target.exists():
            path.unlink()
        else:
            shutil.move(str(path), target)
        entries[path.relative_to(staged).as_posix()] = digest
    commit = hashlib.sha1("\n".join(f"{k} {v}" for k, v in sorted(entries.items())).encode()).hexdigest()
    snap = folder / "snapshots" / commit
    for rel, digest in entries.items():
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blobs / digest, link.parent))
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)
    shutil.rmtree(staged, ignore_errors=True)
    return snap


def snapshot_files(root: str | os.PathLike[str], repo_id: str) -> dict[str, Path]:
    """Relative path -> resolved blob of every file of ``repo_id``'s current snapshot."""
    folder = repo_folder(root, repo_id)
    ref = folder / "refs" / "main"
    if not ref.is_file():
        return {}
    snap = folder / "snapshots" / ref.read_text().strip()
    return {p.relative_to(snap).as_posix(): p.resolve() for p in snap.rglob("*") if p.is_symlink()}
