"""Which outputs are ours: a build writes into, and cleans, only a cnsbench output.

An output directory (or prefix) is *ours* when it carries our marker, ``config.json``
holding ``{"config_hash": str, "config": {...}}`` as :func:`pipeline.build.write_config`
writes it; or when it is empty or missing (a new output); or when it holds nothing but
what a build leaves before its marker exists (``config.yaml``, ``previous/`` of an
interrupted ``--new-version``, the lease).  Anything else is *foreign*: ``build`` and
``evaluate`` refuse it (exit 2, naming what was found) and delete nothing in it.

Inside our own output, cleanup removes only files in our naming scheme that no manifest
vouches for (:func:`pipeline.io.manifest.is_own_file`); everything else is left alone.
"""

from __future__ import annotations

from typing import Any

from pipeline.io.fs import PathKindError, check_writable_dir
from pipeline.io.safejson import loads

MARKER = "config.json"
LEASE = "lease.json"
# What an output of ours may hold before its marker is written.
PRE_MARKER = {"config.yaml", "previous", LEASE}


class OwnershipError(ValueError):
    """The output location is not ours to write, or cannot be written; names the path and why."""


def read_marker(store: Any) -> dict[str, Any] | None:
    """The parsed ``config.json`` of an output of ours; None when absent; OwnershipError when foreign."""
    if not store.exists(MARKER):
        return None
    where = store.url(MARKER)
    try:
        data = loads(store.read_bytes(MARKER), where)
    except ValueError as err:
        raise OwnershipError(f"{err}; {store.uri} does not look like a cnsbench output") from None
    if not isinstance(data, dict) or not isinstance(data.get("config_hash"), str) or not isinstance(
        data.get("config"), dict
    ):
        raise OwnershipError(
            f"{where} is not a cnsbench output marker (expected an object with 'config_hash' and 'config'); "
            f"refusing to write into {store.uri}"
        )
    return data


def claim_output(store: Any) -> dict[str, Any] | None:
    """Make sure ``store`` is ours to write (creating a new local directory); return its marker.

    Raises :class:`OwnershipError` (exit 2) for a non-directory, an unwritable location, or a
    non-empty directory without our marker; nothing is created or deleted then.
    """
    if store.local:
        try:
            check_writable_dir(store.root, "--output")
        except PathKindError as err:
            raise OwnershipError(str(err)) from None
    marker = read_marker(store)
    if marker is None:
        found = [name for name in store.top_level() if name not in PRE_MARKER]
        if found:
            shown = ", ".join(found[:8]) + (f", ... ({len(found)} entries)" if len(found) > 8 else "")
            raise OwnershipError(
                f"--output {store.uri} is not empty and is not a cnsbench output (no {MARKER}); found: {shown}. "
                "Choose a new or empty directory; nothing was changed."
            )
    if store.local:
        try:
            store.fs.makedirs(store.root, exist_ok=True)
        except OSError as err:
            raise OwnershipError(f"--output {store.uri}: cannot create the directory: {err.strerror or err}") from None
    return marker
