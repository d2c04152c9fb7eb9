"""Reclassify stage: add predictions of newly configured classifiers to committed shards.

When a config adds classifiers to an existing output, only the new work is done: each
committed shard's images are read back from its tar, classified by the new classifiers
only (the same ``ClassifyStage`` a build uses), written as an extra predictions file, and
the shard's manifest is rewritten to list that file and the classifiers it now covers.
The manifest rewrite is the commit: a crash before it leaves an unreferenced file that
the next run removes and redoes.

A new vlm classifier draws its distractors from another classifier's ranking
(:mod:`pipeline.models.vqa_protocols`).  When that classifier is one the shard already
has, its predictions are read back from the shard's ``predictions/*.parquet`` and handed
to the classify stage as those of an earlier group, so the vlm is asked what a build with
it from the start asks; the images' ``params`` (a release's question) go along too.
"""

from __future__ import annotations

import hashlib
import io
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.plan import schema
from pipeline.io.store import OutputStore
from pipeline.io.tables import parquet_bytes
from pipeline.io.webdataset import iter_tar
from pipeline.stages.base import Stage
from pipeline.stages.classify import ClassifyStage, group_stages
from pipeline.stages.write import commit_manifest, prediction_rows

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


def stored_predictions(store: OutputStore, files: dict[str, Any], names: tuple[str, ...]) -> dict[str, list[dict]]:
    """Per classifier of ``names`` (in that order), its committed prediction rows from the
    shard's ``predictions/*.parquet`` files (``files``: the manifest's)."""
    out: dict[str, list[dict]] = {n: [] for n in names}
    if not names:
        return out
    for rel in sorted(f for f in files if f.startswith("predictions/")):
        table = pq.read_table(io.BytesIO(store.read_bytes(rel)))
        for p in table.to_pylist():
            if p["classifier"] in out:
                out[p["classifier"]].append(p)
    return out


def stored_columns(stored: dict[str, list[dict]], sample_ids: list[str]) -> dict[str, list]:
    """The classify stage's per-image prediction columns (:data:`pipeline.plan.schema.CLASSIFIED`)
    of a trajectory's images, one entry per stored classifier, as the stage fills them."""
    if not stored:
        return {}
    by_sample = {n: {p["sample_id"]: p for p in rows} for n, rows in stored.items()}
    cols: dict[str, list] = {k: [] for k in ("pred_top1", "pred_top5", "pred_p_true", "pred_answer", "pred_excluded")}
    for sid in sample_ids:
        try:
            per = [by_sample[n][sid] for n in stored]
        except KeyError as err:
            raise RuntimeError(f"reclassify: no stored prediction of {err} for {sid}") from err
        cols["pred_top1"].append([p["top1"] for p in per])
        cols["pred_top5"].append([list(p["top5"]) for p in per])
        cols["pred_p_true"].append([float("nan") if p["p_true"] is None else p["p_true"] for p in per])
        cols["pred_answer"].append([p.get("answer") for p in per])
        cols["pred_excluded"].append([p.get("excluded") for p in per])
    return cols


