"""Classifiers added to committed shards as one unit: all of them, or nothing left behind.

Adding a classifier to an output rewrites its config (the entry and the weights it records)
and then, shard by shard, each manifest (:mod:`pipeline.stages.reclassify`).  A model that
fails on its fourth batch, a Ctrl-C or a killed process would leave the entry in the config
and its predictions in some shards: an entry no later run can finish without the same model
(a model held in memory is gone with its Python session) and that blocks every other one.

So before the config is rewritten, :func:`begin` records in ``adding.json`` the output's
config files, the manifests of the shards the addition rewrites and the probe records it
writes, as they are.
:func:`roll_back` puts them back and removes the predictions files no manifest lists any
more; :func:`end` drops the record once every shard holds the new classifiers.  The run
rolls back itself when it fails or is interrupted (:meth:`pipeline.output_run.Running.add_classifiers`),
and a record left by a killed process is rolled back by the next run that claims the output
(:meth:`pipeline.output_run.OutputRun.claim`) or by ``cnsbench status OUTPUT --roll-back``.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable

from pipeline.io.dataset_card import CARD
from pipeline.io.manifest import MANIFEST_DIR
from pipeline.io.store import OutputStore

JOURNAL = "adding.json"
CONFIG_FILES = ("config.json", "config.yaml", CARD)


def _text(store: OutputStore, rel: str) -> str | None:
    return store.read_text(rel) if store.exists(rel) else None


def begin(store: OutputStore, classifiers: list[str], shards: list[str], files: Iterable[str] = ()) -> None:
    """Record the config files, the manifests of ``shards`` and ``files`` (others the addition
    writes: its probe records, :mod:`pipeline.stages.probe`) before ``classifiers`` are added."""
    manifests = {f"{MANIFEST_DIR}/{s}.json": _text(store, f"{MANIFEST_DIR}/{s}.json") for s in shards}
    store.write_text(JOURNAL, json.dumps({"classifiers": classifiers,
                                          "config": {rel: _text(store, rel) for rel in (*CONFIG_FILES, *files)},
                                          "manifests": manifests}))


def pending(store: OutputStore) -> list[str] | None:
    """The classifiers of an addition that did not end (None when there is none)."""
    if not store.exists(JOURNAL):
        return None
    try:
        return list(json.loads(store.read_text(JOURNAL)).get("classifiers", []))
    except (ValueError, AttributeError):
        return []


def end(store: OutputStore) -> None:
    store.remove(JOURNAL)


def roll_back(store: OutputStore, echo: Callable[[str], None]) -> list[str] | None:
    """Undo an addition that did not end: its manifests and config files as they were, its
    predictions files removed.  Returns the classifiers it named (None: nothing to undo)."""
    if not store.exists(JOURNAL):
        return None
    try:
        record: dict[str, Any] = json.loads(store.read_text(JOURNAL))
    except ValueError:
        record = {}
    for rel, text in {**record.get("manifests", {}), **record.get("config", {})}.items():
        if text is None:
            store.remove(rel)
        elif _text(store, rel) != text:
            store.write_text(rel, text)
    orphans = store.orphans(list(store.manifests()))
    for rel in orphans:
        store.remove(rel)
    store.remove_tree("attempts")  # the failed run's crash bookkeeping
    names = list(record.get("classifiers", []))
    echo(f"[cnsbench] {store.uri}: the addition of {', '.join(names) or 'classifiers'} did not finish: "
         f"rolled back ({len(record.get('manifests', {}))} shard manifest(s) and the config as they were, "
         f"{len(orphans)} file(s) removed)")
    end(store)
    return names
