"""Each benchmark of a suite as an output holding the card's model.

For every benchmark (:class:`pipeline.card.suite.Benchmark`) :func:`prepare` makes sure
its output exists and holds the model's predictions, doing only what is missing:

* a build entry is built (``cnsbench build``'s :func:`pipeline.build.build`) when its
  output is missing, incomplete, or lacks the model; a build of an existing output adds
  the model to the committed shards with the reclassify stage (only that model runs, on
  the committed images) and aggregates the report again.  An existing output the entry
  ``reuse``s is another's: it is read as an ``output`` entry is;
* a release entry is evaluated once (:func:`pipeline.evaluate.evaluate`) with the model
  (and the suite's baseline classifier, for corruptions) under its authors' protocol; a
  later card adds its model to the committed shards the same way, its entry filled by
  the release's protocol as ``evaluate`` fills every entry;
* an ``output`` entry is a benchmark the card only reads (a shared one may be read-only).
  A model it holds (the same entry, weights and predictions) is read from it as it is; any
  other model, or one whose failure points the card refines, is scored into the card's own
  evaluation output (``CARD/outputs/<name>``, with the suite's corruption baseline), which
  refers to the benchmark's images and uses its keep decisions, so the numbers are those
  an evaluation of the benchmark gives.

Classifiers earlier cards added to an output stay in its config.  A model whose name a
build's or release's output already uses for another model is refused (:class:`ModelConflict`): pass another
``--name``.  When nothing is missing nothing is loaded: whether an output is complete is
read from its manifests and report, never by running a model.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Callable

from pipeline.card.suite import ALEXNET, Benchmark, benchmark_hash
from pipeline.config import BuildConfig, ClassifierSpec, ConfigError, config_hash, parse_config, resolved_dict
from pipeline.errors import CnsbenchError
from pipeline.io.ownership import read_marker
from pipeline.io.store import OutputStore
from pipeline.sources import release_protocol
from pipeline.sources.detect import protocol_of

Echo = Callable[[str], None]


class ModelConflict(ConfigError):
    """The output already has a classifier of the model's name that is another model."""


WEIGHTS_HINT = "pass --name to add the model under another name (its predictions are then made from its present weights)"


def check_model_weights(uri: str, marker: dict[str, Any] | None, model: ClassifierSpec) -> None:
    """Refuse (:class:`pipeline.assets.weights.WeightsChanged`) a model whose weights differ from
    those that made its predictions in ``uri``, or (a model held in memory) that answers the
    output's probe images otherwise (:mod:`pipeline.stages.probe`): its old numbers are never
    put on a card."""
    from pipeline.assets.weights import check_weights, weights_digest
    from pipeline.stages.probe import check_output

    digest = weights_digest(model)
    check_weights(uri, marker, {model.name: digest}, WEIGHTS_HINT)
    check_output(uri, marker, model, digest, WEIGHTS_HINT)


@dataclass(frozen=True)
class Prepared:
    """A benchmark's output holding the model: its config (with the model) and what was done."""

    benchmark: Benchmark
    uri: str
    config: BuildConfig
    config_hash: str
    model: ClassifierSpec  # the model's entry as the output holds it (its protocol's inputs filled)
    protocol: dict[str, Any]
    work: str  # "none", "built", "evaluated", "added"


def release_kind(store: OutputStore) -> str | None:
    """The released layout an evaluate output was made from (``source.json``), else None."""
    if not store.exists("source.json"):
        return None
    try:
        return json.loads(store.read_bytes("source.json")).get("kind")
    except (ValueError, AttributeError):
        return None


def protocol_of_output(cfg: BuildConfig, kind: str | None) -> dict[str, Any]:
    """The protocol an output was evaluated with: its release's authors' (name, original code,
    metric) or the config's ``protocol`` (cns | custom)."""
    proto = protocol_of(kind) if kind else None
    if proto is not None:
        return {"name": proto.name, "original": proto.original, "accuracy": proto.accuracy, "metric": proto.metric}
    return {"name": cfg.protocol, "original": "docs/protocol.md", "accuracy": "", "metric": ""}


