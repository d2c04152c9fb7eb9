"""Reclassify stage: add predictions of newly configured classifiers to committed shards.

When a config adds classifiers to an existing output, only the new work is done: each
committed shard's images are read back from its tar, classified by the new classifiers
only (the same ``ClassifyStage`` a build uses), written as an extra predictions file, and
the shard's manifest is rewritten to list that file and the classifiers it now covers.
The manifest rewrite is the commit: a crash before it leaves an unreferenced file that
the next run removes and redoes.
"""

from __future__ import annotations

import hashlib
import io
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import schema
from pipeline.io.store import OutputStore
from pipeline.io.webdataset import iter_tar
from pipeline.stages.base import Stage
from pipeline.stages.classify import ClassifyStage
from pipeline.stages.write import _parquet_bytes, commit_manifest, prediction_rows

# Input rows: one committed shard and the classifiers it lacks.
RECLASSIFY = pa.schema([("shard", pa.string()), ("classifiers", pa.list_(pa.string()))])


def missing_classifiers(store: OutputStore, names: list[str], built_with: list[str]) -> list[dict[str, Any]]:
    """One row per committed shard lacking predictions of some of ``names``
    (``built_with``: the classifiers of shards whose manifest does not list them)."""
    rows = []
    for manifest in store.manifests():
        if not manifest.trajectories:
            continue
        have = built_with if manifest.classifiers is None else manifest.classifiers
        lacking = [n for n in names if n not in have]
        if lacking:
            rows.append({"shard": manifest.shard, "classifiers": lacking})
    return rows


class ReclassifyStage(Stage):
    name = "reclassify"
    output_schema = schema.WRITTEN
    keeps_attempts = False  # a shard that keeps crashing fails the run; the next run redoes it

    def __init__(
        self,
        config,
        output: str | None = None,
        device: str | None = None,
        threads: int | None = None,
        built_with: list[str] | None = None,
        lease_token: str | None = None,
    ) -> None:
        super().__init__(config, output, device, threads)
        self.built_with = list(built_with or [])
        self.lease_token = lease_token  # checked before each commit (pipeline.stages.write.commit_manifest)

    def setup(self) -> None:
        self.store = OutputStore(self.output)
        self._classify: dict[tuple[str, ...], ClassifyStage] = {}

    def _classified(self, names: tuple[str, ...], rows: list[dict[str, Any]]) -> tuple[list[dict], list[str]]:
        """``rows`` classified by the classifiers ``names`` (in config order) and those names.

        One group (``resources.classify.memory_budget_gb`` unset, or everything fits) stays
        loaded for the next shard; several groups load one after the other, so only one
        group's models are in memory at a time."""
        from pipeline.memory import classifier_groups

        specs = [c for c in self.config.classifiers if c.name in names]
        sub = self.config.model_copy(update={"classifiers": specs})
        ordered = [c.name for c in specs]
        groups = classifier_groups(sub)
        if len(groups) == 1:
            if names not in self._classify:
                stage = ClassifyStage(sub, device=self.device_override)
                stage.ensure_setup()
                self._classify[names] = stage
            return self._classify[names].process(rows), ordered
        done: list[int] = []
        for group in groups:
            stage = ClassifyStage(sub, device=self.device_override, classifiers=group, done=done)
            stage.ensure_setup()
            rows = stage.process(rows)
            done += group
            del stage
        return rows, ordered

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [self.add_predictions(r["shard"], tuple(r["classifiers"])) for r in rows]

    def add_predictions(self, shard: str, names: tuple[str, ...]) -> dict[str, Any]:
        store = self.store
        manifest = next(m for m in store.manifests() if m.shard == shard)
        samples_rel = f"samples/{shard}.parquet"
        samples = pq.read_table(io.BytesIO(store.read_bytes(samples_rel))).to_pylist()
        images: dict[str, bytes] = {}
        for rel in (r for r in manifest.files if r.startswith("images/")):
            for key, members in iter_tar(store.read_bytes(rel), store.url(rel)):
                images[key] = next(v for k, v in members.items() if k != "json")

        by_traj: dict[str, list[dict]] = {}
        for s in samples:
            by_traj.setdefault(s["trajectory_id"], []).append(s)
        rows = []
        for tid, group in sorted(by_traj.items()):
            group.sort(key=lambda s: s["scale"])
            first = group[0]
            rows.append(
                {
                    "trajectory_id": tid,
                    "class_id": first["class_id"],
                    "class_name": first["class_name"],
                    "sample_ids": [s["sample_id"] for s in group],
                    "scales": [s["scale"] for s in group],
                    "images": [images[s["key"]] for s in group],
                    "error": None,
                }
            )
        classified, ordered = self._classified(names, rows)
        preds = [p for r in classified for p in prediction_rows(r, ordered)]

        tag = hashlib.sha256(",".join(sorted(names)).encode()).hexdigest()[:8]
        rel = f"predictions/{shard}.{tag}.parquet"
        files = dict(manifest.files)
        files[rel] = store.write_bytes(rel, _parquet_bytes(preds, schema.PREDICTIONS))
        manifest.files = files
        have = manifest.classifiers if manifest.classifiers is not None else list(self.built_with)
        manifest.classifiers = have + [n for n in ordered if n not in have]
        commit_manifest(store, manifest, self.lease_token)
        return {
            "shard": shard,
            "n_trajectories": 0,
            "n_samples": len(preds),
            "n_failed": 0,
            "unet_evals": 0.0,
            "gen_seconds": 0.0,
        }
