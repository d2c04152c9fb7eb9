"""Evaluate-only mode: run the classifier pool (and optionally the OOC filter) over existing images.

Role: ``cnsbench evaluate SOURCE --config CONFIG --output DIR``.  The images come from a
source (:mod:`pipeline.sources`: the published CNS-Bench layout, a WebDataset / build
output, or class folders) instead of the generator; everything after that is the build's
own machinery, so the output has the build's layout and contract (``images/``,
``samples/``, ``predictions/``, ``manifest/``, ``report/``, ``config.json``) and
``cnsbench aggregate`` / ``status`` work on it:

    source pointer rows --LoadStage--> [--FilterStage-->] --ClassifyStage--> --WriteStage-->

run by the same executors as a build (:mod:`pipeline.executors`).

The config supplies the classifiers, the filter models and thresholds, output format and
resources; its ``benchmark`` section is replaced by what the source holds (classes, seeds,
shifts, scales; :func:`effective_config`), and that effective config is what
``config.json`` records.  Without ``--filter`` the filter is disabled (scores NaN,
``n_pass`` 0, every image kept).  Resuming works as for a build: trajectories of committed
shards are skipped, a classifier added to the config is predicted on every committed shard
(the reclassify stage, :meth:`pipeline.output_run.Running.add_classifiers`, as a build and a
card add theirs), and a second run with settings that would change existing rows (another
spec behind a classifier's name, filter on/off, thresholds, scales) is refused.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from pipeline.sources import release_protocol
from pipeline.sources.detect import protocol_of
from pipeline.config import (
    BuildConfig,
    ConfigError,
    parse_config,
    resolved_dict,
)
from pipeline.executors import Chain, StageSpec
from pipeline.io.image_refs import write_reference
from pipeline.output_run import BuildSummary, OutputRun
from pipeline.io.safejson import dumps as strict_dumps
from pipeline.sources import Source
from pipeline.sources.imagenet_d_questions import check_distractor_sources
from pipeline.stages.load import LoadStage


def select_classifiers(cfg: BuildConfig, names: list[str] | None) -> list[dict[str, Any]]:
    """The config's classifier specs named in ``names`` (in that order), all when None."""
    specs = {c.name: c.model_dump(mode="json") for c in cfg.classifiers}
    if not names:
        return list(specs.values())
    unknown = [n for n in names if n not in specs]
    if unknown:
        raise ConfigError(f"--classifiers: {unknown} not in the config; known: {', '.join(specs)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"--classifiers: names repeat: {names}")
    return [specs[n] for n in names]


def effective_config(
    cfg: BuildConfig, source: Source, *, use_filter: bool, classifiers: list[str] | None = None
) -> BuildConfig:
    """``cfg`` with its benchmark replaced by the source's coordinates.

    classes / seeds / shifts / scales become those present in the source, the filter is
    enabled only with ``use_filter``, the classifiers are narrowed to ``classifiers``, a
    released layout's protocol fills their inputs (:func:`pipeline.sources.release_protocol.apply_to`), and
    ``output.image_format`` becomes the source's dominant format so its images are stored
    unchanged.  Raises ConfigError (e.g. scales without 0, a margin below the largest scale).
    """
    raw = resolved_dict(cfg)
    raw["benchmark"].update(
        # Scale 0 is every grid's reference, also for layouts that may lack it (ImageNet-C).
        classes=source.classes, seeds=source.seeds, shifts=source.shifts, scales=sorted({0.0, *source.scales})
    )
    if source.labels and not (source.labels_unless_set and "labels" in cfg.benchmark.model_fields_set):
        # a layout with its own label space (ImageNet-D's 113 classes, XIMAGENET-12's 12-way)
        raw["benchmark"]["labels"] = source.labels
        if raw["filter"].get("class_names") == "keras":  # Keras names exist for ImageNet-1k only
            raw["filter"]["class_names"] = "labels"
    # The margin's "never failed" value must cover the grid (ImageNet-C severities reach 5).
    raw["aggregate"]["margin_max_scale"] = max(raw["aggregate"]["margin_max_scale"], *raw["benchmark"]["scales"])
    configured = {a if isinstance(a, str) else a.get("name") for a in raw["aggregate"]["analyses"]}
    raw["aggregate"]["analyses"] += [a for a in source.analyses if a not in configured]
    raw["filter"]["enabled"] = bool(use_filter)
    raw["classifiers"] = select_classifiers(cfg, classifiers)
    # a released layout: its authors' inputs, docs/protocol.md
    release_protocol.apply_to(raw, cfg, source, protocol_of(source.kind))
    raw["output"]["image_format"] = source.image_format
    check_distractor_sources(raw["classifiers"], source.rows, source.location)  # vlms: questions or a classifier
    return parse_config(raw, source=f"evaluate config for {source.location}")


def refers_to_images(source: Source, done: set[str]) -> bool:
    """Whether a new evaluation output refers to ``source``'s images instead of copying them: a
    built cnsbench benchmark (its sample rows name each image's shard and key), scored into an
    output that holds no shard yet (an output that copied its images keeps doing so)."""
    from pipeline.io.store import OutputStore

    if source.kind != "webdataset" or done or not source.rows or "source_filter" not in source.rows[0]:
        return False
    return OutputStore(source.location).exists("config.json")


def _check_assets(cfg: BuildConfig) -> None:
    """Missing filter/classifier files, all at once (the generator is not used here)."""
    from pipeline.assets import resolve_assets

    resolve_assets(cfg, []).require(without=("generator",), what="the evaluation")


def _stages(cfg: BuildConfig, commit: dict[str, str]) -> Chain:
    """load -> [filter ->] classify (a stage per classifier group) -> write; ``commit``: the
    writer's commit kwargs (:meth:`pipeline.output_run.Running.commit_kwargs`).  The
    filter, classify and write pools declare their projected memory (:class:`Chain`)."""
    from pipeline.stages.classify import classify_specs
    from pipeline.stages.filter import FilterStage
    from pipeline.stages.write import WriteStage

    from pipeline.perf.memory import stage_batch_size

    # Load batches the size of the next stage's, so each batch feeds one model forward.
    nxt = stage_batch_size(cfg, "filter" if cfg.filter.enabled else "classify")
    chain = [StageSpec(LoadStage, {"fill_filter": not cfg.filter.enabled}, batch_size=nxt)]
    if cfg.filter.enabled:
        chain.append(StageSpec(FilterStage))
    chain += classify_specs(cfg)
    chain.append(StageSpec(WriteStage, dict(commit), batch_size=cfg.output.trajectories_per_shard))
    return Chain(cfg, chain)


def evaluate(
    cfg: BuildConfig,
    source: Source,
    output: str,
    *,
    runner: str = "ray",
    address: str | None = None,
    aggregate: bool = True,
    echo: Callable[[str], None] = print,
) -> BuildSummary:
    """Run (or resume) the evaluation of ``source`` with the effective config ``cfg``.

    ``cfg`` should come from :func:`effective_config`.  Returns the same summary as a
    build (generation fields None).  Holds the output's lease throughout.
    """
    with OutputRun.claim(output, "evaluate", echo, runner=runner, address=address) as run:
        # 1. compare with the output's config, read what is committed, check the weights
        run.prepare(cfg)
        todo = [r for r in source.rows if r["trajectory_id"] not in run.done]
        # 2. everything the evaluation loads is there
        _check_assets(cfg)
        # 3. clean, write the config and what the source is, start counting
        total = len(source.rows)
        running = run.start(total, total - len(todo), what="evaluate")
        running.store.write_text("source.json", strict_dumps(source.describe(), indent=1))
        if refers_to_images(source, run.done):  # a built benchmark: its images are referred to, not copied
            write_reference(running.store, source.location)
            echo(f"[cnsbench] images: those of {source.location}, referred to (not copied; keep it where it is)")
        echo(
            f"[cnsbench] {source.kind} source {source.location}: {total} trajectories ({source.n_images} images), "
            f"{total - len(todo)} already done, {len(todo)} to evaluate"
        )
        for note in source.notes:
            echo(f"[cnsbench] note: {note}")
        # 4. classifiers the committed shards lack, on their images; then the chain (rows are
        #    light pointers; a few per block keeps the load pool busy)
        running.add_classifiers()
        running.run_chain(todo, _stages(cfg, running.commit_kwargs()), num_blocks=min(len(todo), 1000))
        # 5. report and summary
        return running.finish(aggregate=aggregate, run_name="-evaluate", run_info={"source": source.describe()})


def attach_held(cfg: BuildConfig, held: Mapping[str, Any]) -> BuildConfig:
    """``cfg`` whose entries named in ``held`` hold those objects (models in memory, kind
    ``module``).  A config parsed from its dict form holds nothing; this is the one place a
    held model is put back into one."""
    if not held:
        return cfg
    return cfg.model_copy(update={"classifiers": [c.holding(held[c.name]) if c.name in held else c
                                                  for c in cfg.classifiers]})


def held_of(cfg: BuildConfig) -> dict[str, Any]:
    """The objects ``cfg``'s entries hold, by name (for :func:`attach_held` after a re-parse)."""
    return {c.name: c.held for c in cfg.classifiers if c.held is not None}


def add_classifiers(uri: str, cfg: BuildConfig, *, command: str, runner: str, echo: Callable[[str], None] = print,
                    report: bool = True, weights_hint: str | None = None) -> BuildSummary:
    """The one driver that adds classifiers to existing images: ``cfg``'s classifiers the
    committed shards of ``uri`` lack are run on them (the reclassify stage), then (with
    ``report``) the report is aggregated again, under the output's lease and without planning
    any new image.  ``evaluate`` in place, ``card`` and a model held in memory all come here."""
    kwargs = {} if weights_hint is None else {"weights_hint": weights_hint}
    with OutputRun.claim(uri, command, echo, runner=runner) as run:
        run.prepare(cfg, repair=False, **kwargs)
        running = run.start_on_committed(command)
        running.add_classifiers()
        return running.finish(aggregate=report, run_name=f"-{command}")