def _entry_with_protocol(entry: dict[str, Any], model: ClassifierSpec, kind: str | None) -> tuple[dict[str, Any], dict | None]:
    """The model's entry with its release's protocol applied (and its analysis entry), as
    ``evaluate`` applies it to every entry."""
    proto = protocol_of(kind) if kind else None
    if proto is None:
        return entry, None
    entries, analysis, _ = release_protocol.apply(proto, [entry], {model.name: set(model.model_fields_set)})
    return entries[0], analysis


def with_model(raw: dict[str, Any], model: ClassifierSpec, kind: str | None, where: str) -> tuple[dict[str, Any], bool]:
    """``raw`` (a resolved config dict) holding the model's entry; whether the entry is new.

    Raises :class:`ModelConflict` when the name is taken by another model."""
    raw = copy.deepcopy(raw)
    entry, analysis = _entry_with_protocol(model.model_dump(mode="json"), model, kind)
    names = [c["name"] for c in raw["classifiers"]]
    if model.name in names:
        existing = raw["classifiers"][names.index(model.name)]
        trial = copy.deepcopy(raw)
        trial["classifiers"][names.index(model.name)] = entry
        mine = next(c for c in resolved_dict(parse_config(trial, source=where))["classifiers"] if c["name"] == model.name)
        differ = sorted(k for k in set(existing) | set(mine) if existing.get(k) != mine.get(k))
        if differ:
            detail = "; ".join(f"{k}: {existing.get(k)!r} there, {mine.get(k)!r} here" for k in differ[:5])
            raise ModelConflict(
                f"{where}: the output already has a classifier named {model.name!r} that is another model "
                f"({detail}); pass --name to give the model another name"[:900]
            )
        return raw, False
    raw["classifiers"].append(entry)
    if analysis is not None:  # the release_protocol analysis names every classifier's inputs
        for a in raw["aggregate"]["analyses"]:
            if isinstance(a, dict) and a.get("name") == release_protocol.ANALYSIS:
                a.setdefault("classifiers", {}).update(analysis["classifiers"])
                a.setdefault("overridden", {}).update(analysis["overridden"])
    return raw, True


def _report_hash(store: OutputStore) -> str | None:
    if not store.exists("report/metrics.json") or not store.exists("report/index.html"):
        return None
    try:
        return json.loads(store.read_bytes("report/metrics.json")).get("config_hash")
    except ValueError:
        return None


def needs_build(
    store: OutputStore, cfg: BuildConfig, marker: dict[str, Any] | None, planned: bool = True, report: bool = True
) -> bool:
    """Whether a build of ``cfg`` into ``store`` has anything to do: trajectories not made
    (with ``planned``: a build's plan; failed ones are not retried here), shards lacking a
    classifier's predictions, another config recorded, or (with ``report``) a report not
    made from it."""
    from pipeline import plan
    from pipeline.output_run import committed_trajectories
    from pipeline.stages.reclassify import missing_classifiers

    if marker is None:
        return True
    if planned:
        done, failed = committed_trajectories(store, repair=False)
        if plan.plan_units(cfg, done | set(failed)):
            return True
    built_with = [c["name"] for c in marker["config"].get("classifiers", [])]
    if missing_classifiers(store, [c.name for c in cfg.classifiers], built_with):
        return True
    digest = config_hash(cfg)
    return marker.get("config_hash") != digest or (report and _report_hash(store) != digest)


def add_to_output(uri: str, cfg: BuildConfig, *, runner: str, echo: Echo, report: bool = True) -> None:
    """Add ``cfg``'s new classifiers to the committed shards of ``uri`` and (with ``report``)
    aggregate the report again (:func:`pipeline.evaluate.add_classifiers`, the one driver)."""
    from pipeline.evaluate import add_classifiers

    add_classifiers(uri, cfg, command="card", runner=runner, echo=echo, report=report, weights_hint=WEIGHTS_HINT)


def stale_classifiers(store: OutputStore, marker: dict[str, Any] | None) -> set[str]:
    """Classifiers an output's config names but none of its committed shards holds: an
    addition that failed before its first shard (e.g. a model that cannot take the input)."""
    from pipeline.stages.reclassify import missing_classifiers

    if marker is None:
        return set()
    names = [c["name"] for c in marker["config"].get("classifiers", [])]
    shards = [m for m in store.manifests() if m.trajectories]
    if not shards:
        return set()
    rows = missing_classifiers(store, names, names if all(m.classifiers is None for m in shards) else [])
    if len(rows) < len(shards):
        return set()
    return set.intersection(*(set(r["classifiers"]) for r in rows))


