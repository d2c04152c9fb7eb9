"""``cnsbench refine``: failure points bisected below a build's grid, for one classifier or many at once.

For every trajectory the classifier gets right at scale 0 and first gets wrong at grid scale
``s_k``, the interval ``(s_{k-1}, s_k]`` is bisected for ``rounds`` rounds with images made
at the midpoints by the build's own generator, judged by its filter against the
trajectory's committed scale-0 image and classified by the classifier (docs/refine.md).

The refinement images are committed like a build's, into ``OUTPUT/refine/`` (its own
shards, content-named, manifest last), each known by (trajectory, scale); a point is made
once and every later classifier classifies it (the reclassify stage) instead of making it
again.  What a classifier's bisection has found is never kept anywhere but in those
shards: every run replays it from them (:func:`walk`), so a rerun gives the same answer
and a killed run resumes where its last committed shard left it.

Refinement adds to an output and changes nothing of it: the grid's shards, tables and
metrics stay as they are; ``refine/failure_points_refined.csv`` and the report's
``refined_failure_points`` section carry the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd

from pipeline.analyses.refined import REFINED_COLUMNS, REFINED_CSV, continuous_groups, read_refined
from pipeline.config import BuildConfig
from pipeline.config.refine import MAX_ROUNDS
from pipeline.errors import CnsbenchError
from pipeline.executors import Chain, StageSpec
from pipeline.output_run import BuildSummary, OutputRun, Running
from pipeline.stages.refine import REFINE_UNIT, point_key

REFINE_DIR = "refine"
POINTS_PER_SHARD = 64  # refinement points per committed shard


class RefineError(CnsbenchError):
    """What was asked cannot be refined (unknown classifier, no predictions, no generator, rounds)."""


# --------------------------------------------------------------------------- the bisection
def milli(scale: float) -> int:
    """A scale as the outputs know it: in thousandths (:func:`pipeline.plan.scale_tag`)."""
    return round(scale * 1000)


@dataclass
class Walk:
    """Where one trajectory's bisection stands: the interval ``(low, high]`` holding its failure
    point, the probes made (a round each), the probed scales the filter rejected, and the
    next probe (None when done)."""

    low: float
    high: float
    rounds: int = 0
    rejected: list[float] = field(default_factory=list)
    next: float | None = None
    probes: list[float] = field(default_factory=list)


def candidates(low: float, high: float) -> list[float]:
    """The probes of an interval in order of preference: its midpoint, then (after the filter
    rejected it) the midpoint of the lower half, then of the upper half."""
    width = high - low
    return [low + width / 2, low + width / 4, low + 3 * width / 4]


def walk(low: float, high: float, rounds: int, known: dict[int, bool | None]) -> Walk:
    """Replay a bisection of ``(low, high]`` through the probes already judged (``known``:
    scale in thousandths -> correct, or None where the filter rejected the image or there is
    no answer) for at most ``rounds`` probes.

    A probe the classifier gets right moves ``low`` up to it, one it gets wrong moves
    ``high`` down to it; a rejected probe narrows nothing and the next round probes the
    next candidate (:func:`candidates`) not yet rejected.  The walk stops after ``rounds``
    probes, when no candidate is left, or when the interval is one thousandth wide (the
    outputs' scale resolution)."""
    w = Walk(low, high)
    while w.rounds < rounds:
        ends = {milli(w.low), milli(w.high)}
        probe = next((c for c in candidates(w.low, w.high)
                      if milli(c) not in ends and milli(c) not in {milli(r) for r in w.rejected}), None)
        if probe is None:
            return w
        if milli(probe) not in known:
            w.next = probe
            return w
        w.rounds += 1
        w.probes.append(probe)
        correct = known[milli(probe)]
        if correct is None:
            w.rejected.append(probe)
        elif correct:
            w.low = probe
        else:
            w.high = probe
    return w


def grid_failures(cfg: BuildConfig, samples: pd.DataFrame, predictions: pd.DataFrame, classifier: str) -> pd.DataFrame:
    """The grid failure point of every evaluated trajectory of ``classifier``, per family group
    on its own scales (:func:`pipeline.aggregate.metrics.failure_points`), with the grid
    interval ``(low, high]`` a failing one is bisected in: columns ``trajectory_id, shift,
    class_id, seed, grid_fp, low, high``."""
    from pipeline.aggregate.metrics import failure_points

    preds = predictions[predictions["classifier"] == classifier]
    coords = samples.drop_duplicates("trajectory_id").set_index("trajectory_id")[["class_id", "seed"]]
    out = []
    for group in continuous_groups(cfg):
        mine = samples[samples["shift"].isin(group.shifts)]
        fps = failure_points(mine, preds, group.scales)
        scales = sorted(group.scales)
        for row in fps.itertuples(index=False):
            fp = float(row.failure_point)
            k = scales.index(fp) if fp == fp else -1
            out.append({
                "trajectory_id": row.trajectory_id, "shift": row.shift,
                "class_id": int(coords.at[row.trajectory_id, "class_id"]), "seed": int(coords.at[row.trajectory_id, "seed"]),
                "grid_fp": fp, "low": scales[k - 1] if k > 0 else float("nan"), "high": fp if k > 0 else float("nan"),
                "top": scales[-1],
            })
    return pd.DataFrame(out, columns=["trajectory_id", "shift", "class_id", "seed", "grid_fp", "low", "high", "top"])


def judged_points(samples: pd.DataFrame, predictions: pd.DataFrame, classifier: str) -> dict[str, dict[int, bool | None]]:
    """Per trajectory, its refinement points judged for ``classifier``: scale in thousandths ->
    correct, None where the filter rejected the image (or the classifier gave no answer).
    A point without a prediction of the classifier is left out (it is still to be classified)."""
    from pipeline import plan

    preds = predictions[predictions["classifier"] == classifier].set_index("sample_id")["correct"]
    out: dict[str, dict[int, bool | None]] = {}
    for s in samples.itertuples(index=False):
        if s.sample_id not in preds.index:
            continue
        correct = preds.at[s.sample_id]
        verdict = None if not bool(s.kept) or correct is None or correct != correct else bool(correct)
        out.setdefault(plan.trajectory_id(s.shift, int(s.class_id), int(s.seed)), {})[milli(float(s.scale))] = verdict
    return out


def refined_rows(grid: pd.DataFrame, judged: dict[str, dict[int, bool | None]], classifier: str,
                 rounds: int) -> tuple[pd.DataFrame, list[tuple[dict, float]], list[str]]:
    """The ``failure_points_refined.csv`` rows of ``classifier`` as far as the judged points
    take each bisection, the points still to make (grid row, scale) and the keys of the
    points the bisections used."""
    rows, todo, used = [], [], []
    for g in grid.to_dict("records"):
        base = {k: g[k] for k in ("trajectory_id", "shift", "class_id", "seed")}
        fp = g["grid_fp"]
        if fp != fp or fp == 0:  # never failed, or failed at 0: left as they are
            status = "never_failed" if fp != fp else "failed_at_0"
            low = g["top"] if fp != fp else float("nan")
            rows.append({**base, "classifier": classifier, "grid_fp": fp, "refined_fp": fp, "interval_low": low,
                         "interval_high": fp, "rounds": 0, "rejected": 0, "status": status})
            continue
        w = walk(g["low"], g["high"], rounds, judged.get(g["trajectory_id"], {}))
        if w.next is not None:
            todo.append((g, w.next))
        used += [point_key(g["shift"], g["class_id"], g["seed"], p) for p in w.probes]
        rows.append({**base, "classifier": classifier, "grid_fp": fp, "refined_fp": w.high, "interval_low": w.low,
                     "interval_high": w.high, "rounds": w.rounds, "rejected": len(w.rejected), "status": "refined"})
    return pd.DataFrame(rows, columns=REFINED_COLUMNS), todo, used


# --------------------------------------------------------------------------- checks
ALL = "all"


def classifier_names(cfg: BuildConfig, uri: str, asked: str | list[str]) -> list[str]:
    """The classifiers ``asked`` names, in the config's order: one name, a comma list, a list,
    or ``all`` (every classifier of the output's config).  An unknown name is refused."""
    names = [c.name for c in cfg.classifiers]
    wanted = asked.split(",") if isinstance(asked, str) else list(asked)
    wanted = [w.strip() for w in wanted if w.strip()]
    if wanted == [ALL]:
        return names
    if not wanted:
        raise RefineError(f"no classifier named in {asked!r}: {uri} was built with {names} (or --classifier {ALL})")
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise RefineError(f"unknown classifier {unknown[0]!r}: {uri} was built with {names} (or --classifier {ALL})")
    return [n for n in names if n in wanted]


def check_families(cfg: BuildConfig, uri: str, echo: Callable[[str], None] | None = None) -> None:
    """A build refines only where its families' scales are continuous (the family's contract,
    ``continuous_scale``): none is refused naming each family; a family without one among
    others keeps its grid failure points, with a line saying so."""
    fixed = [g for g in cfg.family_groups() if g not in continuous_groups(cfg)]
    if not fixed:
        return
    named = ", ".join(f"{g.kind} ({', '.join(g.shifts[:3])}{', ...' if len(g.shifts) > 3 else ''})" for g in fixed)
    if len(fixed) == len(cfg.family_groups()):
        raise RefineError(f"{uri}: family {named} has no continuous scale (an image exists only at its grid's "
                          "scales): its failure points cannot be refined below the grid")
    if echo:
        echo(f"[cnsbench] family {named} has no continuous scale: its trajectories keep their grid failure points")


def check_request(cfg: BuildConfig, uri: str, classifier: str | list[str], rounds: int) -> list[str]:
    """Refuse what cannot be refined, naming it (exit 2 on the command line); the classifiers asked for."""
    if not 1 <= rounds <= MAX_ROUNDS:
        raise RefineError(f"--rounds (refine.rounds) must be 1..{MAX_ROUNDS}, got {rounds}")
    return classifier_names(cfg, uri, classifier)


def check_target(store) -> None:
    """The output is a build's, whole: not a folder inside an output (its refinement store), and
    no committed shard damaged (its trajectories would be left out of the grid, and refine
    does not regenerate a build's images: ``cnsbench build`` does)."""
    from pipeline.io.ownership import enclosing_output
    from pipeline.io.shard_check import check_committed

    parent = enclosing_output(store.uri)
    if parent is not None:
        raise RefineError(f"{store.uri} is not a build output but a folder of the output {parent} "
                          f"(its refinement store): refine {parent} itself")
    committed = check_committed(store)
    bad = [f"{shard} ({'; '.join(found)})" for shard, (_, found) in sorted(committed.damaged.items())]
    bad += [p.line() for p in committed.problems]
    if bad:
        raise RefineError(f"{store.uri} has {len(bad)} damaged shard(s): {', '.join(bad[:3])}"
                          f"{', ...' if len(bad) > 3 else ''}; run `cnsbench build` on it first (with its config: "
                          f"it regenerates them), then refine")


def missing_line(cfg: BuildConfig, samples: pd.DataFrame, uri: str) -> str | None:
    """One line saying how many planned trajectories a partial build lacks (None when whole)."""
    from pipeline import plan

    planned = plan.summarize(cfg).n_trajectories
    have = int(samples["trajectory_id"].nunique()) if len(samples) else 0
    if have >= planned:
        return None
    return (f"[cnsbench] {uri} is a partial build: {planned - have} of its {planned} planned trajectories are "
            f"missing (killed, or failed); refining the {have} it has. `cnsbench build` it to complete it, then "
            "refine again: the report marks the refined section stale until then")


def check_output(store, cfg: BuildConfig, classifiers: list[str], pairs: set[tuple[int, str]]) -> None:
    """The output holds each classifier's predictions and its config can regenerate its images."""
    from pipeline.aggregate.run import evaluated_source
    from pipeline.assets import AssetError, check_build
    from pipeline.io.ownership import read_marker

    built_with = [c["name"] for c in (read_marker(store) or {}).get("config", {}).get("classifiers", [])]
    manifests = list(store.manifests())
    for classifier in classifiers:
        lacking = [m.shard for m in manifests
                   if m.trajectories and classifier not in (m.classifiers if m.classifiers is not None else built_with)]
        if lacking or not manifests:
            raise RefineError(f"{store.uri} holds no predictions of {classifier!r} ({len(lacking)} shard(s) lack them); "
                              f"`cnsbench build` its config with {classifier!r} first")
    from pipeline.io.image_refs import referenced

    # an evaluation of a built benchmark refers to its images and carries its generator's config
    if evaluated_source(store) is not None and referenced(store) is None:
        raise RefineError(f"{store.uri} was made by `cnsbench evaluate` from released images: "
                          "refinement generates images, which needs the generator of a build")
    try:
        check_build(cfg, pairs)
    except AssetError as err:
        raise RefineError(f"{store.uri}'s config cannot regenerate its images: {err}") from None


# --------------------------------------------------------------------------- the run
@dataclass
class RefineSummary:
    classifier: str  # the classifiers refined, comma-separated
    rounds: int
    refined: int  # (trajectory, classifier) pairs bisected
    points_made: int  # points of the bisections not committed before this run
    points_reused: int  # points of the bisections committed before (another classifier's, or an earlier run's)
    table: str
    build: BuildSummary | None = None
    failed: int = 0  # points that could not be made (their trajectories stop short of the rounds)
    classifiers: list[str] = field(default_factory=list)
    per_classifier: dict[str, int] = field(default_factory=dict)  # classifier -> its points used (made or reused)


def refine_uri(uri: str) -> str:
    return f"{uri.rstrip('/')}/{REFINE_DIR}"


def grids(cfg: BuildConfig, samples: pd.DataFrame, predictions: pd.DataFrame, classifiers: list[str]) -> dict[str, pd.DataFrame]:
    return {c: grid_failures(cfg, samples, predictions, c) for c in classifiers}


def refine(output: str, classifier: str | list[str], *, rounds: int | None = None, runner: str = "ray",
           address: str | None = None, aggregate: bool = True, echo: Callable[[str], None] = print,
           models: dict[str, Any] | None = None) -> RefineSummary:
    """Refine the failure points of ``classifier`` (a name, a comma list, a list, or ``all``) on
    the build output ``output`` (docs/refine.md).

    The classifiers are refined together, round by round: a round makes each point that any of
    their unfinished bisections needs once, and every one of them classifies it, so each
    classifier's rows are those it gets refined alone.  Holds the output's lease throughout (a
    build of it is refused meanwhile, and this waits for none); ``rounds`` defaults to the
    output's ``refine.rounds``.  ``models``: the objects of classifiers held in memory (kind
    ``module``, by name), checked against the weights that made their predictions."""
    from pipeline.aggregate.run import load_output_config, load_sound_tables
    from pipeline.io.store import OutputStore

    store = OutputStore(output)
    cfg = with_models(load_output_config(store), models or {}, store)
    check_families(cfg, output, echo)
    check_target(store)
    rounds = cfg.refine.rounds if rounds is None else rounds
    names = check_request(cfg, output, classifier, rounds)
    samples, predictions, _ = load_sound_tables(store, names)
    partial = missing_line(cfg, samples, output)
    failing = pd.concat([g.dropna(subset=["low"]) for g in grids(cfg, samples, predictions, names).values()])
    check_output(store, refinement_config(cfg, names), names,
                 {(int(c), s) for c, s in zip(failing["class_id"], failing["shift"])})
    label = ",".join(names)
    with OutputRun.claim(output, "refine", echo, runner=runner, address=address) as run:
        # 1. the output as built: compatible with itself, its committed shards, the weights (a
        #    shard damaged since the check is left where it is: only a build regenerates it)
        run.prepare(cfg, repair=False)
        if partial:
            echo(partial)
        samples, predictions, _ = load_sound_tables(run.store, names)
        grid = grids(cfg, samples, predictions, names)
        failing = sum(int(g["low"].notna().sum()) for g in grid.values())
        outer = run.start_on_committed("refine")
        # 2. the refinement store: its own run (lease, committed points, the classifiers added to them)
        sub = refinement_config(cfg, names)
        with OutputRun.claim(refine_uri(output), "refine", echo, runner=runner, address=address) as claimed:
            inner = claimed.prepare(sub).start(failing * rounds, 0, what="refine points")
            before = committed_points(inner)
            inner.add_classifiers()
            # 3. the rounds: each one point per unfinished (trajectory, classifier), a point
            #    several classifiers need made once, all through one chain
            tried: set[str] = set()
            for r in range(rounds):
                todo = points_to_make(grid, judged(inner, names), rounds)
                # A point tried before and still missing failed (the writer recorded why): not again.
                todo = [(g, sc) for g, sc in todo if point_key(g["shift"], g["class_id"], g["seed"], sc) not in tried]
                if not todo:
                    break
                tried |= {point_key(g["shift"], g["class_id"], g["seed"], sc) for g, sc in todo}
                echo(f"[cnsbench] refine {label}: round {r + 1}/{rounds}, {len(todo)} point(s) to make")
                units = unit_rows(todo, samples, run.store)
                inner.run_chain(units, refinement_chain(sub, inner.commit_kwargs()), num_blocks=len(units),
                                first_schema=REFINE_UNIT)
            marks = judged(inner, names)
            results = {c: refined_rows(grid[c], marks.get(c, {}), c, rounds) for c in names}
            # 4. the table, these classifiers' rows replacing their earlier ones (a trajectory whose
            #    point failed keeps the rounds it reached)
            table = pd.concat([t for t, _, _ in results.values()], ignore_index=True)
            inner.ensure_held()
            write_table(inner.store, table, names)
            inner.finish(aggregate=False)
        summary = outer.finish(aggregate=aggregate, run_name="-refine")
    used = {k for _, _, u in results.values() for k in u}
    left = {point_key(g["shift"], g["class_id"], g["seed"], sc) for _, t, _ in results.values() for g, sc in t}
    n = int((table["status"] == "refined").sum())
    reused = sum(1 for k in used if k in before)
    made = len(used) - reused
    echo(f"[cnsbench] refined {n} (trajectory, classifier) pairs of {label} ({rounds} rounds): {made} point(s) made, "
         f"{reused} reused; {refine_uri(output)}/failure_points_refined.csv")
    if left:
        echo(f"[cnsbench] {len(left)} point(s) failed (see {refine_uri(output)}/failures/): "
             "their trajectories stop short of the rounds; the same command tries them again")
    return RefineSummary(label, rounds, n, made, reused, run.store.url(REFINED_CSV), summary, len(left), names,
                         {c: len(set(u)) for c, (_, _, u) in results.items()})


def with_models(cfg: BuildConfig, models: dict[str, Any], store: Any) -> BuildConfig:
    """``cfg`` whose entries of kind ``module`` named in ``models`` hold their objects, each
    refused unless its weights are those that made the output's predictions of that name."""
    from pipeline.assets.weights import WeightsChanged, check_weights, weights_digest
    from pipeline.io.ownership import read_marker

    names = {c.name for c in cfg.classifiers}
    unknown = sorted(set(models) - names)
    if unknown:
        raise RefineError(f"models: {', '.join(map(repr, unknown))} not among the output's classifiers "
                          f"({', '.join(sorted(names))})")
    from pipeline.evaluate import attach_held

    configured = sorted(c.name for c in cfg.classifiers if c.name in models and c.kind != "module")
    if configured:
        raise RefineError(f"models: {', '.join(map(repr, configured))} are configured classifiers of the output "
                          "(their entries load their own weights); models= holds models in memory only")
    cfg = attach_held(cfg, models)
    digests = {c.name: weights_digest(c) for c in cfg.classifiers if c.name in models}
    try:
        check_weights(store.uri, read_marker(store), digests, "pass the model whose predictions the output holds")
    except WeightsChanged as err:
        raise RefineError(str(err)) from None
    return cfg


def points_to_make(grid: dict[str, pd.DataFrame], marks: dict[str, dict[str, dict[int, bool | None]]],
                   rounds: int) -> list[tuple[dict, float]]:
    """The next point of every unfinished (trajectory, classifier) bisection, each point once."""
    out: dict[str, tuple[dict, float]] = {}
    for c, g in grid.items():
        _, todo, _ = refined_rows(g, marks.get(c, {}), c, rounds)
        for row, scale in todo:
            out.setdefault(point_key(row["shift"], row["class_id"], row["seed"], scale), (row, scale))
    return [out[k] for k in sorted(out)]


def refinement_config(cfg: BuildConfig, classifiers: list[str]) -> BuildConfig:
    """The refinement store's config: the build's, with the classifiers refined and its own shard size."""
    output = cfg.output.model_copy(update={"trajectories_per_shard": POINTS_PER_SHARD})
    return cfg.model_copy(update={"classifiers": [c for c in cfg.classifiers if c.name in classifiers], "output": output})


def refinement_chain(cfg: BuildConfig, commit: dict[str, str]) -> Chain:
    """generate -> filter -> classify -> write, the refinement's generate and filter in the build's places."""
    from pipeline.build import build_chain
    from pipeline.stages.refine import RefineFilterStage, RefineGenerateStage

    chain = build_chain(cfg, commit)
    own = {"generate": RefineGenerateStage, "filter": RefineFilterStage}
    return Chain(cfg, [StageSpec(own.get(s.stage.name, s.stage), s.kwargs, s.resources, s.batch_size) for s in chain])


def judged(run: Running, classifiers: list[str]) -> dict[str, dict[str, dict[int, bool | None]]]:
    """Per classifier, its judged refinement points (:func:`judged_points`), the tables read once."""
    from pipeline.io.tables import load_predictions, load_samples

    samples, predictions = load_samples(run.store), load_predictions(run.store, classifiers)
    return {c: judged_points(samples, predictions, c) for c in classifiers}


def committed_points(run: Running) -> set[str]:
    """The keys of the points committed to the refinement store."""
    return {k for m in run.store.manifests() for k in m.trajectories}


def unit_rows(todo: list[tuple[dict, float]], samples: pd.DataFrame, store) -> list[dict]:
    """One :data:`pipeline.stages.refine.REFINE_UNIT` row per (class, seed): its points and each
    point's committed scale-0 image (the filter's reference), in a fixed order."""
    from pipeline import plan
    from pipeline.aggregate.images import ImageReader

    refs = {g["trajectory_id"]: plan.sample_id(g["shift"], g["class_id"], g["seed"], 0.0) for g, _ in todo}
    images = ImageReader(store, samples).many(sorted(set(refs.values())))
    names = samples.drop_duplicates("class_id").set_index("class_id")["class_name"]
    units: dict[tuple[int, int], dict] = {}
    for g, scale in sorted(todo, key=lambda t: point_key(t[0]["shift"], t[0]["class_id"], t[0]["seed"], t[1])):
        cid, seed = int(g["class_id"]), int(g["seed"])
        u = units.setdefault((cid, seed), {"unit_id": plan.unit_id(cid, seed), "class_id": cid,
                                           "class_name": str(names.at[cid]), "seed": seed, "shifts": [], "scales": [],
                                           "references": []})
        u["shifts"].append(g["shift"])
        u["scales"].append(float(scale))
        u["references"].append(images[refs[g["trajectory_id"]]])
    return [units[k] for k in sorted(units)]


def write_table(store, table: pd.DataFrame, classifiers: list[str]) -> None:
    """``failure_points_refined.csv`` with ``classifiers``' rows replaced (the store: the refinement's)."""
    rel = REFINED_CSV.split("/", 1)[1]
    old = read_refined(store, rel)
    if old is not None:
        table = pd.concat([old[~old["classifier"].isin(classifiers)], table], ignore_index=True)
    table = table.sort_values(["classifier", "shift", "trajectory_id"], kind="stable").reset_index(drop=True)
    store.write_bytes(rel, table.to_csv(index=False).encode("utf-8"))
