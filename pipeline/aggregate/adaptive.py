"""An adaptive build read back from its committed tables: its rounds and its weighted estimates.

The rounds are replayed (:func:`pipeline.plan.adaptive.schedule`) from what is committed, by
the build to choose its next round and by the report to state the design; the report's
headline numbers are the stratified estimates of :mod:`pipeline.aggregate.stratified`
(docs/adaptive.md).  Nothing here writes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from pipeline.aggregate import stratified
from pipeline.aggregate.metrics import Metrics, evaluated_rows
from pipeline.config import BuildConfig
from pipeline.plan import scale_tag, trajectory_id
from pipeline.plan.adaptive import Schedule, Stratum, schedule, strata_of

if TYPE_CHECKING:
    from pipeline.io.store import OutputStore

ESTIMATOR = ("stratified ratio estimator over (class, shift) strata, equal stratum weights (the uniform design's), "
             "linearised standard errors with the finite-population correction of benchmark.seeds, normal intervals")


@dataclass
class GroupArrays:
    """One family group's committed trajectories as arrays (:func:`stratified.cells`' inputs)."""

    group: Any
    trajectories: list[str]
    stratum: np.ndarray  # [T] index into the build's strata
    rank: np.ndarray  # [T] the seed's position in benchmark.seeds
    classifiers: list[str]
    correct: np.ndarray  # [T, C, S]
    evaluated: np.ndarray  # [T, C]
    shift_of_stratum: np.ndarray  # [H] index into group.shifts, -1 for another group's stratum


def group_arrays(cfg: BuildConfig, samples: pd.DataFrame, predictions: pd.DataFrame,
                 strata: list[Stratum]) -> list[GroupArrays]:
    index = {h: i for i, h in enumerate(strata)}
    rank_of = {s: i for i, s in enumerate(cfg.benchmark.seeds)}
    names = [c.name for c in cfg.classifiers]
    out = []
    for group in cfg.family_groups():
        scales = list(group.scales)
        mine = samples[samples["shift"].isin(group.shifts)]
        traj = mine.drop_duplicates("trajectory_id")
        ours = np.array([(int(c), str(s)) in index and int(seed) in rank_of
                         for c, s, seed in zip(traj["class_id"], traj["shift"], traj["seed"])], dtype=bool)
        traj = traj.loc[ours] if len(traj) else traj
        ids = traj["trajectory_id"].astype(str).tolist()
        preds = predictions[predictions["sample_id"].isin(mine["sample_id"])]
        rows = evaluated_rows(mine, preds, scales)
        present = set(rows["classifier"])
        classifiers = [n for n in names if n in present] + sorted(present - set(names))
        t_index, c_index = pd.Index(ids), pd.Index(classifiers)
        correct = np.zeros((len(ids), len(classifiers), len(scales)))
        evaluated = np.zeros((len(ids), len(classifiers)), dtype=bool)
        if len(rows):
            ti, ci = t_index.get_indexer(rows["trajectory_id"]), c_index.get_indexer(rows["classifier"])
            si = pd.Index([round(s * 1000) for s in scales]).get_indexer((rows["scale"] * 1000).round().astype("int64"))
            keep = (ti >= 0) & (ci >= 0)
            correct[ti[keep], ci[keep], si[keep]] = rows["correct"].to_numpy(dtype=float)[keep]
            evaluated[ti[keep], ci[keep]] = True
        shift_pos = {s: i for i, s in enumerate(group.shifts)}
        out.append(GroupArrays(
            group, ids,
            np.array([index[(int(c), str(s))] for c, s in zip(traj["class_id"], traj["shift"])], dtype=int),
            np.array([rank_of[int(s)] for s in traj["seed"]], dtype=int),
            classifiers, correct, evaluated,
            np.array([shift_pos.get(s, -1) for _, s in strata], dtype=int),
        ))
    return out


def group_cells(cfg: BuildConfig, ga: GroupArrays, keep: np.ndarray | None = None) -> stratified.Cells:
    """The headline numbers of one group over its committed trajectories (``keep``: a subset)."""
    sel = slice(None) if keep is None else keep
    margin = max(cfg.aggregate.margin_max_scale, max(ga.group.scales))
    return stratified.cells(ga.correct[sel], ga.evaluated[sel], ga.stratum[sel], ga.shift_of_stratum,
                            len(ga.group.shifts), list(ga.group.scales), len(cfg.benchmark.seeds),
                            cfg.sampling.level, margin)


def stratum_costs(cfg: BuildConfig, strata: list[Stratum]) -> tuple[list[int], list[float]]:
    """Per stratum: a trajectory's images, and its UNet evaluations (its family's ``unet_cost``
    per unit shared among the family's shifts; 1 for a family that runs no UNet)."""
    from pipeline.perf.estimate import unet_costs

    per_shift: dict[str, tuple[int, float]] = {}
    for group, cost in unet_costs(cfg):
        evals = float(cost.evals["evals"]) / len(group.shifts) if cost is not None and cost.evals else 1.0
        for s in group.shifts:
            per_shift[s] = (len(group.scales), max(evals, 1e-9))
    return [per_shift[s][0] for _, s in strata], [per_shift[s][1] for _, s in strata]


