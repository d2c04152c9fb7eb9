"""Write stage: a batch of classified trajectory rows -> one committed output shard.

Per shard it writes the WebDataset tar, the ``samples`` and ``predictions`` Parquet
files (and ``failures`` when a trajectory failed upstream), then the manifest as the
done-marker.  The shard name is a hash of the trajectory ids it holds, so a redone
shard lands on the same file names.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import pyarrow as pa

from pipeline.runtime import faults

from pipeline.plan import schema
from pipeline.io.lease import check_holder
from pipeline.io.store import OutputStore, ShardManifest
from pipeline.io.tables import parquet_bytes
from pipeline.io.webdataset import build_tar, metadata_json
from pipeline.stages.base import Stage


def shard_name(trajectory_ids: list[str]) -> str:
    digest = hashlib.sha256("\n".join(sorted(trajectory_ids)).encode()).hexdigest()[:16]
    return f"shard-{digest}"


def prediction_rows(row: dict[str, Any], classifiers: list[str]) -> list[dict[str, Any]]:
    """The ``predictions`` table rows of one classified trajectory row, per image and classifier."""
    out = []
    answers, excluded = row.get("pred_answer"), row.get("pred_excluded")  # vlm classifiers only
    for i, sid in enumerate(row["sample_ids"]):
        for j, clf in enumerate(classifiers):
            top1 = row["pred_top1"][i][j]
            dropped = excluded[i][j] if excluded else None
            out.append(
                {
                    "sample_id": sid,
                    "classifier": clf,
                    "top1": top1,
                    "top5": row["pred_top5"][i][j],
                    "p_true": row["pred_p_true"][i][j],
                    "correct": None if dropped else top1 == row["class_id"],
                    "answer": answers[i][j] if answers else None,
                    "excluded": dropped,
                }
            )
    return out


def commit_manifest(store: OutputStore, manifest: ShardManifest, lease_token: str | None) -> None:
    """Commit a shard, only while the run still holds the output's lease (when it has one)."""
    if lease_token:
        check_holder(store, lease_token)
    store.commit_manifest(manifest)


def _stage_of(error: str) -> str:
    """Errors start with ``[stage]``; older or foreign messages count as generation errors."""
    if error.startswith("[") and "]" in error:
        return error[1 : error.index("]")]
    return "generate"


