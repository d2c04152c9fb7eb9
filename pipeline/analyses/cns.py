"""Analysis ``cns``: accuracy drop, failure points, margins and shift realisation (CNS-Bench).

The metric definitions live in :mod:`pipeline.aggregate.metrics` and the presentation in
:mod:`pipeline.aggregate.report`; this module applies them per family of the build (each
family has its own scale grid).  The primary family's tables are the report's
``accuracy.csv``, ``failure_points.csv`` and ``summary.csv``; with several families the
tables of all families are concatenated with a ``family`` column, and each further
family's plots carry its kind as a suffix (``accuracy_drop_corruption.png``).
"""

from __future__ import annotations

import json

import pandas as pd

from pipeline.aggregate.analysis import AnalysisContext, AnalysisResult


def group_metrics(ctx: AnalysisContext):
    """[(group, Metrics)] for every family group of the build, primary first.

    Several analyses of one report ask for them (cns, strips, shift views, the family
    comparison): they are computed once per report (``ctx.memo``) and shared; callers
    treat them as read-only."""
    if "group_metrics" not in ctx.memo:
        ctx.memo["group_metrics"] = _group_metrics(ctx)
    return list(ctx.memo["group_metrics"])


def _group_metrics(ctx: AnalysisContext):
    from pipeline.aggregate.metrics import compute_metrics

    agg = ctx.config.aggregate
    out = []
    for group in ctx.groups:
        samples = ctx.samples_of(group)
        predictions = ctx.predictions[ctx.predictions["sample_id"].isin(samples["sample_id"])]
        # The margin's "never failed" value is a CNS setting for the slider grid; other
        # families use the largest of their own scales when that is beyond it.
        margin = max(agg.margin_max_scale, max(group.scales))
        out.append((group, compute_metrics(samples, predictions, list(group.scales), margin, fp_std_ddof=agg.fp_std_ddof)))
    return out


_LAST_INTERVALS: dict = {}


def with_intervals(ctx: AnalysisContext, per_group: list) -> tuple[list, dict]:
    """Bootstrap intervals (``aggregate.bootstrap``) joined onto each group's tables, and
    ``{group kind: pairwise comparison table}``; unchanged when ``resamples`` is 0."""
    from pipeline.aggregate import bootstrap

    spec = ctx.config.aggregate.bootstrap
    if not spec.resamples:
        return per_group, {}
    out, pairwise = [], {}
    for group, metrics in per_group:
        # The report's analyses see the same tables: resample them once.  Holding the tables
        # in the cache keeps their ids from being reused by other tables.
        key = (id(ctx.samples), id(ctx.predictions), spec.resamples, spec.level, spec.seed)
        if _LAST_INTERVALS.get("key") != key:
            _LAST_INTERVALS.clear()
            _LAST_INTERVALS.update(key=key, tables=(ctx.samples, ctx.predictions), by_kind={})
        iv = _LAST_INTERVALS["by_kind"].get(group.kind)
        if iv is None:
            iv = bootstrap.intervals(
                ctx.samples_of(group), ctx.predictions, metrics, resamples=spec.resamples, level=spec.level, seed=spec.seed
            )
            _LAST_INTERVALS["by_kind"][group.kind] = iv
        out.append((group, bootstrap.with_intervals(metrics, iv)))
        pairwise[group.kind] = iv.pairwise
    return out, pairwise


def adaptive_design(ctx: AnalysisContext, per_group: list) -> tuple[list, tuple[dict, pd.DataFrame]]:
    """The groups' metrics with the stratified estimates in place of the pooled ones, and the
    design (its rounds replayed from the committed tables, :mod:`pipeline.aggregate.adaptive`)
    with the mean failure point per (classifier, shift) of every group."""
    from pipeline.aggregate import adaptive

    cfg = ctx.config
    out, fps = [], []
    for group, metrics in per_group:
        weighted, fp = adaptive.weighted_group(cfg, ctx.samples_of(group), ctx.predictions, metrics, group.kind)
        out.append((group, weighted))
        fps.append(fp.assign(family=group.kind) if len(per_group) > 1 else fp)
    from pipeline.aggregate.images import ImageReader

    attempted = set(ctx.samples["trajectory_id"].astype(str))
    # The classifiers that steered the rounds (a classifier added later did not), where the
    # output's shards can be read.
    steering = adaptive.steering_classifiers(ctx.read_image.store, cfg) if isinstance(ctx.read_image, ImageReader) else None
    doc = adaptive.design_json(cfg, adaptive.replay(cfg, ctx.samples, ctx.predictions, attempted, steering))
    fp_mean = pd.concat(fps, ignore_index=True)
    doc["failure_point_mean"] = json.loads(fp_mean.to_json(orient="records"))
    return out, (doc, fp_mean)


def design_section(doc: dict) -> str:
    import html

    rounds = ", ".join(f"{r['trajectories']} trajectories / {r['images']} images" for r in doc["rounds"])
    return (f"<h2>Design: adaptive</h2><p>{len(doc['rounds'])} round(s) ({html.escape(rounds)}); "
            f"stopped: <b>{html.escape(str(doc['stop'] or 'not finished'))}</b> (target half-width {doc['target']:g}, "
            f"failure point {doc['failure_point_target']:g}, cap {doc['max_images']} images, "
            f"uniform design {doc['uniform_images']} images). Estimates: {html.escape(doc['estimator'])}; "
            f"intervals at {doc['level']:.0%}.</p>")


def run(ctx: AnalysisContext) -> AnalysisResult:
    from pipeline.aggregate.report import cns_files, cns_section, pairwise_section

    per_group, pairwise = with_intervals(ctx, group_metrics(ctx))
    design = None
    if ctx.config.sampling is not None:  # an adaptive build: its headline numbers are weighted
        per_group, design = adaptive_design(ctx, per_group)
    plots = ctx.config.aggregate.plots
    result = AnalysisResult(title="")
    primary_group, primary = per_group[0]
    files, plot_files = cns_files(primary, plots=plots)
    result.files.update(files)
    sections = [cns_section(primary, plot_files)]
    result.json = primary.to_json()
    if design is not None:
        doc, fp_mean = design
        result.json["sampling"] = doc
        result.tables["failure_point_mean"] = fp_mean
        sections.insert(0, design_section(doc))
    if primary_group.kind in pairwise:
        result.tables["pairwise"] = pairwise[primary_group.kind]
        result.json["pairwise"] = json.loads(pairwise[primary_group.kind].to_json(orient="records"))
        sections.append(pairwise_section(pairwise[primary_group.kind], ctx.config.aggregate.bootstrap))
    if len(per_group) > 1:
        tables = {"accuracy.csv": "accuracy", "failure_points.csv": "failure_point_table", "summary.csv": "summary"}
        for fname, attr in tables.items():
            frames = [getattr(m, attr).assign(family=g.kind) for g, m in per_group]
            result.files[fname] = pd.concat(frames, ignore_index=True).to_csv(index=False).encode("utf-8")
        result.json["families"] = {}
        for group, metrics in per_group[1:]:
            extra, extra_plots = cns_files(metrics, plots=plots, suffix=f"_{group.kind}")
            result.files.update(extra)
            sections.append(f"<h2>Family {group.kind}</h2>" + cns_section(metrics, extra_plots))
            if group.kind in pairwise:
                result.tables[f"pairwise_{group.kind}"] = pairwise[group.kind]
            result.json["families"][group.kind] = metrics.to_json()
        result.json["families"][primary_group.kind] = {"shifts": list(primary_group.shifts)}
    result.html = "\n".join(sections)
    return result
