"""The benchmark browser's in-memory index of a build output's committed shards.

:class:`BenchmarkIndex` reads the shards vouched for by a manifest (as the aggregation
does), derives once what the browse endpoints need (:class:`Snapshot`: samples,
per-classifier predictions, complete trajectories and failure points per family, tar
locations), and reloads when the set of manifests or report files changes, so a build
still running shows up as it commits shards.  A shard whose manifest or files cannot be
read is skipped and listed (``skipped_manifests`` of :meth:`BenchmarkIndex.info`): one
corrupt shard does not take the browser down.  Image bytes are read straight from the
tar at the member's offset; a shard's offsets are indexed on first use and kept.
While ``--new-version`` moves the output's files under ``previous/``, a listed file that
cannot be read is 503 (:class:`~pipeline.serve.errors.OutputReplaced`), one gone for good 404.
"""

from __future__ import annotations

import json
import logging
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import quote

from pipeline.errors import CnsbenchError
from pipeline.io.image_refs import ShardStores
from pipeline.io.webdataset import tar_members
from pipeline.plan import schema
from pipeline.serve.errors import NotFound, as_flag, is_missing, json_number, read_listed
from pipeline.serve.options import IMAGE_TYPES, REPORT_TYPES

if TYPE_CHECKING:
    import pandas as pd

    from pipeline.io.store import OutputStore

log = logging.getLogger(__name__)


@dataclass
class Snapshot:
    """Everything the browse endpoints need, derived once from the committed shards."""

    key: tuple
    name: str
    config_hash: str | None
    scales: list[float]
    classifiers: list[str]
    labels: Any
    samples: "pd.DataFrame"  # positional rows; one per sample id
    groups: dict[tuple[str, int], Any]  # (shift, class_id) -> positions into samples
    preds: dict[str, dict[str, Any]]  # classifier -> {"top1", "p_true", "correct", "has"} arrays by position
    location: dict[str, tuple[str, str]]  # sample id -> (shard tar, member key)
    complete: set[str]
    failure_points: dict[tuple[str, str], float | None]
    shifts: list[dict[str, Any]]
    classes: dict[str, list[dict[str, Any]]]  # shift -> classes of that shift
    report_files: list[str]
    shift_scales: dict[str, list[float]] = field(default_factory=dict)  # shift -> its family's scales
    skipped: list[dict[str, str]] = field(default_factory=list)  # {"file", "reason"} of unreadable shards


def open_output(output: str) -> "OutputStore":
    """The :class:`OutputStore` of an existing build output, or a clear FileNotFoundError."""
    from pipeline.io.store import OutputStore

    if "://" not in output and not Path(output).is_dir():
        raise FileNotFoundError(f"output {output!r} is not a directory; build one with `cnsbench build CONFIG --output DIR`")
    store = OutputStore(output)
    if not store.exists("config.json"):
        raise FileNotFoundError(f"{store.url('config.json')} not found: is {output} a cnsbench build output?")
    return store


def read_committed(store: "OutputStore") -> tuple["pd.DataFrame", "pd.DataFrame", list[dict[str, str]]]:
    """(samples, predictions, skipped) of every committed shard whose manifest and files read.

    ``skipped`` lists ``{"file": "manifest/<shard>.json", "reason": ...}`` for each shard
    left out; reasons name files relative to the output.
    """
    import pyarrow as pa

    from pipeline.io.tables import read_shard_tables
    from pipeline.io.store import MANIFEST_DIR

    samples: list[pa.Table] = []
    preds: list[pa.Table] = []
    skipped: list[dict[str, str]] = []
    root = store.url("")
    # Malformed manifests and ones overlapping an earlier commit are left out (and listed);
    # pipeline.io.manifest checks every file entry stays a file of its own shard.
    scan = store.scan()
    skipped += [{"file": p.file, "reason": p.reason} for p in scan.problems]
    for manifest in scan.manifests:
        rel = f"{MANIFEST_DIR}/{manifest.shard}.json"
        try:
            shard_samples = read_shard_tables(store, manifest, "samples", schema.SAMPLES)
            shard_preds = read_shard_tables(store, manifest, "predictions", schema.PREDICTIONS)
        except Exception as err:  # any unreadable shard is skipped, reported, and the rest served
            reason = str(err).replace(root, "") if root else str(err)
            log.warning("skipping shard of %s: %s", rel, reason)
            skipped.append({"file": rel, "reason": reason})
            continue
        samples += shard_samples
        preds += shard_preds

    def frame(tables: list[pa.Table], sch: pa.Schema) -> "pd.DataFrame":
        return (pa.concat_tables(tables) if tables else sch.empty_table()).to_pandas()

    return frame(samples, schema.SAMPLES), frame(preds, schema.PREDICTIONS), skipped


