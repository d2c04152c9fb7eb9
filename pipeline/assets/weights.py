"""Which weights a classifier entry loads, and their SHA-256: a classifier's identity.

A classifier's name and entry say how to load a model, not which numbers it holds: a
checkpoint file replaced under the same path is another model.  An output therefore
records, in its marker (``config.json``'s ``weights``: name -> digest), the digest of each
classifier's weights when its predictions are made, and every later run compares
(:func:`changed_weights`): a classifier whose weights changed under the same name is
refused naming it (:class:`WeightsChanged`), never silently given the old predictions.

What is hashed (:func:`weights`): local files named by ``checkpoint``, ``model_config_file``
and ``label_map``, a VLM's model directory, and a timm model's pretrained file from the
local hub cache.  Files are read only when they are regular files (:mod:`pipeline.io.regular`:
no FIFO, device or socket, symlinks resolved and checked); a directory is hashed only
where the kind's weights are a directory (a VLM's ``model``).  A reference this machine
cannot read (``s3://``, a hub id not cached) has no digest and is named by reference.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from pipeline.config import BuildConfig, ClassifierSpec
from pipeline.errors import CnsbenchError
from pipeline.io.regular import dir_sha256, file_sha256, regular_file, walk_regular
from pipeline.registry import CLASSIFIERS



class WeightsChanged(CnsbenchError):
    """A classifier's weights differ from those that made its predictions in an output."""


def _kind(spec: ClassifierSpec) -> Any:
    """The entry's kind class: it says which files it reads and which weights it holds."""
    return CLASSIFIERS.get(spec.kind)


def check_readable(spec: ClassifierSpec) -> None:
    """Raise :class:`pipeline.io.regular.NotRegularFile` naming a local file of the entry that
    is not a regular file (or a directory holding one), without reading any."""
    for key, value, folder, _ in _kind(spec).local_files(spec):
        if not os.path.lexists(value):
            continue
        what = f"classifiers[{spec.name}].{key}"
        if folder and os.path.isdir(value):
            for _ in walk_regular(value, what):
                pass
        else:
            regular_file(value, what)


def weights(spec: ClassifierSpec) -> list[dict[str, Any]]:
    """The files the entry loads, each with its SHA-256 (None where not readable here).

    Raises :class:`pipeline.io.regular.NotRegularFile` naming a path that is a FIFO, a
    device, a socket, a directory where the kind loads a file, or a directory holding
    one of them."""
    out = []
    where = f"classifiers[{spec.name}]"
    kind = _kind(spec)
    for key, value, folder, _ in kind.local_files(spec):
        if not os.path.lexists(value):
            out.append({"key": key, "ref": value, "sha256": None})
            continue
        what = f"{where}.{key}"
        if folder and os.path.isdir(value):
            digest = dir_sha256(value, what)
        else:
            digest = file_sha256(value, what)
        out.append({"key": key, "path": os.path.abspath(value), "sha256": digest})
    out.extend(kind.held_weights(spec))
    cached, ref = kind.cached_weights(spec)
    if cached:
        out.append({"key": "pretrained", "ref": ref, "path": cached, "sha256": file_sha256(cached, f"{where} pretrained")})
    elif ref:
        out.append({"key": "pretrained", "ref": ref, "sha256": None})
    return out


def combined_digest(files: list[dict[str, Any]]) -> str | None:
    """One digest for an entry's files: the file's own when there is one, else a SHA-256 over
    ``key:sha256`` lines; None when none has a digest here."""
    digests = [f for f in files if f.get("sha256")]
    if len(digests) == 1:
        return digests[0]["sha256"]
    if digests:
        return hashlib.sha256("\n".join(f"{f['key']}:{f['sha256']}" for f in digests).encode()).hexdigest()
    return None


def weights_digest(spec: ClassifierSpec) -> str | None:
    """The SHA-256 identifying ``spec``'s weights (:func:`combined_digest` of :func:`weights`)."""
    return combined_digest(weights(spec))


def digests(cfg: BuildConfig, names: set[str] | None = None) -> dict[str, str | None]:
    """The weights digest of each classifier (of those in ``names``), by name."""
    return {c.name: weights_digest(c) for c in cfg.classifiers if names is None or c.name in names}


def recorded(marker: dict[str, Any] | None) -> dict[str, str | None]:
    """The digests an output's marker records (empty for outputs written before they were)."""
    found = (marker or {}).get("weights")
    if not isinstance(found, dict):
        return {}
    return {str(k): v for k, v in found.items() if v is None or isinstance(v, str)}


def changed_weights(marker: dict[str, Any] | None, current: dict[str, str | None]) -> list[tuple[str, str, str | None]]:
    """(name, recorded digest, current digest) of each classifier whose weights changed."""
    before = recorded(marker)
    return [(name, before[name], now) for name, now in current.items()
            if before.get(name) and before[name] != now]


def check_weights(uri: str, marker: dict[str, Any] | None, current: dict[str, str | None], hint: str) -> None:
    """Raise :class:`WeightsChanged` naming every classifier of ``current`` whose weights differ
    from those recorded in ``uri``'s marker; ``hint`` says what the user can do."""
    changed = changed_weights(marker, current)
    if not changed:
        return
    lines = "; ".join(f"{name}: predictions made by weights {old[:12]}…, its files now hold "
                      f"{(new or 'weights not readable here')[:12]}…" for name, old, new in changed)
    names = ", ".join(repr(n) for n, _, _ in changed)
    raise WeightsChanged(f"{uri}: the weights of classifier {names} changed since its predictions were made "
                         f"({lines}); {hint}"[:1200])


def merged(marker: dict[str, Any] | None, current: dict[str, str | None]) -> dict[str, str | None]:
    """The digests to record: the earlier ones, with ``current``'s for its classifiers (an
    output written before digests were recorded takes its classifiers' present weights)."""
    return {**recorded(marker), **current}