def forget_stale(uri: str, echo: Echo) -> dict[str, Any] | None:
    """The output's marker, after rewriting its config without the classifiers no shard holds
    (:func:`stale_classifiers`), so their names can be used again."""
    from pipeline.output_run import OutputRun

    store = OutputStore(uri)
    marker = read_marker(store)
    stale = stale_classifiers(store, marker)
    if not stale:
        return marker
    raw = marker["config"]
    raw = {**raw, "classifiers": [c for c in raw.get("classifiers", []) if c.get("name") not in stale]}
    cfg = parse_config(raw, source=f"{store.url('config.json')} without {', '.join(sorted(stale))}")
    with OutputRun.claim(uri, "card", echo) as run:
        run.rewrite_config(cfg, forget=stale)
    echo(f"[cnsbench] card: {uri}: its config named {', '.join(sorted(stale))}, which no shard holds "
         "(an addition that failed): dropped from the config")
    return read_marker(store)


def _kept_classifiers(raw: dict[str, Any], marker: dict[str, Any] | None) -> dict[str, Any]:
    """``raw`` with the classifiers earlier cards added to the output (absent from the suite's config)."""
    if marker is None:
        return raw
    names = {c["name"] for c in raw["classifiers"]}
    extra = [c for c in marker["config"].get("classifiers", []) if c.get("name") not in names]
    return {**raw, "classifiers": [*raw["classifiers"], *extra]} if extra else raw


def holding(cfg: BuildConfig, model: ClassifierSpec) -> BuildConfig:
    """``cfg`` whose entry of the model holds what the model holds in memory (kind ``module``)."""
    from pipeline.evaluate import attach_held

    return attach_held(cfg, {model.name: model.held} if model.held is not None else {})


def reused_output(b: Benchmark, cfg: BuildConfig) -> str | None:
    """The first of ``b.reuse`` holding an output of the same benchmark as ``cfg`` (its config
    without classifiers, resources and location: :func:`pipeline.card.suite.benchmark_hash`),
    when ``b.output`` holds no output yet; None otherwise."""
    if not b.reuse or read_marker(OutputStore(b.output)) is not None:
        return None
    wanted = benchmark_hash(cfg)
    for uri in b.reuse:
        store = OutputStore(uri)
        try:
            marker = read_marker(store)
            found = marker is not None and benchmark_hash(parse_config(marker["config"], source=uri)) == wanted
        except (ValueError, OSError):  # not an output, or one this cnsbench cannot read: not reused
            found = False
        if found:
            return uri
    return None


def _prepare_build(b: Benchmark, model: ClassifierSpec, baseline: str | None, runner: str, echo: Echo, ready: Callable,
                   report: bool, own: str | None, refine: bool) -> Prepared:
    from dataclasses import replace

    from pipeline.build import build

    cfg = b.load_config()
    ready(cfg)
    reused = reused_output(b, cfg)
    if reused is not None:  # another's output: only read, as an output entry
        echo(f"[cnsbench] card: {b.name}: using the existing output {reused} (the same benchmark as {b.config})")
        return _prepare_existing(replace(b, kind="output", output=reused), model, baseline, runner, echo, ready, report,
                                 own, refine)
    store = OutputStore(b.output)
    marker = forget_stale(b.output, echo)
    check_model_weights(b.output, marker, model)
    raw, _ = with_model(_kept_classifiers(resolved_dict(cfg), marker), model, None, f"{b.where} {b.config}")
    cfg = holding(parse_config(raw, source=f"{b.config} with the card's model {model.name}"), model)
    work = "none"
    if needs_build(store, cfg, marker, report=report):
        echo(f"[cnsbench] card: {b.name}: building {b.output} ({b.config}) with {model.name}")
        summary = build(cfg, b.output, runner=runner, echo=echo, aggregate=report or marker is None)
        if summary.trajectories_failed:
            echo(f"[cnsbench] card: {b.name}: {summary.trajectories_failed} trajectories failed (left out of the metrics)")
        work = "built"
    return _prepared(b, b.output, cfg, model, None, work)


