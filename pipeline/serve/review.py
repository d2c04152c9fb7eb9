"""Human review of a mined image set (ImageNet-D's quality control).

A *set* is a Parquet table of sample ids in ``report/`` of a build output
(``report/hard_set.parquet``, written by the ``hard_mining`` analysis).  A reviewer gives
each image one decision:

``accept``     the image shows its class (and is usable)
``reject``     unusable (artefacts, ambiguous, several objects) -- no statement about the class
``not_class``  the image does not show its class (out of class)

Decisions are stored next to the output.  Several reviewers (several ``serve``
processes, on one host or many, on local disk or object storage) may decide at once, and
no decision may be lost, so each process writes only its own file,
``review/<set>.writers/<writer>.json`` (``{"set", "writer", "decisions": {sample_id:
{"decision", "time"}}}``, an undo kept as ``"decision": null``), rewritten atomically
(temporary file, then rename; a single PUT on object stores) under the process's lock.
Reading merges every writer's file: per image the latest decision by time wins, an undo
removes it.  The merged view is written to ``review/<set>.json``
(``{"set", "decisions": {sample_id: {"decision", "time"}}}``, the file earlier versions
kept alone and still read as a writer of its own), so a review can stop at any time and
resume where it stopped.  After each change two derived files are refreshed (and
refreshed again while another writer's decisions keep arriving):

* ``review/<set>_final.parquet``: the final set = mined ∩ accepted (the set's rows whose
  decision is ``accept``), in the set's order;
* ``review/<set>_labels.parquet``: the four OOC detector scores of every decided image and
  ``ooc`` (True for ``not_class``, False for ``accept``; ``reject`` says nothing about the
  class and is left out): the input of ``cnsbench calibrate-filter``.
"""

from __future__ import annotations

import io
import json
import os
import platform
import re
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Any

import pandas as pd

from pipeline.errors import CnsbenchError
from pipeline.io.safejson import dumps as strict_dumps
from pipeline.io.store import OutputStore
from pipeline.plan.schema import SCORE_COLUMNS

DECISIONS = ("accept", "reject", "not_class")
SET_NAME = re.compile(r"[a-z0-9][a-z0-9_]{0,63}")  # matched whole (fullmatch)
REVIEW_DIR = "review"
_LOCK = threading.Lock()  # one writer per process: its own file is read, changed and replaced under it
_WRITER: tuple[int, str] | None = None  # (pid, writer id): a forked child gets its own
_LAST_TIME = 0.0
_REFRESHES = 5  # derived files recomputed at most this often per decision while others write


