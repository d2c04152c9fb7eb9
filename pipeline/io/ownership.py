"""Which outputs are ours: a build writes into, and cleans, only a cnsbench output.

An output directory (or prefix) is *ours* when it carries our marker, ``config.json``
holding ``{"config_hash": str, "config": {...}}`` as :func:`pipeline.output_run.write_config`
writes it (before ``config.yaml``, so a ``config.yaml`` alone is never ours); or when it
is empty or missing (a new output); or when it holds nothing but what a build leaves
before its marker exists, each checked to be ours: a lease file that parses as a lease,
and a ``previous/`` holding only archived builds (``<12 hex>-<time>/`` with their own
marker) and ``quarantine/``.  Anything else is *foreign*: ``build`` and ``evaluate``
refuse it (exit 2, naming what was found) and neither write nor delete anything in it.

``cnsbench compare`` writes its report only into a new or empty directory or one holding
its own marker ``compare.json`` (:func:`claim_compare_output`); a build output or any
other non-empty directory is refused the same way.

Inside our own output, cleanup removes only files in our naming scheme that no manifest
vouches for (:func:`pipeline.io.manifest.is_own_file`); everything else is left alone.
"""

from __future__ import annotations

import os
import re
from typing import Any

from pipeline.errors import CnsbenchError
from pipeline.io.fs import PathKindError, check_writable_dir
from pipeline.io.lease_file import LEASE, parse_lease
from pipeline.io.safejson import dumps as strict_dumps, loads

MARKER = "config.json"
COMPARE_MARKER = "compare.json"
ARCHIVE = "previous"
QUARANTINE = "quarantine"
# previous/<first 12 hex digits of the config hash>-<UTC time> (pipeline.output_run.archive_previous)
ARCHIVE_NAME = re.compile(r"[0-9a-f]{12}-\d{8}T\d{6}")


class OwnershipError(CnsbenchError):
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
    if not _is_marker(data):
        raise OwnershipError(
            f"{where} is not a cnsbench output marker (expected an object with 'config_hash' and 'config'); "
            f"refusing to write into {store.uri}"
        )
    return data


def _is_marker(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("config_hash"), str) and isinstance(data.get("config"), dict)


def _ours_before_marker(store: Any, name: str) -> bool:
    """Whether the root entry ``name`` of an output without marker is something a build left."""
    try:
        if name == LEASE:
            parse_lease(store.read_bytes(LEASE), store.url(LEASE))
            return True
        if name != ARCHIVE:
            return False
        for entry in store.top_level(ARCHIVE):
            if entry == QUARANTINE:
                continue
            if not ARCHIVE_NAME.fullmatch(entry):
                return False
            where = f"{ARCHIVE}/{entry}/{MARKER}"
            if not _is_marker(loads(store.read_bytes(where), store.url(where))):
                return False
        return True
    except (ValueError, OSError):
        return False


def _foreign(store: Any, found: list[str], what: str) -> OwnershipError:
    shown = ", ".join(found[:8]) + (f", ... ({len(found)} entries)" if len(found) > 8 else "")
    return OwnershipError(
        f"--output {store.uri} is not empty and is not {what}; found: {shown}. "
        "Choose a new or empty directory; nothing was changed."
    )


def _make_local_root(store: Any) -> None:
    if store.local:
        try:
            store.fs.makedirs(store.root, exist_ok=True)
        except OSError as err:
            raise OwnershipError(f"--output {store.uri}: cannot create the directory: {err.strerror or err}") from None


def _check_location(store: Any) -> None:
    if store.local:
        try:
            check_writable_dir(store.root, "--output")
        except PathKindError as err:
            raise OwnershipError(str(err)) from None


def claim_output(store: Any) -> dict[str, Any] | None:
    """Make sure ``store`` is ours to write (creating a new local directory); return its marker.

    Raises :class:`OwnershipError` (exit 2) for a non-directory, an unwritable location, or a
    non-empty directory without our marker; nothing is created or deleted then.
    """
    _check_location(store)
    marker = read_marker(store)
    if marker is None:
        found = [name for name in store.top_level() if not _ours_before_marker(store, name)]
        if found:
            raise _foreign(store, found, f"a cnsbench output (no {MARKER})")
    _make_local_root(store)
    return marker


def enclosing_output(uri: str) -> str | None:
    """The cnsbench output that ``uri`` lies directly inside (its parent, holding our marker),
    or None.  A folder inside an output is that output's own (its refinement store
    ``refine/``, its archive ``previous/``, its report): never a build's or a refinement's
    output of its own."""
    from pipeline.io.store import OutputStore

    path = uri.rstrip("/")
    if "://" in path:
        scheme, rest = path.split("://", 1)
        if "/" not in rest:
            return None  # a bucket: nothing above it
        parent = f"{scheme}://{rest.rsplit('/', 1)[0]}"
    else:
        parent = os.path.dirname(os.path.abspath(path))
        if parent == os.path.abspath(path):
            return None
    try:
        return parent if read_marker(OutputStore(parent)) is not None else None
    except Exception:  # noqa: BLE001 - a parent this user cannot read is no output of theirs; the output's own claim says what is wrong with it
        return None


def refuse_inside_output(uri: str, flag: str = "--output") -> None:
    """Raise :class:`OwnershipError` (exit 2) when ``uri`` lies inside a cnsbench output."""
    parent = enclosing_output(uri)
    if parent is not None:
        raise OwnershipError(f"{flag} {uri} lies inside the cnsbench output {parent} (a folder of that output's "
                             "own, such as its refinement store refine/): choose a directory outside any output; "
                             "nothing was changed.")


def claim_compare_output(store: Any) -> None:
    """Make sure ``store`` may receive a comparison report: new, empty, or an earlier one of ours.

    Raises :class:`OwnershipError` (exit 2) for a build output or any other non-empty
    directory without :data:`COMPARE_MARKER`; nothing is created or changed then.
    """
    _check_location(store)
    if store.exists(MARKER):
        raise OwnershipError(
            f"--output {store.uri} is a cnsbench build output; a comparison goes into a directory of its own "
            "(a new or empty one). Nothing was changed."
        )
    if store.exists(COMPARE_MARKER):
        where = store.url(COMPARE_MARKER)
        try:
            doc = loads(store.read_bytes(COMPARE_MARKER), where)
        except ValueError as err:
            raise OwnershipError(f"{err}; {store.uri} does not look like a cnsbench comparison") from None
        if not isinstance(doc, dict) or doc.get("cnsbench") != "compare":
            raise OwnershipError(f"{where} is not a cnsbench comparison marker; refusing to write into {store.uri}")
    else:
        found = store.top_level()
        if found:
            raise _foreign(store, found, f"a cnsbench comparison (no {COMPARE_MARKER})")
    _make_local_root(store)


def write_compare_marker(store: Any, outputs: list[str], labels: list[str]) -> None:
    """Mark ``store`` as a comparison of ours (written before any report file)."""
    doc = {"cnsbench": "compare", "outputs": list(outputs), "labels": list(labels)}
    store.write_text(COMPARE_MARKER, strict_dumps(doc, indent=1))