def _prepared(b: Benchmark, uri: str, cfg: BuildConfig, model: ClassifierSpec, kind: str | None, work: str) -> Prepared:
    spec = next(c for c in cfg.classifiers if c.name == model.name)
    return Prepared(b, uri, cfg, config_hash(cfg), spec, protocol_of_output(cfg, kind), work)


def _baseline_entries(cfg: BuildConfig, b: Benchmark, baseline: str | None) -> list[dict[str, Any]]:
    """The corruption baseline's entry of a release's (or a benchmark's) config, with only the keys it sets."""
    if b.family != "corruptions" or baseline in (None, ALEXNET):
        return []
    found = [c.model_dump(mode="json", exclude_unset=True) for c in cfg.classifiers if c.name == baseline]
    if not found:
        raise ConfigError(f"{b.where}: the suite's baseline {baseline!r} is not a classifier of "
                          f"{b.config if b.kind == 'release' else b.output + '/config.json'}")
    return found


def _first_evaluation(b: Benchmark, uri: str, model: ClassifierSpec, baseline: str | None, runner: str, echo: Echo,
                      ready: Callable) -> None:
    """The first evaluation into ``uri``: the model (and the corruption baseline) on the
    release's images under its protocol, or on a built benchmark's images by its own filter
    decisions (:func:`_images_of`)."""
    from pipeline.evaluate import effective_config, evaluate

    base, source, use_filter = _images_of(b, ready)
    raw = resolved_dict(base)
    where = b.config if b.kind == "release" else f"{b.output}/config.json"
    raw["classifiers"] = _baseline_entries(base, b, baseline)
    if b.kind == "release":
        # Each entry with only the keys it sets, as in a config file: the release's protocol fills
        # the rest (an entry that sets its own transform keeps it, with evaluate's warning).
        raw["classifiers"].append(model.model_dump(mode="json", exclude_unset=True))
    else:  # a benchmark's entries are resolved; the model's gets the protocol of the release it was made from
        raw, _ = with_model(raw, model, release_kind(OutputStore(b.output)), f"{b.where} {b.output}")
    if raw["classifiers"][:-1]:  # the report's corruption errors normalised by the suite's baseline, as the card's
        others = [a for a in raw["aggregate"]["analyses"] if (a if isinstance(a, str) else a.get("name")) != "corruption_error"]
        raw["aggregate"]["analyses"] = [*others, {"name": "corruption_error", "baseline": baseline}]
    cfg = holding(parse_config(raw, source=f"{where} with the card's model {model.name}"), model)
    eff = holding(effective_config(cfg, source, use_filter=use_filter), model)
    echo(f"[cnsbench] card: {b.name}: evaluating {source.location} into {uri} with {model.name}")
    evaluate(eff, source, uri, runner=runner, echo=echo)


def _images_of(b: Benchmark, ready: Callable) -> tuple[BuildConfig, Any, bool]:
    """The config, image source and filter choice of an evaluation of ``b``'s images: a
    release's (its entry's config, layout and ``filter``), or a built benchmark's (its own
    config; its own keep decisions, so a classifier's numbers are its report's)."""
    from pipeline.aggregate.run import load_output_config
    from pipeline.sources import open_source

    if b.kind == "release":
        base = b.load_config()
        ready(base)
        return base, open_source(b.release, base.benchmark.label_space, kind=b.entry.source_kind), b.entry.filter
    base = load_output_config(OutputStore(b.output))
    ready(base)
    return base, open_source(b.output, base.benchmark.label_space), False


def _resume_evaluation(b: Benchmark, uri: str, stored: BuildConfig, model: ClassifierSpec, runner: str, echo: Echo,
                       ready: Callable) -> None:
    """Finish an interrupted evaluation into ``uri`` with the config it started with."""
    from pipeline.evaluate import evaluate

    _, source, _ = _images_of(b, ready)
    echo(f"[cnsbench] card: {b.name}: resuming the evaluation of {source.location}")
    evaluate(holding(stored, model), source, uri, runner=runner, echo=echo)


