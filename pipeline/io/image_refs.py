"""An evaluation output that refers to a built benchmark's images instead of copying them.

``cnsbench evaluate BENCH --output EV`` of a cnsbench output writes no image of its own: EV's
``images.json`` names the benchmark, and each of EV's sample rows keeps the benchmark's
``shard`` and ``key``.  A shard that EV's own manifests list is read from EV (an output made
before, or images EV wrote itself); any other is read from the benchmark.  Readers go through
:func:`store_of_shard`; the benchmark is only ever read.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Iterator

from pipeline.errors import CnsbenchError
from pipeline.io.store import OutputStore

IMAGES_FILE = "images.json"


def write_reference(store: OutputStore, benchmark: str) -> None:
    """Record that ``store``'s sample rows name ``benchmark``'s image shards (an evaluation
    output as the benchmark: the one whose images it refers to)."""
    source = OutputStore(benchmark)
    holder = referenced(source) or source
    store.write_text(IMAGES_FILE, json.dumps({"images": holder.uri}, indent=1))


def referenced(store: OutputStore) -> OutputStore | None:
    """The store of the benchmark whose images ``store`` refers to, None for an output holding its own."""
    if not store.exists(IMAGES_FILE):
        return None
    try:
        uri = json.loads(store.read_bytes(IMAGES_FILE))["images"]
    except (ValueError, KeyError, TypeError):
        raise CnsbenchError(f"{store.url(IMAGES_FILE)}: not a record of the benchmark whose images this output "
                            "uses ({\"images\": URI})") from None
    if not isinstance(uri, str) or not uri:
        raise CnsbenchError(f"{store.url(IMAGES_FILE)}: 'images' must name the benchmark's folder or URI")
    return OutputStore(uri)


def own_files(store: OutputStore) -> set[str]:
    """The files ``store``'s committed manifests list."""
    return {rel for m in store.manifests() for rel in m.files}


class ShardStores:
    """Which store holds a sample row's shard: the output's own, or the benchmark it refers to."""

    def __init__(self, store: OutputStore) -> None:
        self.store = store
        self.benchmark = referenced(store)
        self._own: set[str] | None = None

    def __call__(self, shard: str) -> OutputStore:
        if self.benchmark is None:
            return self.store
        if self._own is None:
            self._own = own_files(self.store)
        return self.store if shard in self._own else self.benchmark


def benchmark_locations(benchmark: str) -> dict[str, tuple[str, str]]:
    """sample id -> (shard, key) of every committed image of the built benchmark ``benchmark``."""
    from pipeline.io.tables import load_samples

    samples = load_samples(OutputStore(benchmark))
    return {str(s): (str(sh), str(k)) for s, sh, k in samples[["sample_id", "shard", "key"]].itertuples(index=False)}


def referred_members(store: OutputStore, rows: Iterable[Any]) -> Iterator[tuple[str, dict[str, bytes]]]:
    """``(key, {extension: bytes})`` of each image that sample ``rows`` (with ``shard`` and
    ``key``) name, shard by shard from the store holding each (the output's own, or its
    benchmark's), one shard in memory at a time."""
    from pipeline.io.webdataset import iter_tar

    stores = ShardStores(store)
    wanted: dict[str, set[str]] = {}
    for row in rows:
        wanted.setdefault(str(row["shard"]), set()).add(str(row["key"]))
    for shard, keys in sorted(wanted.items()):
        holder = stores(shard)
        for key, members in iter_tar(holder.read_bytes(shard), holder.url(shard)):
            if key in keys:
                yield key, members
