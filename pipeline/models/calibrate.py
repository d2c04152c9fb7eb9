"""Filter calibration: choose the four OOC detector thresholds from human-labelled scores.

Role: ``cnsbench calibrate-filter LABELS --output thresholds.yaml``.  LABELS is a Parquet
or CSV table with the four detector score columns of the samples table
(:data:`pipeline.plan.schema.SCORE_COLUMNS`: ``clip_text, clip_shift_text, clip_image,
dino_image``) and a boolean ``ooc`` column (True: a human judged the image out of class).

The rule is the filter's (:func:`pipeline.models.detectors.keep_decision`): a detector
passes when its score is strictly above its threshold (NaN never passes) and an image is
*removed* when fewer than ``min_pass`` detectors pass.  With OOC as the positive class,
TPR = share of OOC images removed, FPR = share of in-class images removed, accuracy =
(OOC removed + in-class kept) / all.  CNS-Bench chose its thresholds so that 90% of the
labelled OOC images are removed; :func:`calibrate` therefore solves

    minimise FPR  subject to  TPR >= target          (ties: higher TPR)

where "TPR >= target" is checked on counts (removed OOC >= ceil(target * n_OOC)), so the
chosen rule reaches the target exactly, never by rounding.

Search (deterministic, documented in :func:`calibrate`): each detector's candidate
thresholds are the midpoints between its consecutive distinct scores (thinned to at most
``max_candidates`` quantiles), plus one below all scores (always passes) and its maximum
(never passes).  A coarse exhaustive grid over all four detectors supplies the starting
points of a block coordinate descent on the full candidate lists; each step is exact over
one *pair* of detectors (every candidate combination of the two evaluated, the other two
fixed), and a final step moves each threshold to the middle of the candidate range that
removes the same images (a maximum-margin choice that does not change the result on the
labels).  It is a local search: on synthetic label sets it matched, or came within one
image of, the exhaustive optimum over the same candidate grid.

The baseline printed next to it is the single-detector CLIP rule: remove when
``clip_text`` is at or below the smallest threshold that reaches the target TPR.  The
output YAML is a partial config (``filter: {thresholds: ..., min_pass: k}``) that
``cnsbench build CONFIG --filter-thresholds thresholds.yaml`` (and ``evaluate``) merges
over the config; :func:`threshold_overrides` reads and checks it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import yaml

from pipeline.errors import CnsbenchError
from pipeline.plan.schema import SCORE_COLUMNS

LABEL_COLUMN = "ooc"
DEFAULT_TARGET_TPR = 0.90
DEFAULT_MIN_PASS = 2
DEFAULT_MAX_CANDIDATES = 256
_GRID = 6  # coarse start grid per detector: 6**4 = 1296 rules evaluated exhaustively
_STARTS = 5  # best coarse rules refined by coordinate descent
_MAX_ROUNDS = 100


class CalibrationError(CnsbenchError):
    """Unusable labels or settings; the message names the file, column and problem."""


# --------------------------------------------------------------------------- input
def _parse_bool(values: pd.Series, source: str) -> np.ndarray:
    """bool, 0/1 or the strings true/false/yes/no/1/0 (any case); anything else is an error."""
    if values.isna().any():
        row = int(np.flatnonzero(values.isna().to_numpy())[0])
        raise CalibrationError(f"{source}: column {LABEL_COLUMN!r} is empty in row {row}")
    if values.dtype == bool:
        return values.to_numpy(dtype=bool)
    mapping = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
    out = np.zeros(len(values), dtype=bool)
    for i, v in enumerate(values.tolist()):
        if isinstance(v, (bool, np.bool_)):
            out[i] = bool(v)
        elif isinstance(v, (int, np.integer, float, np.floating)) and float(v) in (0.0, 1.0):
            out[i] = bool(v)
        elif isinstance(v, str) and v.strip().lower() in mapping:
            out[i] = mapping[v.strip().lower()]
        else:
            raise CalibrationError(f"{source}: column {LABEL_COLUMN!r} must be boolean; row {i} has {v!r}")
    return out


def read_labels(path: str) -> tuple[np.ndarray, np.ndarray]:
    """``(scores [n, 4] float in SCORE_COLUMNS order, ooc [n] bool)`` from a Parquet or CSV file."""
    if not os.path.isfile(path):
        raise CalibrationError(f"labels file not found: {path}")
    ext = os.path.splitext(path)[1].lower()
    try:
        if ext in (".parquet", ".pq"):
            df = pd.read_parquet(path)
        elif ext == ".csv":
            df = pd.read_csv(path)
        else:
            raise CalibrationError(f"{path}: labels must be a .parquet or .csv file")
    except CalibrationError:
        raise
    except Exception as err:  # pyarrow / the CSV parser: report which file, not a traceback
        raise CalibrationError(f"{path}: cannot read it as {ext[1:]}: {err}") from None
    missing = [c for c in (*SCORE_COLUMNS, LABEL_COLUMN) if c not in df.columns]
    if missing:
        raise CalibrationError(f"{path}: missing column(s) {missing}; has {list(df.columns)}")
    if df.empty:
        raise CalibrationError(f"{path}: no rows")
    scores = np.empty((len(df), len(SCORE_COLUMNS)), dtype=float)
    for j, col in enumerate(SCORE_COLUMNS):
        numeric = pd.to_numeric(df[col], errors="coerce")
        bad = numeric.isna() & df[col].notna()
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise CalibrationError(f"{path}: column {col!r} must be numeric; row {row} has {df[col].iloc[row]!r}")
        scores[:, j] = numeric.to_numpy(dtype=float)
    if np.isinf(scores).any():
        i, j = np.argwhere(np.isinf(scores))[0]
        raise CalibrationError(f"{path}: column {SCORE_COLUMNS[j]!r} has an infinite score in row {i}")
    if np.isnan(scores).all(axis=0).any():
        col = SCORE_COLUMNS[int(np.flatnonzero(np.isnan(scores).all(axis=0))[0])]
        raise CalibrationError(f"{path}: column {col!r} has no scores (all empty)")
    ooc = _parse_bool(df[LABEL_COLUMN], path)
    if ooc.all() or not ooc.any():
        which = "in-class (ooc false)" if ooc.all() else "OOC (ooc true)"
        raise CalibrationError(f"{path}: needs both OOC and in-class examples; there are no {which} rows")
    return scores, ooc


# --------------------------------------------------------------------------- rules
@dataclass(frozen=True)
class RuleStats:
    """Confusion counts of a removal rule with OOC as the positive class."""

    n_ooc: int
    n_in: int
    removed_ooc: int
    removed_in: int

    @property
    def tpr(self) -> float:
        return self.removed_ooc / self.n_ooc

    @property
    def fpr(self) -> float:
        return self.removed_in / self.n_in

    @property
    def accuracy(self) -> float:
        return (self.removed_ooc + self.n_in - self.removed_in) / (self.n_ooc + self.n_in)

    def line(self) -> str:
        return f"TPR {self.tpr:.4f}  FPR {self.fpr:.4f}  accuracy {self.accuracy:.4f}"


def removed(scores: np.ndarray, thresholds: np.ndarray, min_pass: int) -> np.ndarray:
    """Per image: fewer than ``min_pass`` detectors strictly above their threshold (NaN never passes)."""
    with np.errstate(invalid="ignore"):
        passes = scores > np.asarray(thresholds, dtype=float)[None, :]
    return passes.sum(axis=1) < min_pass


def rule_stats(is_removed: np.ndarray, ooc: np.ndarray) -> RuleStats:
    return RuleStats(
        n_ooc=int(ooc.sum()),
        n_in=int((~ooc).sum()),
        removed_ooc=int((is_removed & ooc).sum()),
        removed_in=int((is_removed & ~ooc).sum()),
    )


def required_removals(target_tpr: float, n_ooc: int) -> int:
    """Smallest OOC removal count whose TPR is >= target (tolerant of float noise in the target)."""
    return min(n_ooc, math.ceil(target_tpr * n_ooc - 1e-9))


def candidate_thresholds(values: np.ndarray, max_candidates: int = DEFAULT_MAX_CANDIDATES) -> np.ndarray:
    """Ascending thresholds worth trying for one detector.

    One below every score (all pass), the midpoints between consecutive distinct scores
    (thinned to about ``max_candidates`` quantiles of the distinct values), and the
    maximum score (none pass, the comparison being strict).
    """
    v = np.unique(values[np.isfinite(values)])
    if v.size == 0:
        return np.array([0.0])  # a detector without scores never passes, whatever the threshold
    if v.size > max_candidates:
        v = np.unique(np.quantile(v, np.linspace(0.0, 1.0, max_candidates), method="lower"))
    below = v[0] - max(1.0, abs(v[0]))
    return np.concatenate([[below], (v[:-1] + v[1:]) / 2.0, [v[-1]]])


@dataclass
class Calibration:
    """Result of :func:`calibrate`: the rule, its stats and the baselines on the same labels."""

    thresholds: dict[str, float]
    min_pass: int
    target_tpr: float
    stats: RuleStats
    baseline_threshold: float
    baseline: RuleStats
    reference: RuleStats  # the published CNS-Bench thresholds with the same min_pass

    def table(self) -> str:
        t = ", ".join(f"{k} > {v:.6g}" for k, v in self.thresholds.items())
        return "\n".join(
            [
                f"labels: {self.stats.n_ooc} OOC, {self.stats.n_in} in-class; target TPR {self.target_tpr:g}",
                f"calibrated ({self.min_pass} of 4 pass):  {self.stats.line()}   [{t}]",
                f"clip_text only baseline:     {self.baseline.line()}   [clip_text > {self.baseline_threshold:.6g}]",
                f"published thresholds:        {self.reference.line()}",
            ]
        )


def _key(tp: np.ndarray, fp: np.ndarray, need: int) -> np.ndarray:
    """Sort keys (lower is better) of rules with removal counts ``tp`` (OOC) and ``fp`` (in-class).

    Infeasible rules rank after every feasible one, by their shortfall; feasible rules by
    fewest in-class removals, then most OOC removals.  Encoded in one int64 per rule.
    """
    tp = np.asarray(tp, dtype=np.int64)
    fp = np.asarray(fp, dtype=np.int64)
    feasible = tp >= need
    return np.where(feasible, (fp << 32) - tp, (np.int64(1) << 60) + (need - tp))


class _Search:
    """Block coordinate descent over per-detector candidate lists (see :func:`calibrate`).

    Rules are ranked by ``(primary, -separation)``: ``primary`` is :func:`_key` (feasible
    first, then fewest in-class removals, then most OOC removals); ties are broken by the
    *separation* sum over detectors of (in-class images passing it - OOC images passing
    it).  Among rules that remove the same numbers of images this prefers thresholds that
    separate the groups on each detector individually (in the gap between them, where
    there is one) instead of a lucky combination of uninformative detectors.
    """

    def __init__(self, scores: np.ndarray, ooc: np.ndarray, min_pass: int, need: int, max_candidates: int) -> None:
        self.scores, self.ooc, self.k, self.need = scores, ooc, min_pass, need
        self.cands = [candidate_thresholds(scores[:, j], max_candidates) for j in range(scores.shape[1])]
        self.sep = []  # per detector, per candidate: in-class passing - OOC passing
        for j, c in enumerate(self.cands):
            s = scores[:, j]
            counts = []
            for group in (~ooc, ooc):
                vals = np.sort(s[group & ~np.isnan(s)])
                counts.append(len(vals) - np.searchsorted(vals, c, side="right"))
            self.sep.append((counts[0] - counts[1]).astype(np.int64))

    def passes(self, idx: list[int]) -> np.ndarray:
        t = np.array([self.cands[j][i] for j, i in enumerate(idx)])
        with np.errstate(invalid="ignore"):
            return self.scores > t[None, :]

    def rank(self, idx: list[int]) -> tuple[int, int]:
        r = self.passes(idx).sum(axis=1) < self.k
        primary = _key(np.array([(r & self.ooc).sum()]), np.array([(r & ~self.ooc).sum()]), self.need)[0]
        return int(primary), -int(sum(self.sep[j][i] for j, i in enumerate(idx)))

    def _sweep(self, others: np.ndarray, j: int) -> tuple[np.ndarray, np.ndarray]:
        """(tp, fp) for every candidate of detector ``j`` given the other detectors' pass counts."""
        always = others < self.k - 1  # removed whatever detector j says
        pivotal = others == self.k - 1  # removed exactly when detector j does not pass
        s = self.scores[:, j]
        counts = []
        for group in (self.ooc, ~self.ooc):
            piv = pivotal & group
            nan = int((piv & np.isnan(s)).sum())
            vals = np.sort(s[piv & ~np.isnan(s)])
            # removed iff score <= t (not strictly above the threshold)
            counts.append(int((always & group).sum()) + nan + np.searchsorted(vals, self.cands[j], side="right"))
        return counts[0], counts[1]

    def coordinate(self, idx: list[int], j: int) -> tuple[np.ndarray, np.ndarray]:
        """(tp, fp) for every candidate of detector ``j``, the others fixed at ``idx``."""
        p = self.passes(idx)
        return self._sweep(p.sum(axis=1) - p[:, j], j)

    def pair(self, idx: list[int], j: int, k: int) -> tuple[tuple[int, int], int, int]:
        """Best (rank, candidate of j, candidate of k) over all pairs, the other detectors fixed."""
        p = self.passes(idx)
        rest = p.sum(axis=1) - p[:, j] - p[:, k]
        sep_rest = sum(int(self.sep[m][i]) for m, i in enumerate(idx) if m not in (j, k))
        s = self.scores[:, j]
        best: tuple[tuple[int, int], int, int] | None = None
        with np.errstate(invalid="ignore"):
            for a, t in enumerate(self.cands[j]):
                tp, fp = self._sweep(rest + (s > t), k)
                keys = _key(tp, fp, self.need)
                neg_sep = -(sep_rest + int(self.sep[j][a]) + self.sep[k])
                b = int(np.lexsort((neg_sep, keys))[0])  # lexsort is stable: lowest b among equals
                rank = (int(keys[b]), int(neg_sep[b]))
                if best is None or rank < best[0]:
                    best = (rank, a, b)
        assert best is not None
        return best

    def descend(self, idx: list[int]) -> list[int]:
        """Block coordinate descent: each step is exact over one pair of detectors."""
        idx = list(idx)
        current = self.rank(idx)
        pairs = [(j, k) for j in range(len(idx)) for k in range(j + 1, len(idx))]
        for _ in range(_MAX_ROUNDS):
            improved = False
            for j, k in pairs:
                rank, a, b = self.pair(idx, j, k)
                if rank < current:
                    idx[j], idx[k], current, improved = a, b, rank, True
            if not improved:
                break
        return idx

    def centre(self, idx: list[int]) -> list[int]:
        """Move each threshold to the middle of the candidates with the same removals and separation."""
        idx = list(idx)
        for j in range(len(idx)):
            tp, fp = self.coordinate(idx, j)
            i = idx[j]
            same = np.flatnonzero((tp == tp[i]) & (fp == fp[i]) & (self.sep[j] == self.sep[j][i]))
            # tp, fp and the pass counts are monotone in the threshold, so `same` is one
            # contiguous run of candidates that remove and pass the same images.
            idx[j] = int(same[len(same) // 2])
        return idx

    def starts(self) -> list[list[int]]:
        """Best rules of a coarse exhaustive grid, plus 'every detector at its maximum'."""
        d = len(self.cands)
        grids = [np.unique(np.round(np.linspace(0, len(c) - 1, _GRID)).astype(int)) for c in self.cands]
        with np.errstate(invalid="ignore"):
            pass_g = [
                (self.scores[:, j][None, :] > self.cands[j][grids[j]][:, None]).astype(np.int8) for j in range(d)
            ]
        combos = np.array(np.meshgrid(*[np.arange(len(g)) for g in grids], indexing="ij")).reshape(d, -1).T
        keys = np.empty(len(combos), dtype=np.int64)
        for lo in range(0, len(combos), 256):
            chunk = combos[lo : lo + 256]
            n_pass = sum(pass_g[j][chunk[:, j]] for j in range(d))  # [chunk, n]
            r = n_pass < self.k
            keys[lo : lo + 256] = _key((r & self.ooc).sum(axis=1), (r & ~self.ooc).sum(axis=1), self.need)
        neg_sep = -sum(self.sep[j][grids[j][combos[:, j]]] for j in range(d))
        order = np.lexsort((neg_sep, keys))[:_STARTS]
        out = [[int(grids[j][combos[i, j]]) for j in range(d)] for i in order]
        out.append([len(c) - 1 for c in self.cands])  # removes everything: always feasible
        return out


def calibrate(
    scores: np.ndarray,
    ooc: np.ndarray,
    target_tpr: float = DEFAULT_TARGET_TPR,
    min_pass: int = DEFAULT_MIN_PASS,
    max_candidates: int = DEFAULT_MAX_CANDIDATES,
) -> Calibration:
    """Thresholds minimising FPR subject to TPR >= ``target_tpr`` (see the module docstring).

    Deterministic: the coarse grid (6 candidates per detector at evenly spaced positions
    of its candidate list, all 6**4 rules counted exactly) ranks starting points; the 5
    best and the remove-everything rule are refined by block coordinate descent (detector
    pairs in column order, each step the best candidate pair given the other two
    detectors, ties to the lowest candidates, until a full round improves nothing); the
    best result (ties: the earlier start) is centred within its equivalent candidate
    ranges.  Cost: about (candidates per detector)**2 * n per pair step, ~2 s for 2000
    labels with 256 candidates.
    """
    if not 0.0 < target_tpr <= 1.0:
        raise CalibrationError(f"--target-tpr must be in (0, 1], got {target_tpr}")
    if not 1 <= min_pass <= len(SCORE_COLUMNS):
        raise CalibrationError(f"--min-pass must be in 1..{len(SCORE_COLUMNS)}, got {min_pass}")
    if max_candidates < 2:
        raise CalibrationError(f"--max-candidates must be at least 2, got {max_candidates}")
    scores = np.asarray(scores, dtype=float)
    ooc = np.asarray(ooc, dtype=bool)
    if scores.ndim != 2 or scores.shape[1] != len(SCORE_COLUMNS) or len(scores) != len(ooc):
        raise CalibrationError(f"scores must be [n, {len(SCORE_COLUMNS)}] with one ooc label per row")
    n_ooc = int(ooc.sum())
    if n_ooc == 0 or n_ooc == len(ooc):
        raise CalibrationError("calibration needs both OOC and in-class examples")
    need = required_removals(target_tpr, n_ooc)

    search = _Search(scores, ooc, min_pass, need, max_candidates)
    best, best_key = None, None
    for start in search.starts():
        idx = search.descend(start)
        key = search.rank(idx)
        if best_key is None or key < best_key:
            best, best_key = idx, key
    assert best is not None
    best = search.centre(best)
    t = np.array([search.cands[j][i] for j, i in enumerate(best)])
    stats = rule_stats(removed(scores, t, min_pass), ooc)
    if stats.removed_ooc < need:  # cannot happen: removing everything is feasible for min_pass >= 1
        raise CalibrationError(f"no rule reaches TPR {target_tpr} with min_pass {min_pass}")

    base_t, base = clip_baseline(scores[:, 0], ooc, target_tpr)
    from pipeline.config import Thresholds

    ref = Thresholds()
    ref_t = np.array([getattr(ref, c) for c in SCORE_COLUMNS])
    return Calibration(
        thresholds={c: float(v) for c, v in zip(SCORE_COLUMNS, t)},
        min_pass=min_pass,
        target_tpr=target_tpr,
        stats=stats,
        baseline_threshold=base_t,
        baseline=base,
        reference=rule_stats(removed(scores, ref_t, min_pass), ooc),
    )


def clip_baseline(clip_text: np.ndarray, ooc: np.ndarray, target_tpr: float) -> tuple[float, RuleStats]:
    """Single CLIP threshold: remove when ``clip_text <= t`` (or NaN), smallest ``t`` reaching the target.

    Removal grows with ``t``, so the smallest threshold that reaches the target also
    removes the fewest in-class images of all single-``clip_text`` rules.
    """
    need = required_removals(target_tpr, int(ooc.sum()))
    cands = candidate_thresholds(clip_text, max_candidates=max(len(clip_text), 2))
    with np.errstate(invalid="ignore"):
        rem = ~(clip_text[None, :] > cands[:, None])  # [candidate, image]
    tp = (rem & ooc[None, :]).sum(axis=1)
    i = int(np.flatnonzero(tp >= need)[0])  # the last candidate removes everything
    return float(cands[i]), rule_stats(rem[i], ooc)


# --------------------------------------------------------------------------- yaml
def thresholds_yaml(cal: Calibration, labels: str) -> str:
    """The partial config (``filter.thresholds`` + ``filter.min_pass``) with a comment header."""
    header = [
        f"# cnsbench calibrate-filter {labels}",
        *(f"# {line}" for line in cal.table().splitlines()),
        "# Merge into a config: cnsbench build CONFIG --filter-thresholds THIS_FILE",
        "# (or copy the filter section into the config).",
    ]
    body = yaml.safe_dump(
        {"filter": {"thresholds": dict(cal.thresholds), "min_pass": cal.min_pass}}, sort_keys=False
    )
    return "\n".join(header) + "\n" + body


def threshold_overrides(path: str) -> dict[str, Any]:
    """Read a thresholds YAML written by ``calibrate-filter`` as config overrides.

    Only ``filter.thresholds`` (any of the four detector keys) and ``filter.min_pass`` are
    accepted, so the file cannot silently change anything else; the values are validated
    by the config itself when merged (:func:`pipeline.config.load_config` ``overrides``).
    """
    from pipeline.config import ConfigError

    if not os.path.isfile(path):
        raise ConfigError(f"--filter-thresholds: file not found: {path}")
    try:
        data = yaml.safe_load(open(path, encoding="utf-8").read())
    except yaml.YAMLError as err:
        raise ConfigError(f"--filter-thresholds: invalid YAML in {path}: {err}") from None
    if not isinstance(data, dict) or set(data) != {"filter"} or not isinstance(data["filter"], dict):
        raise ConfigError(f"--filter-thresholds: {path} must hold exactly one top-level key 'filter'")
    extra = set(data["filter"]) - {"thresholds", "min_pass"}
    if extra:
        raise ConfigError(f"--filter-thresholds: {path}: only filter.thresholds and filter.min_pass allowed, got {sorted(extra)}")
    thresholds = data["filter"].get("thresholds", {})
    if not isinstance(thresholds, dict) or set(thresholds) - set(SCORE_COLUMNS):
        raise ConfigError(
            f"--filter-thresholds: {path}: filter.thresholds takes the keys {list(SCORE_COLUMNS)}, got {thresholds!r}"
        )
    return data