class ReclassifyStage(Stage):
    name = "reclassify"
    output_schema = schema.WRITTEN
    # Attempt markers per shard, as the writer keeps them: on Ray a shard is retried without
    # limit while its actor is only unreachable (a lost node); one whose reclassification
    # killed the worker max_retries + 1 times stops the run, and the next run redoes it.

    def batch_keys(self, rows: list[dict[str, Any]]) -> list[str]:
        return [r["shard"] for r in rows]

    def give_up(self, rows: list[dict[str, Any]], attempts: int) -> pa.Table:
        shards = ", ".join(r["shard"] for r in rows)
        raise RuntimeError(f"[reclassify] the worker crashed {attempts} times while adding predictions to {shards}: "
                           "the run stops here; the next run of the same command redoes it")

    def __init__(self, config, output: str | None = None, device: str | None = None, threads: int | None = None,
                 built_with: list[str] | None = None, lease_token: str | None = None) -> None:
        super().__init__(config, output, device, threads)
        self.built_with = list(built_with or [])
        self.lease_token = lease_token  # checked before each commit (pipeline.stages.write.commit_manifest)

    def setup(self) -> None:
        self.store = OutputStore(self.output)
        self._classify: dict[tuple[str, ...], ClassifyStage] = {}

    def _classified(
        self, names: tuple[str, ...], rows: list[dict[str, Any]], stored: tuple[str, ...] = ()
    ) -> tuple[list[dict], list[str]]:
        """``rows`` classified by the classifiers ``names`` and the names of all the
        classifiers the rows then carry predictions of (in config order).

        ``stored``: classifiers whose predictions the rows carry already (in config order),
        those the new vlms draw distractors from; they run as an earlier group would.
        One group (``resources.classify.memory_budget_gb`` unset, or everything fits) stays
        loaded for the next shard; several groups load one after the other, so only one
        group's models are in memory at a time."""
        specs = [c for c in self.config.classifiers if c.name in names or c.name in stored]
        sub = self.config.model_copy(update={"classifiers": specs})
        ordered = [c.name for c in specs]
        new = [i for i, c in enumerate(specs) if c.name in names]
        done = [i for i, c in enumerate(specs) if c.name in stored]
        stages = group_stages(sub, new, done)
        if len(stages) == 1:
            key = (names, stored)
            if key not in self._classify:
                self._classify[key] = self._loaded(sub, stages[0])
            return self._classify[key].process(rows), ordered
        for kwargs in stages:
            stage = self._loaded(sub, kwargs)
            rows = stage.process(rows)
            del stage
        return rows, ordered

    def _loaded(self, sub, kwargs: dict[str, list[int]]) -> ClassifyStage:
        """A classify stage of ``sub`` (``kwargs``: :func:`pipeline.stages.classify.group_stages`'), set up."""
        stage = ClassifyStage(sub, device=self.device_override, **kwargs)
        stage.ensure_setup()
        return stage

    def _sources(self, names: tuple[str, ...], have: list[str]) -> tuple[str, ...]:
        """The classifiers of ``have`` (not re-run) that new vlms of ``names`` draw distractors
        from, in config order."""
        from pipeline.config.vqa import asks, distractor_classifier

        wanted = {
            distractor_classifier(c.protocol or {})
            for c in self.config.classifiers
            if c.name in names and asks(c.kind)
        }
        return tuple(c.name for c in self.config.classifiers if c.name in wanted and c.name in have and c.name not in names)

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
        if not images and samples:  # an evaluation output: the images are its benchmark's (pipeline.io.image_refs)
            images = referenced_images(store, samples)

        have = manifest.classifiers if manifest.classifiers is not None else list(self.built_with)
        sources = self._sources(names, have)
        stored = stored_predictions(store, manifest.files, sources)

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
                    "params": [s.get("params") for s in group],
                    "error": None,
                    **stored_columns(stored, [s["sample_id"] for s in group]),
                }
            )
        classified, ordered = self._classified(names, rows, sources)
        preds = [p for r in classified for p in prediction_rows(r, ordered) if p["classifier"] in names]
        ordered = [n for n in ordered if n in names]

        tag = hashlib.sha256(",".join(sorted(names)).encode()).hexdigest()[:8]
        rel = f"predictions/{shard}.{tag}.parquet"
        files = dict(manifest.files)
        files[rel] = store.write_bytes(rel, parquet_bytes(preds, schema.PREDICTIONS))
        manifest.files = files
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


def referenced_images(store: OutputStore, samples: list[dict[str, Any]]) -> dict[str, bytes]:
    """Image bytes by member key of a shard whose sample rows name another output's shards."""
    from pipeline.io.image_refs import referred_members

    return {key: next(v for k, v in members.items() if k != "json")
            for key, members in referred_members(store, samples)}