def writer_id() -> str:
    """This process's writer name: host, pid and a random part (a restarted server is a new writer)."""
    global _WRITER
    if _WRITER is None or _WRITER[0] != os.getpid():
        host = re.sub(r"[^A-Za-z0-9_.-]", "_", platform.node() or "host")[:40]
        _WRITER = (os.getpid(), f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    return _WRITER[1]


def _now() -> str:
    """UTC time with microseconds, strictly increasing within the process (called under _LOCK)."""
    global _LAST_TIME
    t = max(time.time(), _LAST_TIME + 1e-6)
    _LAST_TIME = t
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _order(entry: dict[str, Any]) -> str:
    """Sort key of a decision's time: ``...:SSZ`` (older files) sorts as ``...:SS.000000Z``."""
    t = str(entry.get("time") or "")
    return t[:-1] + ".000000Z" if t.endswith("Z") and "." not in t else t


class ReviewError(CnsbenchError):
    """Bad review input: unknown set, sample id or decision (the message names it)."""


class UnknownSet(ReviewError):
    """The set does not exist in this output."""


def _parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


class Review:
    """Review decisions of the sets of one build output."""

    def __init__(self, output: str | OutputStore) -> None:
        self.store = output if isinstance(output, OutputStore) else OutputStore(output)

    # ------------------------------------------------------------------ sets
    def sets(self) -> list[str]:
        """Names of the reviewable sets (``report/<name>.parquet`` with a ``sample_id`` column)."""
        return sorted(
            name[: -len(".parquet")]
            for name in (r.rsplit("/", 1)[-1] for r in self.store.list("report", ".parquet"))
            if SET_NAME.fullmatch(name[: -len(".parquet")])
        )

    def check_set(self, name: str) -> None:
        if not isinstance(name, str) or not SET_NAME.fullmatch(name):
            raise ReviewError(f"set name {name!r} must match {SET_NAME.pattern}")
        if not self.store.exists(f"report/{name}.parquet"):
            raise UnknownSet(f"no set {name!r} in {self.store.uri}/report (sets: {', '.join(self.sets()) or 'none'})")

    def table(self, name: str) -> pd.DataFrame:
        """The mined set's rows (``report/<name>.parquet``)."""
        self.check_set(name)
        df = pd.read_parquet(io.BytesIO(self.store.read_bytes(f"report/{name}.parquet")))
        if "sample_id" not in df.columns:
            raise ReviewError(f"report/{name}.parquet has no sample_id column")
        return df

    # ------------------------------------------------------------------ decisions
    def _path(self, name: str) -> str:
        return f"{REVIEW_DIR}/{name}.json"

    def _writers_dir(self, name: str) -> str:
        return f"{REVIEW_DIR}/{name}.writers"

    def _read_decisions(self, rel: str) -> dict[str, dict[str, Any]]:
        """The ``decisions`` of one file (empty when it is gone); a file that does not parse is an error naming it."""
        try:
            data = json.loads(self.store.read_text(rel))
        except FileNotFoundError:
            return {}
        except ValueError as err:
            raise ReviewError(f"{self.store.url(rel)} is not a review decisions file: {err}") from None
        got = data.get("decisions") if isinstance(data, dict) else None
        if not isinstance(got, dict):
            raise ReviewError(f"{self.store.url(rel)} has no 'decisions' object")
        return {str(k): v for k, v in got.items() if isinstance(v, dict)}

    def _merged(self, name: str) -> dict[str, dict[str, Any]]:
        """Every writer's decisions merged: per image the latest by time; an undo (null) removes it."""
        latest: dict[str, tuple[tuple[str, str], dict[str, Any]]] = {}
        sources = [self._path(name)] + self.store.list(self._writers_dir(name), ".json")
        for rank, rel in enumerate(sources):
            for sid, entry in self._read_decisions(rel).items():
                key = (_order(entry), f"{rank:06d}" if rank == 0 else rel)
                if sid not in latest or key > latest[sid][0]:
                    latest[sid] = (key, entry)
        return {
            sid: {"decision": entry["decision"], "time": entry.get("time")}
            for sid, (_, entry) in sorted(latest.items())
            if entry.get("decision") in DECISIONS
        }

    def decisions(self, name: str) -> dict[str, dict[str, Any]]:
        """sample_id -> {"decision", "time"} of the set (empty before the first decision)."""
        self.check_set(name)
        return self._merged(name)

    def decide(self, name: str, updates: dict[str, str | None]) -> dict[str, Any]:
        """Record ``{sample_id: decision}`` (None clears one); returns :meth:`progress`.

        Every id must belong to the set and every decision be one of :data:`DECISIONS`;
        nothing is written when one is wrong.
        """
        if not isinstance(updates, dict) or not updates:
            raise ReviewError("decisions must be a non-empty object {sample_id: decision}")
        ids = set(self.table(name)["sample_id"])
        bad_ids = [k for k in updates if k not in ids]
        if bad_ids:
            raise ReviewError(f"sample ids not in set {name!r}: {bad_ids[:5]}")
        bad = {k: v for k, v in updates.items() if v is not None and v not in DECISIONS}
        if bad:
            raise ReviewError(f"decisions must be one of {', '.join(DECISIONS)} (or null), got {bad}")
        with _LOCK:
            writer = writer_id()
            own = f"{self._writers_dir(name)}/{writer}.json"
            mine = self._read_decisions(own)
            now = _now()
            for sid, decision in updates.items():
                mine[sid] = {"decision": decision, "time": now}  # an undo stays, as null, to outrank older decisions
            doc = {"set": name, "writer": writer, "decisions": dict(sorted(mine.items()))}
            self.store.write_text(own, strict_dumps(doc, indent=1))
            # The merged view and the derived files: written from what every writer has stored,
            # and again while it keeps changing (another writer decided meanwhile).
            for _ in range(_REFRESHES):
                current = self._merged(name)
                self.store.write_text(self._path(name), strict_dumps({"set": name, "decisions": current}, indent=1))
                self._derived(name, current)
                if self._merged(name) == current:
                    break
        return self.progress(name)

    def _derived(self, name: str, decisions: dict[str, dict[str, Any]]) -> None:
        self.store.write_bytes(f"{REVIEW_DIR}/{name}_final.parquet", _parquet_bytes(self.final_set(name, decisions)))
        labels = self.labels(name, decisions)
        self.store.write_bytes(f"{REVIEW_DIR}/{name}_labels.parquet", _parquet_bytes(labels))

    # ------------------------------------------------------------------ results
    def final_set(self, name: str, decisions: dict[str, dict[str, Any]] | None = None) -> pd.DataFrame:
        """Mined ∩ accepted: the set's rows whose decision is ``accept``, in the set's order."""
        decisions = self.decisions(name) if decisions is None else decisions
        table = self.table(name)
        accepted = {k for k, v in decisions.items() if v.get("decision") == "accept"}
        return table[table["sample_id"].isin(accepted)].reset_index(drop=True)

    def labels(self, name: str, decisions: dict[str, dict[str, Any]] | None = None) -> pd.DataFrame:
        """Detector scores and ``ooc`` of the decided images (accept: False, not_class: True)."""
        from pipeline.io.tables import load_samples

        decisions = self.decisions(name) if decisions is None else decisions
        ooc = {k: v["decision"] == "not_class" for k, v in decisions.items() if v.get("decision") in ("accept", "not_class")}
        cols = ["sample_id", *SCORE_COLUMNS, "ooc"]
        if not ooc:
            return pd.DataFrame({c: pd.Series(dtype=bool if c == "ooc" else float if c in SCORE_COLUMNS else object) for c in cols})
        samples = load_samples(self.store)
        rows = samples[samples["sample_id"].isin(ooc)][["sample_id", *SCORE_COLUMNS]].copy()
        rows["ooc"] = rows["sample_id"].map(ooc).astype(bool)
        return rows.sort_values("sample_id").reset_index(drop=True)[cols]

    def progress(self, name: str) -> dict[str, Any]:
        table = self.table(name)
        decisions = self.decisions(name)
        ids = set(table["sample_id"])
        counts = {d: sum(1 for k, v in decisions.items() if k in ids and v.get("decision") == d) for d in DECISIONS}
        decided = sum(counts.values())
        return {"set": name, "total": len(ids), "decided": decided, "remaining": len(ids) - decided, **counts}

    def items(self, name: str) -> list[dict[str, Any]]:
        """The set's images with their coordinates and current decision (for the review page)."""
        table = self.table(name)
        decisions = self.decisions(name)
        keep = [c for c in ("sample_id", "class_id", "class_name", "shift", "kind", "seed", "n_wrong") if c in table.columns]
        out = []
        for row in table[keep].to_dict(orient="records"):
            row = {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            row["decision"] = decisions.get(row["sample_id"], {}).get("decision")
            out.append(row)
        return out
