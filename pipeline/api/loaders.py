"""An output as the ecosystem's datasets: ``torch.utils.data.Dataset`` and ``datasets.Dataset``.

Imported only when a view is asked for (:meth:`pipeline.api.output.Benchmark.torch_dataset`,
``.hf_dataset``), so ``import pipeline`` loads neither torch nor ``datasets``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Iterable

import pandas as pd
from torch.utils.data import Dataset

from pipeline.api.rows import SAMPLE_COLUMNS, decode, meta_of
from pipeline.errors import CnsbenchError
from pipeline.io.store import OutputStore

SHARDS_HELD = 2  # decoded shards a torch view keeps (items are read in shard order)


class TorchView(Dataset):
    """``(image, label, meta)`` per sample row; a shard's images are read once and kept
    while neighbouring items need them.  Pickles cheaply (for DataLoader workers)."""

    def __init__(self, store: OutputStore, rows: pd.DataFrame, transform: Callable[[Any], Any] | None) -> None:
        self.store = store
        self.rows = rows.to_dict("records")
        self.transform = transform
        self._shards: OrderedDict[str, dict[str, bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[Any, int, dict[str, Any]]:
        row = self.rows[index]
        image = decode(self._members(str(row["shard"]))[str(row["key"])])
        if self.transform is not None:
            image = self.transform(image)
        return image, int(row["class_id"]), meta_of(row)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_shards": OrderedDict()}

    def _members(self, shard: str) -> dict[str, bytes]:
        from pipeline.aggregate.images import IMAGE_EXTENSIONS
        from pipeline.io.webdataset import iter_tar

        if shard not in self._shards:
            from pipeline.io.image_refs import ShardStores

            holder = ShardStores(self.store)(shard)
            images = {}
            for key, members in iter_tar(holder.read_bytes(shard), source=holder.url(shard)):
                data = next((members[e] for e in IMAGE_EXTENSIONS if e in members), None)
                if data is not None:
                    images[key] = data
            self._shards[shard] = images
            while len(self._shards) > SHARDS_HELD:
                self._shards.popitem(last=False)
        return self._shards[shard]


def hf_dataset(images: Iterable[tuple[dict[str, Any], bytes]]):
    """(sample row, image bytes) pairs as a ``datasets.Dataset`` (in memory), in sample-id order."""
    try:
        import datasets
    except ImportError:
        raise CnsbenchError(
            "hf_dataset needs the Hugging Face `datasets` library: pip install 'cnsbench[datasets]'"
        ) from None
    columns: dict[str, list[Any]] = {"image": [], "label": [], **{c: [] for c in SAMPLE_COLUMNS}}
    found = {row["sample_id"]: (row, data) for row, data in images}
    for sid in sorted(found):
        row, data = found[sid]
        columns["image"].append({"bytes": data, "path": None})
        columns["label"].append(int(row["class_id"]))
        for c in SAMPLE_COLUMNS:
            columns[c].append(row[c])
    features = datasets.Features({
        "image": datasets.Image(),
        "label": datasets.Value("int64"),
        "sample_id": datasets.Value("string"),
        "trajectory_id": datasets.Value("string"),
        "class_id": datasets.Value("int64"),
        "class_name": datasets.Value("string"),
        "seed": datasets.Value("int64"),
        "shift": datasets.Value("string"),
        "scale": datasets.Value("float64"),
        "kept": datasets.Value("bool"),
    })
    return datasets.Dataset.from_dict(columns, features=features)
