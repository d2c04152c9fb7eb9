"""The aggregation job: committed Parquet shards of an output -> ``report/``.

Reads only shards vouched for by a manifest, so a half-written shard never enters the
metrics.  Works on local and object-store outputs (the report is rendered in a local
temporary directory and uploaded file by file).
"""

from __future__ import annotations

import io
import json
import os
import tempfile

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import schema
from pipeline.config import BuildConfig, parse_config
from pipeline.io.store import OutputStore


def load_output_config(store: OutputStore) -> BuildConfig:
    if not store.exists("config.json"):
        raise FileNotFoundError(f"{store.url('config.json')} not found: is {store.uri} a cnsbench build output?")
    data = json.loads(store.read_text("config.json"))
    return parse_config(data["config"], source=store.url("config.json"))


def _read_tables(store: OutputStore, kind: str, sch: pa.Schema) -> pd.DataFrame:
    tables = []
    for manifest in store.manifests():
        # A shard may hold several files of a kind (predictions added for new classifiers).
        for rel in sorted(r for r in manifest.files if r.startswith(f"{kind}/")):
            try:
                tables.append(pq.read_table(io.BytesIO(store.read_bytes(rel)), schema=sch))
            except (pa.ArrowInvalid, OSError) as err:
                raise ValueError(f"malformed shard {store.url(rel)}: {err}") from None
    if not tables:
        return sch.empty_table().to_pandas()
    return pa.concat_tables(tables).to_pandas()


def load_samples(store: OutputStore) -> pd.DataFrame:
    return _read_tables(store, "samples", schema.SAMPLES)


def load_predictions(store: OutputStore, classifiers: list[str] | None = None) -> pd.DataFrame:
    """Predictions of committed shards, only of ``classifiers`` when given."""
    preds = _read_tables(store, "predictions", schema.PREDICTIONS)
    return preds if classifiers is None else preds[preds["classifier"].isin(classifiers)].reset_index(drop=True)


def aggregate_output(store: OutputStore, cfg: BuildConfig, digest: str | None = None) -> str:
    """Compute the metrics of every committed shard and write ``report/``; returns its index path."""
    from pipeline.aggregate.metrics import compute_metrics
    from pipeline.aggregate.report import write_report

    samples = load_samples(store)
    predictions = load_predictions(store, [c.name for c in cfg.classifiers])
    metrics = compute_metrics(
        samples,
        predictions,
        list(cfg.benchmark.scales),
        cfg.aggregate.margin_max_scale,
        fp_std_ddof=cfg.aggregate.fp_std_ddof,
    )
    title = f"{cfg.benchmark.name}: accuracy drop and failure points"
    if store.local:
        write_report(metrics, store.path("report"), title=title, config_hash=digest, plots=cfg.aggregate.plots)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            written = write_report(metrics, tmp, title=title, config_hash=digest, plots=cfg.aggregate.plots)
            for path in written.values():
                with open(path, "rb") as fh:
                    store.write_bytes(f"report/{os.path.basename(path)}", fh.read())
    return store.url("report/index.html")
