"""Human review of a mined image set (ImageNet-D's quality control).

A *set* is a Parquet table of sample ids in ``report/`` of a build output
(``report/hard_set.parquet``, written by the ``hard_mining`` analysis).  A reviewer gives
each image one decision:

``accept``     the image shows its class (and is usable)
``reject``     unusable (artefacts, ambiguous, several objects) -- no statement about the class
``not_class``  the image does not show its class (out of class)

Decisions are stored next to the output in ``review/<set>.json``
(``{"set", "decisions": {sample_id: {"decision", "time"}}}``), rewritten atomically on
every change (temporary file, then rename; a single PUT on object stores), so a review
can stop at any time and resume where it stopped.  After each change two derived files
are refreshed:

* ``review/<set>_final.parquet``: the final set = mined ∩ accepted (the set's rows whose
  decision is ``accept``), in the set's order;
* ``review/<set>_labels.parquet``: the four OOC detector scores of every decided image and
  ``ooc`` (True for ``not_class``, False for ``accept``; ``reject`` says nothing about the
  class and is left out): the input of ``cnsbench calibrate-filter``.
"""

from __future__ import annotations

import io
import json
import re
import threading
import time
from typing import Any

import pandas as pd

from pipeline.io.store import OutputStore
from pipeline.plan.schema import SCORE_COLUMNS

DECISIONS = ("accept", "reject", "not_class")
SET_NAME = re.compile(r"[a-z0-9][a-z0-9_]{0,63}")  # matched whole (fullmatch)
REVIEW_DIR = "review"
_LOCK = threading.Lock()  # one writer per process; the file itself is replaced atomically


class ReviewError(ValueError):
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

    def decisions(self, name: str) -> dict[str, dict[str, Any]]:
        """sample_id -> {"decision", "time"} of the set (empty before the first decision)."""
        self.check_set(name)
        if not self.store.exists(self._path(name)):
            return {}
        data = json.loads(self.store.read_text(self._path(name)))
        return dict(data.get("decisions", {}))

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
            current = self.decisions(name)
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            for sid, decision in updates.items():
                if decision is None:
                    current.pop(sid, None)
                else:
                    current[sid] = {"decision": decision, "time": now}
            doc = {"set": name, "decisions": dict(sorted(current.items()))}
            self.store.write_text(self._path(name), json.dumps(doc, indent=1))
            self._derived(name, current)
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
