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
from pipeline.io.store import OutputStore, ShardManifest


def load_output_config(store: OutputStore) -> BuildConfig:
    if not store.exists("config.json"):
        raise FileNotFoundError(f"{store.url('config.json')} not found: is {store.uri} a cnsbench build output?")
    data = json.loads(store.read_text("config.json"))
    return parse_config(data["config"], source=store.url("config.json"))


def read_shard_tables(store: OutputStore, manifest: ShardManifest, kind: str, sch: pa.Schema) -> list[pa.Table]:
    """The ``kind`` files (``samples``, ``predictions``) of one committed shard, read with ``sch``.

    Raises ValueError naming the file when one is missing or not Parquet of that schema.
    """
    tables = []
    # A shard may hold several files of a kind (predictions added for new classifiers).
    for rel in sorted(r for r in manifest.files if r.startswith(f"{kind}/")):
        try:
            tables.append(pq.read_table(io.BytesIO(store.read_bytes(rel)), schema=sch))
        except (pa.ArrowInvalid, OSError) as err:
            raise ValueError(f"malformed shard {store.url(rel)}: {err}") from None
    return tables


def _read_tables(store: OutputStore, kind: str, sch: pa.Schema) -> pd.DataFrame:
    tables = []
    for manifest in store.manifests():
        tables.extend(read_shard_tables(store, manifest, kind, sch))
    if not tables:
        return sch.empty_table().to_pandas()
    return pa.concat_tables(tables).to_pandas()


def load_samples(store: OutputStore) -> pd.DataFrame:
    return _read_tables(store, "samples", schema.SAMPLES)


def load_predictions(store: OutputStore, classifiers: list[str] | None = None) -> pd.DataFrame:
    """Predictions of committed shards, only of ``classifiers`` when given."""
    preds = _read_tables(store, "predictions", schema.PREDICTIONS)
    return preds if classifiers is None else preds[preds["classifier"].isin(classifiers)].reset_index(drop=True)


def image_reader(store: OutputStore, samples: pd.DataFrame):
    """``read_image(sample_id) -> bytes`` over the committed WebDataset shards (one shard cached)."""
    from pipeline.io.webdataset import iter_tar

    where = dict(zip(samples["sample_id"], zip(samples["shard"], samples["key"])))
    cache: dict[str, dict[str, dict[str, bytes]]] = {}

    def read(sample_id: str) -> bytes:
        shard, key = where[sample_id]
        if shard not in cache:
            cache.clear()
            cache[shard] = dict(iter_tar(store.read_bytes(shard), source=store.url(shard)))
        members = cache[shard].get(key, {})
        for ext in ("png", "jpg", "jpeg", "webp"):
            if ext in members:
                return members[ext]
        raise KeyError(f"{store.url(shard)} has no image for sample {sample_id!r}")

    return read


def analysis_plan(cfg: BuildConfig) -> list[tuple[str, dict]]:
    """(analysis key, options): the configured ones, then those the build's families add."""
    from pipeline.registry import FAMILIES

    plan = list(cfg.aggregate.analysis_entries())
    names = {name for name, _ in plan}
    for group in cfg.family_groups():
        for name in FAMILIES.get(group.kind).analyses:
            if name not in names:
                plan.append((name, {}))
                names.add(name)
    return plan


def aggregate_output(store: OutputStore, cfg: BuildConfig, digest: str | None = None) -> str:
    """Run the build's analyses on every committed shard and write ``report/``; returns its index path.

    Each analysis returns files and an HTML section (:mod:`pipeline.analyses.base`); they
    are written atomically, ``metrics.json`` collects their JSON, and ``index.html`` is
    written last, so its presence means the report is complete.
    """
    import json

    from pipeline.aggregate.report import page_html
    from pipeline.analyses.base import AnalysisContext
    from pipeline.registry import ANALYSES

    samples = load_samples(store)
    predictions = load_predictions(store, [c.name for c in cfg.classifiers])
    reader = image_reader(store, samples)
    title = f"{cfg.benchmark.name}: accuracy drop and failure points"
    doc: dict = {"title": title, "config_hash": digest}
    sections: list[tuple[str, str]] = []
    files: dict[str, bytes] = {}
    for name, options in analysis_plan(cfg):
        ctx = AnalysisContext(cfg, samples, predictions, options=options, config_hash=digest, read_image=reader)
        result = ANALYSES.get(name)(ctx)
        files.update(result.files)
        for tname, table in result.tables.items():
            files[f"{tname}.csv"] = table.to_csv(index=False).encode("utf-8")
        for fname, fig in result.figures.items():
            from pipeline.aggregate.report import _png_bytes

            files[f"{fname}.png"] = _png_bytes(fig)
        if name == "cns":
            doc.update(result.json)  # the CNS metrics stay at the top level of metrics.json
        elif result.json:
            doc.setdefault("analyses", {})[name] = result.json
        if result.html:
            sections.append((result.title, result.html))
    files["metrics.json"] = (json.dumps(doc, indent=2, allow_nan=False) + "\n").encode("utf-8")
    order = ["accuracy.csv", "failure_points.csv", "summary.csv", "metrics.json"]
    names = [n for n in order if n in files] + [n for n in files if n not in order]
    for fname in names:
        store.write_bytes(f"report/{fname}", files[fname])
    data_files = [n for n in names if not n.endswith(".png")]
    store.write_bytes("report/index.html", page_html(title, digest, sections, data_files).encode("utf-8"))
    return store.url("report/index.html")