def _prediction_arrays(samples: "pd.DataFrame", preds: "pd.DataFrame", names: list[str]) -> dict[str, dict[str, Any]]:
    """Per classifier: arrays aligned with the rows of ``samples`` (``has`` false where none)."""
    import numpy as np
    import pandas as pd

    position = pd.Series(np.arange(len(samples)), index=samples["sample_id"].astype(str))
    per_clf: dict[str, dict[str, Any]] = {}
    for name in names:
        g = preds[preds["classifier"] == name]
        pos = position.reindex(g["sample_id"].astype(str)).to_numpy()
        ok = ~np.isnan(pos)
        idx = pos[ok].astype(np.int64)
        arrays = {
            "has": np.zeros(len(samples), dtype=bool),
            "top1": np.full(len(samples), -1, dtype=np.int64),
            "p_true": np.full(len(samples), np.nan),
            "correct": np.zeros(len(samples), dtype=bool),
        }
        arrays["has"][idx] = g["correct"].notna().to_numpy()[ok]
        arrays["top1"][idx] = g["top1"].fillna(-1).astype(np.int64).to_numpy()[ok]
        arrays["p_true"][idx] = g["p_true"].astype(float).to_numpy()[ok]
        arrays["correct"][idx] = g["correct"].astype("boolean").fillna(False).astype(bool).to_numpy()[ok]
        per_clf[name] = arrays
    return per_clf


def build_snapshot(store: "OutputStore", key: tuple) -> Snapshot:
    """Read the committed shards of ``store`` and derive the :class:`Snapshot` (``key``: its listing)."""
    import pandas as pd

    from pipeline.aggregate.metrics import complete_trajectories, failure_points
    from pipeline.aggregate.run import load_output_config

    cfg = load_output_config(store)
    try:
        digest = json.loads(store.read_text("config.json")).get("config_hash")
    except ValueError:
        digest = None
    samples, preds, skipped = read_committed(store)
    samples = samples.drop_duplicates("sample_id").reset_index(drop=True)

    # The config's classifiers, as the aggregation counts them (an output may hold
    # predictions of others, e.g. added later and not yet in its config).
    names = [c.name for c in cfg.classifiers]
    preds = preds[preds["classifier"].isin(names)].reset_index(drop=True)

    # Completeness and failure points per family: each has its own scale grid.
    complete: set[str] = set()
    fps: dict[tuple[str, str], float | None] = {}
    shift_scales: dict[str, list[float]] = {}
    for group in cfg.family_groups():
        shift_scales.update({s: list(group.scales) for s in group.shifts})
        sub = samples[samples["shift"].isin(group.shifts)]
        complete |= complete_trajectories(sub, group.scales)
        for r in failure_points(sub, preds, group.scales).itertuples(index=False):
            fps[(str(r.trajectory_id), str(r.classifier))] = None if pd.isna(r.failure_point) else float(r.failure_point)

    groups = {(str(s), int(c)): idx for (s, c), idx in samples.groupby(["shift", "class_id"]).indices.items()}
    classes: dict[str, list[dict[str, Any]]] = {}
    for (shift, class_id), idx in sorted(groups.items()):
        tids = set(samples["trajectory_id"].iloc[idx].astype(str))
        classes.setdefault(shift, []).append(
            {
                "class_id": class_id,
                "class_name": str(samples["class_name"].iloc[idx[0]]),
                "n_trajectories": len(tids),
                "n_complete": len(tids & complete),
            }
        )
    shifts = [
        {
            "shift": shift,
            "n_classes": len(classes[shift]),
            "n_trajectories": sum(c["n_trajectories"] for c in classes[shift]),
            "n_complete": sum(c["n_complete"] for c in classes[shift]),
        }
        for shift in sorted(classes)
    ]
    location = dict(zip(samples["sample_id"].astype(str), zip(samples["shard"].astype(str), samples["key"].astype(str))))
    return Snapshot(
        key=key,
        name=cfg.benchmark.name,
        config_hash=digest,
        scales=list(cfg.benchmark.scales),
        classifiers=names,
        labels=cfg.benchmark.label_space,
        samples=samples,
        groups=groups,
        preds=_prediction_arrays(samples, preds, names),
        location=location,
        complete=complete,
        failure_points=fps,
        shifts=shifts,
        classes=classes,
        report_files=sorted(rel.rsplit("/", 1)[-1] for rel in key[1]),
        shift_scales=shift_scales,
        skipped=skipped,
    )