def _nan_to_none(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


class WriteStage(Stage):
    name = "write"
    output_schema = schema.WRITTEN
    # Attempt markers as in the other stages, so that the Ray runner may retry a write
    # without limit while its actor is only unreachable (a lost node, until Ray declares it
    # dead and restarts the actor elsewhere); a shard whose write killed the worker
    # max_retries + 1 times fails the run (give_up), and the next run redoes its trajectories.
    keeps_attempts = True
    # One batch is one shard: exactly ``output.trajectories_per_shard`` rows (the last may hold fewer).
    exact_batches = True
    uses_torch = False

    def __init__(self, config, output: str | None = None, device: str | None = None, threads: int | None = None,
                 lease_token: str | None = None) -> None:
        super().__init__(config, output, device, threads)
        # The run's lease: checked before each commit, so a writer whose lease was taken
        # over commits nothing more (pipeline.io.lease.check_holder).
        self.lease_token = lease_token

    def setup(self) -> None:
        from pipeline.io.image_refs import benchmark_locations, referenced

        self.store = OutputStore(self.output)
        # An evaluation of a built benchmark refers to its images (pipeline.io.image_refs):
        # sample id -> the benchmark's (shard, key); those images are not written again.
        bench = referenced(self.store)
        self.refs = benchmark_locations(bench.uri) if bench is not None else {}

    def give_up(self, rows: list[dict[str, Any]], attempts: int) -> pa.Table:
        """A shard cannot be half failed: the run stops (its committed shards are kept)."""
        name = shard_name([r["trajectory_id"] for r in rows])
        raise RuntimeError(f"[write] the worker crashed {attempts} times while writing {name}: the run stops here; "
                           "the next run of the same command redoes its trajectories")

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not rows:
            return []
        return [self.write_shard(rows)]

    def write_shard(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        cfg = self.config
        ext = cfg.output.image_format
        classifiers = [c.name for c in cfg.classifiers]
        ok = [r for r in rows if not r.get("error")]
        failed = {r["trajectory_id"]: r["error"] for r in rows if r.get("error")}
        name = shard_name([r["trajectory_id"] for r in rows])
        tar_rel = f"images/{name}.tar"

        tar_samples, sample_rows, pred_rows = [], [], []
        for r in sorted(ok, key=lambda r: r["trajectory_id"]):
            for i, (sid, scale) in enumerate(zip(r["sample_ids"], r["scales"])):
                scores = {c: _nan_to_none(r[c][i]) for c in schema.SCORE_COLUMNS}
                for c in schema.REALISATION_COLUMNS:
                    # Optional per-image measures: a filter that does not compute them
                    # (or rows from an older stage) leave them null, not an error.
                    values = r.get(c) or []
                    scores[c] = _nan_to_none(values[i]) if i < len(values) else None
                sample = {
                    "sample_id": sid,
                    "trajectory_id": r["trajectory_id"],
                    "class_id": r["class_id"],
                    "class_name": r["class_name"],
                    "seed": r["seed"],
                    "shift": r["shift"],
                    "scale": scale,
                    "shard": self.refs[sid][0] if sid in self.refs else tar_rel,
                    "key": self.refs[sid][1] if sid in self.refs else sid,
                    **scores,
                    "n_pass": r["n_pass"][i],
                    "kept": r["kept"][i],
                }
                meta = {k: sample[k] for k in sample if k not in ("shard", "key")}
                meta["label"] = r["class_id"]
                params = (r.get("params") or [None] * len(r["scales"]))[i]
                sample["params"] = params
                if params is not None:  # only families that record parameters add them to the tar
                    meta["params"] = json.loads(params)
                sample_rows.append(sample)
                if sid not in self.refs:
                    tar_samples.append((sid, {ext: r["images"][i], "json": metadata_json(meta)}))
            pred_rows.extend(prediction_rows(r, classifiers))

        files: dict[str, dict[str, Any]] = {}
        if tar_samples:
            files[tar_rel] = self.store.write_bytes(tar_rel, build_tar(tar_samples))
        if ok:
            rel = f"samples/{name}.parquet"
            files[rel] = self.store.write_bytes(rel, parquet_bytes(sample_rows, schema.SAMPLES))
            rel = f"predictions/{name}.parquet"
            files[rel] = self.store.write_bytes(rel, parquet_bytes(pred_rows, schema.PREDICTIONS))
        if failed:
            rel = f"failures/{name}.parquet"
            fail_rows = [
                {
                    "trajectory_id": r["trajectory_id"],
                    "unit_id": r["unit_id"],
                    "stage": _stage_of(r["error"]),
                    "error": r["error"],
                }
                for r in rows
                if r.get("error")
            ]
            files[rel] = self.store.write_bytes(rel, parquet_bytes(fail_rows, schema.FAILURES))
        stats = {
            "unet_evals": float(sum(r["unet_evals"] for r in ok)),
            "gen_seconds": float(sum(r["gen_seconds"] for r in ok)),
        }
        manifest = ShardManifest(
            shard=name,
            trajectories=sorted(r["trajectory_id"] for r in ok),
            files=files,
            n_samples=len(sample_rows),
            failed=failed,
            stats=stats,
            classifiers=classifiers,
        )
        faults.inject("write", "before_manifest", manifest.trajectories or list(failed))
        commit_manifest(self.store, manifest, self.lease_token)  # the done-marker: written last
        return {
            "shard": name,
            "n_trajectories": len(ok),
            "n_samples": len(sample_rows),
            "n_failed": len(failed),
            **stats,
        }
