"""Stratified estimates of an adaptive build's headline numbers (docs/adaptive.md).

Pure functions of arrays.  The strata are the (class, shift) pairs of the build; the
uniform design gives every stratum the same number of seeds, so its pooled numbers are ratio
estimates with equal stratum weights: per cell (a classifier, a shift, a scale), with ``y`` a
trajectory's value and ``x`` whether it counts (the trajectory is evaluated; for the mean
failure point, it failed),

    R = Σ_h W_h ȳ_h / Σ_h W_h x̄_h,      W_h = 1 / (strata of the cell),

which is exactly the uniform build's pooled number when every stratum has the same seeds,
and a consistent estimate of it when they differ.  Its standard error is the stratified
linearised one, with the finite-population correction of a stratum's ``N`` seeds (the
uniform build over the same seeds is the population):

    Var(R) = Σ_h W_h² (1 - n_h/N) s²_h / n_h / X̄²,   s²_h the variance of y - R x in h.

Few seeds can show no variance where there is some (a pilot of 2 that were both right), so
``s²_h`` is at least ``r² x̄_h / (4 (n_h + 1))`` (``r``: the value's range), the variance of a
half-right pseudo-observation added to the stratum.  Intervals are ``R ± z SE``.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np


def z_of(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2.0)


@dataclass
class Ratio:
    """Per cell: ``estimate``, ``half`` (the interval's half-width) and per (stratum, cell) the
    ``load`` W_h² s²_h / X̄² (its variance is Σ_h load (1 - n_h/N) / n_h)."""

    estimate: np.ndarray  # [K]
    half: np.ndarray  # [K]
    load: np.ndarray  # [H, K]


def stratified_ratio(y: np.ndarray, x: np.ndarray, stratum: np.ndarray, weight: np.ndarray, n_pop: int,
                     z: float, value_range: float = 1.0, unseen: bool = False) -> Ratio:
    """Ratio estimates of ``K`` cells from ``T`` trajectories: ``y``, ``x`` [T, K]; ``stratum``
    [T] indexes the ``H`` rows of ``weight`` [H, K] (each column: the cell's stratum weights,
    summing to 1).  A cell with a weighted stratum that has no trajectory is NaN.

    ``unseen``: a prospect, not an estimate: every stratum's ``x̄_h`` is at least that of half
    a counted trajectory among ``n_h + 1`` (the variance floor's pseudo-observation), so a cell
    that counts nothing yet (a mean failure point where nothing failed) has the variance it
    would have with that half failure in each stratum."""
    n_h = weight.shape[0]
    y, x = np.asarray(y, dtype=float), np.asarray(x, dtype=float)
    onehot = (np.asarray(stratum)[None, :] == np.arange(n_h)[:, None]).astype(float)  # [H, T]
    n = onehot.sum(axis=1)  # [H]
    safe = np.where(n > 0, n, 1.0)[:, None]
    ybar, xbar = (onehot @ y) / safe, (onehot @ x) / safe  # [H, K]
    if unseen:
        xbar = np.maximum(xbar, (n[:, None] > 0) / (2.0 * (n[:, None] + 1.0)))
    missing = ((weight > 0) & (n[:, None] == 0)).any(axis=0)
    big_y, big_x = (weight * ybar).sum(axis=0), (weight * xbar).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        est = np.where((big_x > 0) & ~missing, big_y / np.where(big_x > 0, big_x, 1.0), np.nan)
    d = y - np.nan_to_num(est)[None, :] * x  # [T, K]
    dbar = (onehot @ d) / safe
    ss = onehot @ (d * d) - n[:, None] * dbar * dbar
    s2 = np.where(n[:, None] > 1, ss / np.where(n > 1, n - 1, 1.0)[:, None], 0.0)
    s2 = np.maximum(s2, value_range ** 2 * xbar / (4.0 * (n[:, None] + 1.0)))
    with np.errstate(invalid="ignore", divide="ignore"):
        load = np.where(weight > 0, weight ** 2 * s2 / np.where(big_x > 0, big_x, np.nan) ** 2, 0.0)
    fpc = np.clip(1.0 - n / float(n_pop), 0.0, 1.0) / safe[:, 0]  # (1 - n/N) / n per stratum
    var = (load * fpc[:, None]).sum(axis=0)
    half = np.where(np.isnan(est), np.nan, z * np.sqrt(np.maximum(var, 0.0)))
    return Ratio(est, half, np.nan_to_num(load))


@dataclass
class Cells:
    """The headline numbers of one family group, each with its interval (docs/adaptive.md):
    ``accuracy`` and ``drop`` [C, shifts, S]; ``fp_mean`` [C, shifts] (mean failure point over
    the failed trajectories of a shift); ``fp_all`` and ``margin`` [C] (over every shift);
    ``fp_ratio`` [C, shifts, S] and ``fp_ratio_all`` [C, S] (the share of evaluated trajectories
    whose failure point is the scale, per shift and over every shift)."""

    accuracy: Ratio
    drop: Ratio
    fp_mean: Ratio
    fp_all: Ratio
    margin: Ratio
    fp_ratio: Ratio
    fp_ratio_all: Ratio
    fp_unseen: Ratio  # fp_mean's prospect (stratified_ratio's ``unseen``): what assess uses where fp_mean has none
    shape: tuple[int, int, int]  # classifiers, shifts, scales


def cells(correct: np.ndarray, evaluated: np.ndarray, stratum: np.ndarray, shift_of_stratum: np.ndarray,
          n_shifts: int, scales: list[float], n_pop: int, level: float, margin_max_scale: float) -> Cells:
    """Every headline number from ``correct`` [T, C, S] and ``evaluated`` [T, C] of the committed
    trajectories (``stratum`` [T]; ``shift_of_stratum`` [H] indexes the shifts)."""
    t, c, s = correct.shape
    h = len(shift_of_stratum)
    z = z_of(level)
    member = (np.asarray(shift_of_stratum)[:, None] == np.arange(n_shifts)[None, :]).astype(float)  # [H, shifts]
    w_shift = member / np.maximum(member.sum(axis=0, keepdims=True), 1.0)  # [H, shifts]
    ev = evaluated.astype(float)
    ok = correct * ev[:, :, None]

    def per_shift(values: np.ndarray, counts: np.ndarray, rng: float, unseen: bool = False) -> Ratio:
        # values [T, C, S'] -> cells (C, shift, S'): each shift's column block of weights.
        k = values.shape[2]
        y = np.repeat(values[:, :, None, :], n_shifts, axis=2).reshape(t, -1)
        x = np.repeat(np.repeat(counts[:, :, None, None], n_shifts, axis=2), k, axis=3).reshape(t, -1)
        w = np.broadcast_to(w_shift[:, None, :, None], (h, c, n_shifts, k)).reshape(h, -1)
        return stratified_ratio(y, x, stratum, w, n_pop, z, rng, unseen)

    accuracy = per_shift(ok, ev, 1.0)
    drop = per_shift((correct[:, :, :1] - correct) * ev[:, :, None], ev, 1.0)
    wrong = (correct == 0) & evaluated[:, :, None]
    failed = wrong.any(axis=2)
    fp_value = np.where(failed, np.asarray(scales, dtype=float)[np.argmax(wrong, axis=2)], 0.0)  # [T, C]
    top = float(max(scales)) if scales else 1.0
    fp_mean = per_shift(fp_value[:, :, None], failed.astype(float), top)
    ours = member.any(axis=1)  # the strata of this group's shifts
    w_all = np.repeat((ours / max(ours.sum(), 1))[:, None], c, axis=1)
    fp_all = stratified_ratio(fp_value, failed.astype(float), stratum, w_all, n_pop, z, top)
    censored = np.where(failed, fp_value, margin_max_scale)
    margin = stratified_ratio((margin_max_scale - censored) * ev, ev, stratum, w_all, n_pop, z, margin_max_scale)
    at_scale = (failed[:, :, None] & (np.argmax(wrong, axis=2)[:, :, None] == np.arange(s)[None, None, :])).astype(float)
    fp_ratio = per_shift(at_scale, ev, 1.0)
    fp_ratio_all = stratified_ratio(at_scale.reshape(t, -1), np.repeat(ev, s, axis=1), stratum,
                                    np.repeat(w_all, s, axis=1), n_pop, z, 1.0)
    fp_unseen = per_shift(fp_value[:, :, None], (failed & evaluated).astype(float), top, unseen=True)
    return Cells(accuracy, drop, fp_mean, fp_all, margin, fp_ratio, fp_ratio_all, fp_unseen, (c, n_shifts, s))


def _targeted(found: Cells, target: float, fp_target: float) -> list[tuple[Ratio, float, np.ndarray]]:
    """(Ratio, goal, the cells with a target) of each kind of headline number.  A mean failure
    point with no failure yet is not known to be within its target: its prospect
    (``Cells.fp_unseen``) stands in until a failure is seen, or its strata's seeds show it rare."""
    _, _, s = found.shape
    drop_cells = np.ones(found.drop.half.shape, dtype=bool).reshape(-1, s)
    drop_cells[:, 0] = False  # the drop at scale 0 is 0 by construction
    none = np.isnan(found.fp_mean.half)
    fp = Ratio(found.fp_mean.estimate, np.where(none, found.fp_unseen.half, found.fp_mean.half),
               np.where(none[None, :], found.fp_unseen.load, found.fp_mean.load))
    every = np.ones(found.accuracy.half.shape, dtype=bool)
    return [(found.accuracy, target, every), (found.drop, target, drop_cells.ravel()),
            (fp, fp_target, np.ones(fp.half.shape, dtype=bool))]


def projected_met(found: Cells, target: float, fp_target: float, n: np.ndarray, n_pop: int, level: float) -> bool:
    """Whether every cell with an estimate would be within its target with ``n`` seeds per
    stratum, its per-stratum variances as estimated now (each cell's ``load``)."""
    n = np.asarray(n, dtype=float)
    fpc = np.clip(1.0 - n / float(n_pop), 0.0, 1.0) / np.maximum(n, 1.0)
    z = z_of(level)
    for ratio, goal, mask in _targeted(found, target, fp_target):
        half = z * np.sqrt(np.maximum(fpc @ ratio.load, 0.0))
        if (mask & np.isfinite(ratio.half) & (half > goal)).any():
            return False
    return True


def assess(found: Cells, target: float, fp_target: float) -> tuple[np.ndarray, bool]:
    """(per-stratum load over the cells whose intervals are wider than their targets, each cell's
    load divided by its target squared; whether every cell is within its target).  A cell
    without trajectories has no interval to shrink."""
    load = np.zeros(found.accuracy.load.shape[0])
    met = True
    for ratio, goal, mask in _targeted(found, target, fp_target):
        wide = mask & (ratio.half > goal)  # NaN (no evaluated trajectory) is not
        if wide.any():
            met = False
            load += ratio.load[:, wide].sum(axis=1) / goal ** 2
    return load, met