class BenchmarkIndex:
    """In-memory index of a build output: samples, predictions, failure points, tar offsets.

    Reloads when the set of manifests or report files changes (checked at most every
    ``refresh_s`` seconds; 0: never).  A reload that fails keeps the previous snapshot.
    """

    def __init__(self, output: str, refresh_s: float = 10.0) -> None:
        self.store = open_output(output)
        self.refresh_s = refresh_s
        self._lock = threading.RLock()
        self._tar_index: dict[str, dict[str, dict[str, tuple[int, int]]]] = {}
        self._snap = build_snapshot(self.store, self._listing())
        self._checked = time.monotonic()

    def _listing(self) -> tuple:
        from pipeline.io.store import MANIFEST_DIR

        return (tuple(self.store.list(MANIFEST_DIR, ".json")), tuple(self.store.list("report")))

    def snapshot(self) -> Snapshot:
        """The current snapshot, reloaded first when the committed shards changed."""
        if self.refresh_s and time.monotonic() - self._checked >= self.refresh_s:
            with self._lock:
                if time.monotonic() - self._checked >= self.refresh_s:
                    try:
                        key = self._listing()
                        if key != self._snap.key:
                            log.info("benchmark output changed; reloading the index")
                            self._snap = build_snapshot(self.store, key)
                            self._tar_index.clear()  # a redone shard keeps its name but not its offsets
                    except Exception:  # keep serving what was read; try again after refresh_s
                        log.exception("reloading the benchmark index failed; serving the previous one")
                    self._checked = time.monotonic()
        return self._snap

    def _reading(self, what: str, read: Callable[[], Any]) -> Any:
        """``read()`` of a file the snapshot lists (:func:`~pipeline.serve.errors.read_listed`)."""
        return read_listed(what, read, self._changed, max(1.0, self.refresh_s))

    def _changed(self) -> bool:
        """Whether the output's marker or listing changed since the snapshot; reloads at the next request."""
        snap, self._checked = self._snap, float("-inf")
        return not self.store.exists("config.json") or self._listing() != snap.key

    # ------------------------------------------------------------------ queries
    def info(self) -> dict[str, Any]:
        snap = self.snapshot()
        return {
            "name": snap.name,
            "config_hash": snap.config_hash,
            "scales": snap.scales,
            "classifiers": snap.classifiers,
            "shifts": [s["shift"] for s in snap.shifts],
            "n_samples": len(snap.samples),
            "n_trajectories": int(sum(s["n_trajectories"] for s in snap.shifts)),
            "n_complete": int(sum(s["n_complete"] for s in snap.shifts)),
            "report": "metrics.json" in snap.report_files,
            "report_files": snap.report_files,
            "skipped_manifests": [dict(s) for s in snap.skipped],
        }

    def shifts(self) -> dict[str, Any]:
        snap = self.snapshot()
        return {"shifts": snap.shifts, "scales": snap.scales, "classifiers": snap.classifiers}

    @staticmethod
    def _check_shift(snap: Snapshot, shift: str) -> None:
        if shift not in snap.classes:
            raise NotFound(f"unknown shift {shift!r}", sorted(snap.classes))

    def classes(self, shift: str | None = None) -> dict[str, Any]:
        snap = self.snapshot()
        if shift is not None:
            self._check_shift(snap, shift)
            return {"shift": shift, "classes": snap.classes[shift]}
        merged: dict[int, dict[str, Any]] = {}
        for rows in snap.classes.values():
            for c in rows:
                m = merged.setdefault(c["class_id"], {**c, "n_trajectories": 0, "n_complete": 0})
                m["n_trajectories"] += c["n_trajectories"]
                m["n_complete"] += c["n_complete"]
        return {"shift": None, "classes": [merged[k] for k in sorted(merged)]}

    def trajectories(self, shift: str, class_id: int) -> dict[str, Any]:
        """Trajectories of (shift, class): samples by scale, predictions, failure points.

        ``failure_points[classifier]`` is the smallest scale at which the classifier is
        wrong, ``null`` if it is never wrong; it is given only for complete trajectories
        (every scale present and kept), the ones the metrics use, and is ``null`` as a
        whole for incomplete ones.
        """
        snap = self.snapshot()
        self._check_shift(snap, shift)
        idx = snap.groups.get((shift, int(class_id)))
        if idx is None:
            raise NotFound(f"class {class_id} has no trajectories for shift {shift!r}", snap.classes[shift])
        sub = snap.samples.iloc[idx].assign(row_pos=idx).sort_values(["seed", "trajectory_id", "scale"], kind="stable")
        out = []
        for tid, g in sub.groupby("trajectory_id", sort=False):
            tid = str(tid)
            complete = tid in snap.complete
            fps = None
            if complete:
                fps = {n: snap.failure_points[(tid, n)] for n in snap.classifiers if (tid, n) in snap.failure_points}
            out.append(
                {
                    "trajectory_id": tid,
                    "seed": int(g["seed"].iloc[0]),
                    "complete": complete,
                    "failure_points": fps,
                    "samples": [self._sample(snap, r) for r in g.itertuples(index=False)],
                }
            )
        return {
            "shift": shift,
            "class_id": int(class_id),
            "class_name": str(sub["class_name"].iloc[0]),
            "scales": snap.shift_scales.get(shift, snap.scales),
            "classifiers": snap.classifiers,
            "trajectories": out,
        }

    @staticmethod
    def _sample(snap: Snapshot, r: Any) -> dict[str, Any]:
        pos = int(r.row_pos)
        predictions = {}
        for name, a in snap.preds.items():
            if not a["has"][pos]:
                continue
            top1 = int(a["top1"][pos])
            predictions[name] = {
                "top1": top1,
                "top1_name": snap.labels.name(top1) if 0 <= top1 < len(snap.labels) else "(unmapped)",
                "p_true": json_number(a["p_true"][pos]),
                "correct": bool(a["correct"][pos]),
            }
        sid = str(r.sample_id)
        return {
            "sample_id": sid,
            "scale": float(r.scale),
            "kept": as_flag(r.kept),
            "n_pass": None if is_missing(r.n_pass) else int(r.n_pass),
            "scores": {c: json_number(getattr(r, c)) for c in schema.SCORE_COLUMNS},
            "image": "api/benchmarks/image/" + quote(sid, safe="/"),
            "predictions": predictions,
        }

    def image(self, sample_id: str) -> tuple[bytes, str] | None:
        """(bytes, content type) of a sample's stored image; None for an unknown sample id.

        ``sample_id`` is only used as a dictionary key: the shard and member come from
        the samples table, never from the request.
        """
        snap = self.snapshot()
        loc = snap.location.get(sample_id)
        if loc is None:
            return None
        shard, key = loc
        return self._reading(f"image {sample_id!r}", lambda: self._image_bytes(shard, key))

    def _image_bytes(self, shard: str, key: str) -> tuple[bytes, str]:
        members = self._members(shard).get(key, {})
        for ext, mime in IMAGE_TYPES.items():
            if ext in members:
                offset, size = members[ext]
                holder = ShardStores(self.store)(shard)  # an evaluation output's: its benchmark's
                with holder.fs.open(holder.path(shard), "rb") as fh:
                    fh.seek(offset)
                    data = fh.read(size)
                if len(data) != size:
                    raise CnsbenchError(f"{holder.url(shard)} is truncated at member {key}.{ext}")
                return data, mime
        raise CnsbenchError(f"{ShardStores(self.store)(shard).url(shard)} has no image member for sample {key!r}")

    def _members(self, shard: str) -> dict[str, dict[str, tuple[int, int]]]:
        """Member key -> {extension: (data offset, size)} of a tar shard; read once, then cached."""
        with self._lock:
            cached = self._tar_index.get(shard)
            if cached is not None:
                return cached
            index: dict[str, dict[str, tuple[int, int]]] = {}
            holder = ShardStores(self.store)(shard)  # an evaluation output's: its benchmark's
            try:
                with holder.fs.open(holder.path(shard), "rb") as fh, tarfile.open(fileobj=fh, mode="r:") as tar:
                    for key, ext, info in tar_members(tar):
                        index.setdefault(key, {})[ext] = (info.offset_data, info.size)
            except (tarfile.TarError, EOFError) as err:
                raise CnsbenchError(f"malformed WebDataset shard {holder.url(shard)}: {err}") from None
            self._tar_index[shard] = index
            return index

    def report_metrics(self) -> bytes:
        snap = self.snapshot()
        if "metrics.json" not in snap.report_files:
            raise NotFound("no report yet: run `cnsbench aggregate` on the output", [])
        return self._reading("report/metrics.json", lambda: self.store.read_bytes("report/metrics.json"))

    def report_file(self, name: str) -> tuple[bytes, str]:
        """A report file by its listed name; the path is built from the listing, not the request."""
        snap = self.snapshot()
        for listed in snap.report_files:
            suffix = "." + listed.rsplit(".", 1)[-1] if "." in listed else ""
            if listed == name and suffix in REPORT_TYPES:
                return self._reading(f"report/{listed}", lambda: self.store.read_bytes(f"report/{listed}")), REPORT_TYPES[suffix]
        raise NotFound(f"no report file {name!r}", [f for f in snap.report_files if "." + f.rsplit(".", 1)[-1] in REPORT_TYPES])