def _holds(b: Benchmark, model: ClassifierSpec) -> Prepared | None:
    """An output entry that already holds the model (the same entry, the same weights, its
    predictions on every committed shard): read as it is.  None when it does not."""
    from pipeline.aggregate.run import load_output_config
    from pipeline.assets.weights import WeightsChanged
    from pipeline.stages.reclassify import missing_classifiers

    store = OutputStore(b.output)
    marker = read_marker(store)
    if marker is None:
        raise FileNotFoundError(f"{b.where}: output {b.output} not found (no config.json): is it a cnsbench output?")
    stored = load_output_config(store)
    if model.name not in {c.name for c in stored.classifiers}:
        return None
    kind = release_kind(store)
    try:
        _, new = with_model(resolved_dict(stored), model, kind, f"{b.where} {b.output}")
        check_model_weights(b.output, marker, model)
    except (ModelConflict, WeightsChanged):  # another model of that name: the card's own output scores this one
        return None
    built_with = [c["name"] for c in marker["config"].get("classifiers", [])]
    if new or missing_classifiers(store, [model.name], built_with):
        return None
    return _prepared(b, b.output, holding(stored, model), model, kind, "none")


def _prepare_existing(
    b: Benchmark, model: ClassifierSpec, baseline: str | None, runner: str, echo: Echo, ready: Callable, report: bool,
    own: str | None, refine: bool,
) -> Prepared:
    """A release entry (evaluated once into its output, then the model added), or an output
    entry: only read; a model it does not hold is evaluated into the card's own output ``own``
    the same way, which refers to the benchmark's images."""
    from pipeline.aggregate.run import load_output_config

    uri = b.output
    if b.kind == "output":
        read = None if refine else _holds(b, model)  # refining writes: into the card's own output
        if read is not None:
            return read
        if own is None:
            raise CnsbenchError(f"{b.where}: the card has no folder of its own for {model.name}'s predictions")
        uri = own
    store = OutputStore(uri)
    marker = read_marker(store)
    work = "none"
    if marker is None:
        _first_evaluation(b, uri, model, baseline, runner, echo, ready)
        work = "evaluated"
    stored = load_output_config(store)
    if _report_hash(store) != config_hash(stored):
        _resume_evaluation(b, uri, stored, model, runner, echo, ready)
        work = "evaluated"
    if forget_stale(uri, echo) != marker:
        stored = load_output_config(store)
    check_model_weights(uri, read_marker(store), model)
    kind = release_kind(store if b.kind == "release" else OutputStore(b.output))  # the images' release, if any
    raw, new = with_model(resolved_dict(stored), model, kind, f"{b.where} {uri}")
    cfg = parse_config(raw, source=f"{uri}/config.json with the card's model {model.name}") if new else stored
    cfg = holding(cfg, model)
    if new:
        echo(f"[cnsbench] card: {b.name}: adding {model.name} to {uri}")
        add_to_output(uri, cfg, runner=runner, echo=echo, report=report)
        work = "added"
    elif needs_build(store, cfg, read_marker(store), planned=False, report=report):
        add_to_output(uri, cfg, runner=runner, echo=echo, report=report)  # an interrupted addition or report
        work = "added"
    return _prepared(b, uri, cfg, model, kind, work)


def prepare(
    b: Benchmark,
    model: ClassifierSpec,
    *,
    baseline: str | None = None,
    runner: str = "ray",
    echo: Echo = print,
    ready: Callable[[BuildConfig], None] = lambda cfg: None,
    report: bool = True,
    own: str | None = None,
    refine: bool = False,
) -> Prepared:
    """The output of ``b`` holding ``model`` (see the module doc); ``ready`` prepares a
    config's generated assets before it is built; without ``report`` an output the model is
    added to keeps its report as it was (``cnsbench aggregate`` brings it up to date).
    ``own``: the card's own evaluation output for an output entry; ``refine``: the model's
    failure points will be refined (an output entry's benchmark is then not read as it is)."""
    if b.kind == "build":
        return _prepare_build(b, model, baseline, runner, echo, ready, report, own, refine)
    return _prepare_existing(b, model, baseline, runner, echo, ready, report, own, refine)
