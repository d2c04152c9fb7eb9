"""The output's stored tables: their Arrow schemas and the readers of committed shards.

A shard's ``samples`` table has one row per image (its coordinates, the detector scores and
the keep decision), its ``predictions`` table one row per (image, classifier), its
``failures`` table one row per trajectory that failed.  Only files a manifest vouches for
are read, so a half-written shard never enters a table.
"""

from __future__ import annotations

import io
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import CnsbenchError
from pipeline.io.store import OutputStore, ShardManifest

SCORE_COLUMNS = ("clip_text", "clip_shift_text", "clip_image", "dino_image")

# Per-image measures stored next to the detector scores but never part of the keep rule:
# ``clip_shift_alignment`` is the CLIPScore of the image to "a picture in {shift words}",
# the paper's (Fig. 3) measure of how strongly a shift is realised (see
# pipeline.aggregate.realisation.shift_realisation).  NaN when the filter did not run.
REALISATION_COLUMNS = ("clip_shift_alignment",)

# Where an image comes from, the same columns in every table and row that carries it.
UNIT_COORDINATES = [("class_id", pa.int64()), ("class_name", pa.string()), ("seed", pa.int64())]

SAMPLES = pa.schema(
    [("sample_id", pa.string()), ("trajectory_id", pa.string())]
    + UNIT_COORDINATES
    + [
        ("shift", pa.string()),
        ("scale", pa.float64()),
        ("shard", pa.string()),
        ("key", pa.string()),
    ]
    + [pa.field(name, pa.float64()) for name in SCORE_COLUMNS]
    + [("n_pass", pa.int64()), ("kept", pa.bool_())]
    # Appended last so older shards (without it) still read, as nulls, with this schema.
    + [pa.field(name, pa.float64()) for name in REALISATION_COLUMNS]
    # Per-image parameters of the family (JSON object), appended after the realisation column
    # for the same reason; null for families that record nothing and for older outputs.
    + [pa.field("params", pa.string())]
)

PREDICTIONS = pa.schema(
    [
        ("sample_id", pa.string()),
        ("classifier", pa.string()),
        ("top1", pa.int64()),
        ("top5", pa.list_(pa.int64())),
        ("p_true", pa.float64()),
        ("correct", pa.bool_()),
        # vlm classifiers (pipeline.models.vlm): the answer text, and whether the protocol
        # excluded it (naming several options or none; ``correct`` is then null and the
        # answer counts neither way).  Null for other classifiers; appended last so older
        # predictions files still read.
        ("answer", pa.string()),
        ("excluded", pa.bool_()),
    ]
)

FAILURES = pa.schema(
    [
        ("trajectory_id", pa.string()),
        ("unit_id", pa.string()),
        ("stage", pa.string()),
        ("error", pa.string()),
    ]
)


Filters = Any  # a pyarrow row filter: a pyarrow.compute expression or DNF tuples [("classifier", "==", "a")]


def read_shard_tables(
    store: OutputStore, manifest: ShardManifest, kind: str, sch: pa.Schema,
    columns: list[str] | None = None, filters: Filters | None = None,
) -> list[pa.Table]:
    """The ``kind`` files (``samples``, ``predictions``) of one committed shard, read with ``sch``:
    only ``columns`` (default all) and the rows ``filters`` keep (pyarrow's column projection and
    row filters: row groups the filter rules out by their statistics are not decoded).

    Raises ValueError naming the file when one is missing or not Parquet of that schema.
    """
    tables = []
    # A shard may hold several files of a kind (predictions added for new classifiers).
    for rel in sorted(r for r in manifest.files if r.startswith(f"{kind}/")):
        try:
            tables.append(pq.read_table(io.BytesIO(store.read_bytes(rel)), schema=sch, columns=columns, filters=filters))
        except (pa.ArrowInvalid, OSError) as err:
            raise CnsbenchError(f"malformed shard {store.url(rel)}: {err}") from None
    return tables


def _read_tables(
    store: OutputStore, kind: str, sch: pa.Schema, columns: list[str] | None = None, filters: Filters | None = None
) -> pd.DataFrame:
    """Every committed shard's ``kind`` table, concatenated (an empty table of ``sch`` when there is none)."""
    tables = []
    for manifest in store.manifests():
        tables.extend(read_shard_tables(store, manifest, kind, sch, columns, filters))
    if not tables:
        empty = sch.empty_table()
        return (empty.select(columns) if columns is not None else empty).to_pandas()
    return pa.concat_tables(tables).to_pandas()


def load_samples(store: OutputStore, columns: list[str] | None = None) -> pd.DataFrame:
    """Samples of committed shards (only ``columns`` when given)."""
    return _read_tables(store, "samples", SAMPLES, columns)


def load_predictions(
    store: OutputStore, classifiers: list[str] | None = None, columns: list[str] | None = None
) -> pd.DataFrame:
    """Predictions of committed shards, only of ``classifiers`` when given (filtered as the files
    are read), only ``columns`` when given."""
    import pyarrow.compute as pc

    filters = None if classifiers is None else pc.field("classifier").isin(pa.array(list(classifiers), pa.string()))
    return _read_tables(store, "predictions", PREDICTIONS, columns, filters)


def parquet_bytes(rows: list[dict[str, Any]], sch: pa.Schema) -> bytes:
    """``rows`` as one Parquet file of schema ``sch`` (zstd), the bytes a shard's table file holds."""
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=sch), buf, compression="zstd")
    return buf.getvalue()
