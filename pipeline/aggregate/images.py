"""Image bytes of an output's samples, read from its committed WebDataset tars.

Role: give analyses (image strips) the images behind ``samples`` rows without knowing
the shard layout.  Every sample row names its tar (``shard``, e.g.
``images/shard-1a2b.tar``) and its member key (``key``, the sample id); a tar member is
``<key>.<ext>`` (:mod:`pipeline.io.webdataset`).  Each tar needed is read once per
:meth:`ImageReader.many` call, only its requested members kept.
"""

from __future__ import annotations

from typing import Iterable

import pandas as pd

from pipeline.errors import UnknownKey
from pipeline.io.store import OutputStore
from pipeline.io.webdataset import iter_tar

IMAGE_EXTENSIONS = ("png", "jpg", "jpeg", "webp")


class ImageReader:
    """``reader(sample_id) -> bytes`` and ``reader.many(ids) -> {id: bytes}`` for one output."""

    def __init__(self, store: OutputStore, samples: pd.DataFrame) -> None:
        from pipeline.io.image_refs import ShardStores

        self.store = store
        self._stores = ShardStores(store)  # an evaluation output reads its benchmark's shards
        cols = [c for c in ("sample_id", "shard", "key") if c in samples.columns]
        rows = samples[cols].dropna() if len(cols) == 3 else pd.DataFrame(columns=["sample_id", "shard", "key"])
        self._where = {str(s): (str(sh), str(k)) for s, sh, k in rows.itertuples(index=False, name=None)}

    def __call__(self, sample_id: str) -> bytes:
        return self.many([sample_id])[sample_id]

    def many(self, sample_ids: Iterable[str]) -> dict[str, bytes]:
        """Image bytes of ``sample_ids``; raises KeyError naming a sample that has no image."""
        wanted: dict[str, dict[str, str]] = {}
        for sid in sample_ids:
            if sid not in self._where:
                raise UnknownKey(f"sample {sid!r} has no image in {self.store.uri} (no shard/key in the samples table)")
            shard, key = self._where[sid]
            wanted.setdefault(shard, {})[key] = sid
        out: dict[str, bytes] = {}
        for shard, keys in wanted.items():
            holder = self._stores(shard)
            for key, members in iter_tar(holder.read_bytes(shard), source=holder.url(shard)):
                if key in keys:
                    data = next((members[e] for e in IMAGE_EXTENSIONS if e in members), None)
                    if data is not None:
                        out[keys[key]] = data
            missing = [sid for sid in keys.values() if sid not in out]
            if missing:
                raise UnknownKey(f"{holder.url(shard)} lacks the image of {missing[0]!r}")
        return out
