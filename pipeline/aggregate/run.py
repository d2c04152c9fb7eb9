"""The aggregation job: committed Parquet shards of an output -> ``report/``.

Reads only shards vouched for by a manifest, so a half-written shard never enters the
metrics.  Works on local and object-store outputs (the report is rendered in a local
temporary directory and uploaded file by file).
"""

from __future__ import annotations

import logging
from typing import Callable

import pandas as pd
import pyarrow as pa

from pipeline.config import BuildConfig, parse_config
from pipeline.errors import CnsbenchError
from pipeline.io.safejson import dumps as strict_dumps
from pipeline.io.store import OutputStore
from pipeline.io.tables import PREDICTIONS, SAMPLES, read_shard_tables
from pipeline.plan.analyses import analysis_plan

log = logging.getLogger(__name__)


def load_output_config(store: OutputStore) -> BuildConfig:
    from pipeline.io.ownership import read_marker

    if store.local and not store.fs.isdir(store.root):
        what = "is not a directory" if store.fs.exists(store.root) else "does not exist"
        raise FileNotFoundError(f"output {store.uri} {what}: is it a cnsbench build output?")
    data = read_marker(store)
    if data is None:
        raise FileNotFoundError(f"{store.url('config.json')} not found: is {store.uri} a cnsbench build output?")
    return parse_config(data["config"], source=store.url("config.json"))


def load_sound_tables(
    store: OutputStore, classifiers: list[str] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str]]:
    """(samples, predictions) of the sound committed shards, and the damaged shards left out
    (shard -> what is wrong: :mod:`pipeline.io.shard_check`, or a table that does not read)."""
    from pipeline.io.shard_check import check_committed

    committed = check_committed(store)
    left_out = {shard: "; ".join(found) for shard, (_, found) in committed.damaged.items()}
    samples, preds = [], []
    for manifest in committed.sound:
        try:
            s = read_shard_tables(store, manifest, "samples", SAMPLES)
            p = read_shard_tables(store, manifest, "predictions", PREDICTIONS)
        except ValueError as err:
            left_out[manifest.shard] = str(err)
            continue
        samples += s
        preds += p

    def frame(tables: list[pa.Table], sch: pa.Schema) -> pd.DataFrame:
        return pa.concat_tables(tables).to_pandas() if tables else sch.empty_table().to_pandas()

    predictions = frame(preds, PREDICTIONS)
    if classifiers is not None:
        # In the given order (the config's): the report lists and colours classifiers in it.
        rank = predictions["classifier"].map({c: i for i, c in enumerate(classifiers)})
        predictions = predictions[rank.notna()].iloc[rank.dropna().argsort(kind="stable")].reset_index(drop=True)
    return frame(samples, SAMPLES), predictions, left_out


def evaluated_source(store: OutputStore) -> dict | None:
    """``source.json`` of an evaluate output (what it evaluated), None for a build output."""
    from pipeline.io.safejson import loads

    if not store.exists("source.json"):
        return None
    where = store.url("source.json")
    doc = loads(store.read_bytes("source.json"), where)
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), int) for k in ("trajectories", "images")):
        raise CnsbenchError(f"{where}: not the record of an evaluated source (integer 'trajectories' and 'images' expected)")
    return doc


def resume_command(store: OutputStore, cfg: BuildConfig) -> str:
    """The command that finishes (or repairs) an output: ``cnsbench build`` of its config, or for an
    evaluate output ``cnsbench evaluate`` of the source it recorded."""
    import shlex

    out, config = shlex.quote(store.uri), shlex.quote(store.url("config.yaml"))
    source = evaluated_source(store)
    if source is None:
        return f"cnsbench build {config} --output {out}"
    cmd = f"cnsbench evaluate {shlex.quote(str(source.get('location', 'SOURCE')))} --config {config} --output {out}"
    if source.get("kind"):
        cmd += f" --source-kind {shlex.quote(str(source['kind']))}"
    return cmd + (" --filter" if cfg.filter.enabled else "")