def steering_classifiers(store: "OutputStore", cfg: BuildConfig) -> list[str] | None:
    """The classifiers whose intervals steer the rounds: those the pilot was classified with
    as it was made (the base predictions file of every committed shard holding a pilot
    trajectory; a classifier added later has its own files), in the config's order.  So a
    classifier added later (``evaluate``, or a config that names one more) leaves the rounds
    already made as they were.  None while no pilot shard is committed."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    seeds = cfg.benchmark.seeds[: cfg.sampling.pilot]
    pilot = {trajectory_id(s, c, seed) for c, s in strata_of(cfg.benchmark.classes, cfg.all_shifts()) for seed in seeds}
    found: set[str] | None = None
    for manifest in store.manifests():
        base = f"predictions/{manifest.shard}.parquet"
        if base not in manifest.files or not pilot.intersection(manifest.trajectories):
            continue
        try:
            table = pq.read_table(io.BytesIO(store.read_bytes(base)), columns=["classifier"])
        except (pa.ArrowInvalid, OSError):  # a damaged shard: left out, as the tables leave it out
            continue
        names = set(table.column("classifier").to_pylist())
        found = names if found is None else found & names
    if found is None:
        return None
    order = [c.name for c in cfg.classifiers]
    return [n for n in order if n in found] + sorted(found - set(order))


def replay(cfg: BuildConfig, samples: pd.DataFrame, predictions: pd.DataFrame,
           attempted: set[str] | frozenset[str], steering: list[str] | None = None) -> Schedule:
    """The rounds of ``cfg``'s adaptive build given the committed tables and the trajectories
    ``attempted`` (committed, or failed): each round is assessed on its own trajectories only,
    so work committed beyond it (a round a kill interrupted) never changes the allocation.
    ``steering``: the classifiers whose intervals are assessed (:func:`steering_classifiers`;
    None: every classifier of ``predictions``)."""
    spec = cfg.sampling
    strata = strata_of(cfg.benchmark.classes, cfg.all_shifts())
    seeds = cfg.benchmark.seeds
    if steering is not None:
        predictions = predictions[predictions["classifier"].isin(steering)]
    arrays = group_arrays(cfg, samples, predictions, strata)
    images, cost = stratum_costs(cfg, strata)
    top = max(max(g.scales) for g in cfg.family_groups())

    def present(alloc: tuple[int, ...]) -> bool:
        return all(trajectory_id(s, c, seed) in attempted for (c, s), n in zip(strata, alloc) for seed in seeds[:n])

    def assess(alloc: tuple[int, ...]):
        load, met = np.zeros(len(strata)), True
        limit = np.asarray(alloc)
        cells = []
        for ga in arrays:
            found = group_cells(cfg, ga, ga.rank < limit[ga.stratum])
            part, ok = stratified.assess(found, spec.target, spec.fp_target(top))
            load, met = load + part, met and ok
            cells.append(found)

        def enough(n: tuple[int, ...]) -> bool:  # the round's end: every target projected met
            return all(stratified.projected_met(f, spec.target, spec.fp_target(top), np.asarray(n), len(seeds), spec.level)
                       for f in cells)

        return load.tolist(), met, enough

    return schedule(strata, len(seeds), spec.pilot, spec.round_size, spec.max_images, images, cost, present, assess)


def design_json(cfg: BuildConfig, sched: Schedule) -> dict[str, Any]:
    """What metrics.json says of the design: targets, cap, rounds, seeds per stratum, stop, estimator."""
    spec = cfg.sampling
    images, _ = stratum_costs(cfg, sched.strata)
    top = max(max(g.scales) for g in cfg.family_groups())
    rounds = [{"round": k, "trajectories": int(sum(a)), "images": int(sum(n * i for n, i in zip(a, images)))}
              for k, a in enumerate(sched.rounds)]
    uniform = len(cfg.benchmark.seeds) * sum(images)
    return {
        "design": "adaptive",
        "target": spec.target,
        "failure_point_target": spec.fp_target(top),
        "level": spec.level,
        "max_images": spec.max_images,
        "pilot": spec.pilot,
        "round_size": spec.round_size,
        "seeds_available": len(cfg.benchmark.seeds),
        "uniform_images": uniform,
        "rounds": rounds,
        "stop": sched.stop,
        "seeds_per_stratum": [{"class_id": c, "shift": s, "seeds": int(n)} for (c, s), n in zip(sched.strata, sched.current)],
        "estimator": ESTIMATOR,
        "headline": ["accuracy per (classifier, shift, scale)", "accuracy_drop per (classifier, shift, scale)",
                     "mean failure point per (classifier, shift)"],
    }


def _clip(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return np.clip(v, lo, hi)


def weighted_metrics(cfg: BuildConfig, ga: GroupArrays, metrics: Metrics) -> tuple[Metrics, pd.DataFrame]:
    """``metrics`` with the stratified estimates and their intervals in place of the pooled ones
    (accuracy table: ``accuracy``, ``accuracy_change``, ``accuracy_drop`` with ``*_ci_low/_ci_high``;
    summary: the shift means of the drops, ``accuracy_scale0``, ``fp_avg``, ``margin_fp_avg``), and
    the mean failure point per (classifier, shift) with its interval."""
    found = group_cells(cfg, ga)
    c, h, s = found.shape
    shifts, scales = list(ga.group.shifts), list(ga.group.scales)
    grid = pd.MultiIndex.from_product([ga.classifiers, shifts, scales], names=["classifier", "shift", "scale"]).to_frame(index=False)
    acc, half = found.accuracy.estimate, found.accuracy.half
    drop, dhalf = found.drop.estimate, found.drop.half
    grid["accuracy"], grid["accuracy_change"], grid["accuracy_drop"] = acc, -drop, drop
    grid["accuracy_ci_low"], grid["accuracy_ci_high"] = _clip(acc - half, 0, 1), _clip(acc + half, 0, 1)
    grid["accuracy_drop_ci_low"], grid["accuracy_drop_ci_high"] = _clip(drop - dhalf, -1, 1), _clip(drop + dhalf, -1, 1)
    grid["accuracy_half_width"], grid["accuracy_drop_half_width"] = half, dhalf
    table = metrics.accuracy.drop(columns=[k for k in grid.columns if k in metrics.accuracy.columns
                                           and k not in ("classifier", "shift", "scale")])
    accuracy = table.merge(grid, on=["classifier", "shift", "scale"], how="left")
    accuracy = accuracy[[k for k in metrics.accuracy.columns if k in accuracy.columns]
                        + [k for k in grid.columns if k not in metrics.accuracy.columns]]
    fp = pd.MultiIndex.from_product([ga.classifiers, shifts], names=["classifier", "shift"]).to_frame(index=False)
    fp["fp_mean"], fp["fp_mean_half_width"] = found.fp_mean.estimate, found.fp_mean.half
    fp["fp_mean_ci_low"], fp["fp_mean_ci_high"] = fp["fp_mean"] - fp["fp_mean_half_width"], fp["fp_mean"] + fp["fp_mean_half_width"]
    summary = metrics.summary.copy()
    if not summary.empty:
        # The mean over shifts of a (classifier, scale): the shifts' strata are disjoint, so
        # their estimates are independent and the variances add (each weighs 1/shifts²).
        def shift_mean(summary: pd.DataFrame, col: str, est: np.ndarray, half_k: np.ndarray, j: int, lo: float) -> None:
            mean = dict(zip(ga.classifiers, est.reshape(c, h, s)[:, :, j].mean(axis=1)))
            width = dict(zip(ga.classifiers, np.sqrt((half_k.reshape(c, h, s)[:, :, j] ** 2).sum(axis=1)) / h))
            summary[col] = summary["classifier"].map(mean)
            summary[f"{col}_ci_low"] = (summary[col] - summary["classifier"].map(width)).clip(lower=lo)
            summary[f"{col}_ci_high"] = (summary[col] + summary["classifier"].map(width)).clip(upper=1.0)

        for j, scale in enumerate(scales):
            shift_mean(summary, f"acc_drop_{scale_tag(scale)}", drop, dhalf, j, -1.0)
        if 0.0 in scales:
            shift_mean(summary, "accuracy_scale0", acc, half, scales.index(0.0), 0.0)
        for name, ratio in (("fp_avg", found.fp_all), ("margin_fp_avg", found.margin)):
            value = dict(zip(ga.classifiers, ratio.estimate))
            width = dict(zip(ga.classifiers, ratio.half))
            summary[name] = summary["classifier"].map(value)
            summary[f"{name}_ci_low"] = summary[name] - summary["classifier"].map(width)
            summary[f"{name}_ci_high"] = summary[name] + summary["classifier"].map(width)
    return dataclasses.replace(metrics, accuracy=accuracy, summary=summary,
                               failure_point_table=weighted_fp_table(found, ga, metrics.failure_point_table)), fp


def weighted_fp_table(found: stratified.Cells, ga: GroupArrays, table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (``failure_point_table``) with the stratified share of trajectories failing at
    each scale, per shift and over every shift, its cumulative sum and the share's interval."""
    from pipeline.aggregate.metrics import ALL_SHIFTS

    c, h, s = found.shape
    shifts, scales = list(ga.group.shifts), list(ga.group.scales)
    per = pd.MultiIndex.from_product([ga.classifiers, shifts, scales], names=["classifier", "shift", "scale"]).to_frame(index=False)
    per["fp_ratio"], per["fp_ratio_half_width"] = found.fp_ratio.estimate, found.fp_ratio.half
    every = pd.MultiIndex.from_product([ga.classifiers, [ALL_SHIFTS], scales], names=["classifier", "shift", "scale"]).to_frame(index=False)
    every["fp_ratio"], every["fp_ratio_half_width"] = found.fp_ratio_all.estimate, found.fp_ratio_all.half
    grid = pd.concat([per, every], ignore_index=True)
    grid["fp_ratio_cumulative"] = grid.groupby(["classifier", "shift"])["fp_ratio"].cumsum()
    grid["fp_ratio_ci_low"] = _clip(grid["fp_ratio"] - grid["fp_ratio_half_width"], 0, 1)
    grid["fp_ratio_ci_high"] = _clip(grid["fp_ratio"] + grid["fp_ratio_half_width"], 0, 1)
    keys = ["classifier", "shift", "scale"]
    base = table.drop(columns=[k for k in grid.columns if k in table.columns and k not in keys])
    out = base.merge(grid, on=keys, how="left")
    return out[[k for k in table.columns if k in out.columns] + [k for k in grid.columns if k not in table.columns]]


def weighted_group(cfg: BuildConfig, samples: pd.DataFrame, predictions: pd.DataFrame, metrics: Metrics,
                   kind: str) -> tuple[Metrics, pd.DataFrame]:
    """:func:`weighted_metrics` of the family group ``kind`` from the tables."""
    strata = strata_of(cfg.benchmark.classes, cfg.all_shifts())
    ga = next(a for a in group_arrays(cfg, samples, predictions, strata) if a.group.kind == kind)
    return weighted_metrics(cfg, ga, metrics)