def _left_out_section(store: OutputStore, cfg: BuildConfig, left_out: dict[str, str]) -> tuple[str, str]:
    import html

    items = "".join(f"<li><code>{html.escape(s)}</code>: {html.escape(r)}</li>" for s, r in sorted(left_out.items()))
    redo = html.escape(resume_command(store, cfg))
    return (
        "Shards left out",
        f"<p>{len(left_out)} damaged shard(s) were left out of this report, which covers the other shards. "
        f"Run <code>{redo}</code> to redo them, then aggregate again.</p><ul>{items}</ul>",
    )


def aggregate_output(
    store: OutputStore, cfg: BuildConfig, digest: str | None = None, echo: Callable[[str], None] | None = None
) -> str:
    """Run the build's analyses on every sound committed shard and write ``report/``; returns its index path.

    Each analysis returns files and an HTML section (:mod:`pipeline.aggregate.analysis`); they
    are written atomically, ``metrics.json`` collects their JSON, and ``index.html`` is
    written last, so its presence means the report is complete.  Damaged shards are left
    out, named (``echo``, else the log) and listed at the top of the page.
    """
    from pipeline.aggregate.images import ImageReader

    samples, predictions, left_out = load_sound_tables(store, [c.name for c in cfg.classifiers])
    for shard, reason in sorted(left_out.items()):
        msg = (f"[cnsbench] warning: left damaged shard {shard} out of the report ({reason}); "
               f"`{resume_command(store, cfg)}` redoes it")
        (echo or log.warning)(msg)
    lead = [_left_out_section(store, cfg, left_out)] if left_out else None
    title = f"{cfg.benchmark.name}: accuracy drop and failure points"
    return render_report(
        store, "report", cfg, samples, predictions, title, digest, ImageReader(store, samples), lead=lead
    )


def render_report(
    store: OutputStore,
    folder: str,
    cfg: BuildConfig,
    samples: pd.DataFrame,
    predictions: pd.DataFrame,
    title: str,
    digest: str | None = None,
    read_image=None,
    lead: list[tuple[str, str]] | None = None,
    progress=None,
) -> str:
    """Run the analyses of ``cfg`` on the tables and write their files and ``index.html`` under
    ``folder`` of ``store`` (``""``: its root); ``lead`` sections open the page.  Returns the
    index's URL.  ``progress`` (a :class:`pipeline.runtime.progress.Progress`) counts the analyses."""
    from pipeline.aggregate.images import ImageReader
    from pipeline.aggregate.report import png_bytes, page_html
    from pipeline.aggregate.analysis import AnalysisContext
    from pipeline.registry import ANALYSES

    doc: dict = {"title": title, "config_hash": digest}
    sections: list[tuple[str, str]] = list(lead or [])
    files: dict[str, bytes] = {}
    read_image = read_image or ImageReader(store, samples)
    memo: dict = {}  # shared by the analyses of this report (AnalysisContext.memo)
    for name, options in analysis_plan(cfg):
        ctx = AnalysisContext(cfg, samples, predictions, options=options, config_hash=digest, read_image=read_image,
                              memo=memo)
        result = ANALYSES.get(name)(ctx)
        files.update(result.files)
        for tname, table in result.tables.items():
            files[f"{tname}.csv"] = table.to_csv(index=False).encode("utf-8")
        for fname, fig in result.figures.items():
            files[f"{fname}.png"] = png_bytes(fig)
        if name == "cns":
            doc.update(result.json)  # the CNS metrics stay at the top level of metrics.json
        elif result.json:
            doc.setdefault("analyses", {})[name] = result.json
        if result.html:
            sections.append((result.title, result.html))
        if progress is not None:
            progress.advance(1)
    # Strict JSON: an analysis' non-finite number (undefined on degenerate data) is written as null.
    files["metrics.json"] = (strict_dumps(doc, indent=2) + "\n").encode("utf-8")
    order = ["accuracy.csv", "failure_points.csv", "summary.csv", "metrics.json"]
    names = [n for n in order if n in files] + [n for n in files if n not in order]
    prefix = f"{folder.strip('/')}/" if folder.strip("/") else ""
    for fname in names:
        store.write_bytes(f"{prefix}{fname}", files[fname])
    data_files = [n for n in names if not n.endswith(".png")]
    store.write_bytes(f"{prefix}index.html", page_html(title, digest, sections, data_files).encode("utf-8"))
    return store.url(f"{prefix}index.html")
