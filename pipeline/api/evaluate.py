"""``cnsbench.evaluate`` and ``cnsbench evaluate``: classifiers scored on a benchmark or on images.

``evaluate(classifiers, source, *, output, ...)``: what is scored, where from, then where the
results go.  ``classifiers`` is a classifier name of the config (or a comma list, or a list of
names; None: all of them), a classifier entry (a dict, as in a config file), or a model held in
memory (an ``nn.Module`` or callable, with ``name`` and ``preprocess``).  ``source`` is a built
benchmark or existing images in any layout :mod:`pipeline.sources` reads.

The predictions and their report go to ``output``; ``source`` is only read.  A built benchmark
is evaluated on the images it kept, by its own filter's decisions
(:mod:`pipeline.sources.webdataset`), so a classifier's numbers equal those of the benchmark's
own report; ``filter=True`` runs the filter again instead.  Adding to the benchmark itself
stays possible by saying so: ``output`` equal to ``source`` with ``in_place=True``.

Everything is checked before anything is written.  The command parses its arguments and calls
this function (:mod:`pipeline.cli.evaluate`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Sequence

from pipeline.api.common import check_runner, path_arg, user_errors
from pipeline.errors import CnsbenchError

if TYPE_CHECKING:
    from pipeline.config import BuildConfig, ClassifierSpec
    from pipeline.output_run import BuildSummary

Echo = Callable[[str], None]


def evaluate(
    classifiers: Any,
    source: str | os.PathLike[str],
    *,
    output: str | os.PathLike[str],
    in_place: bool = False,
    name: str | None = None,
    preprocess: Any = None,
    label_map: dict[int, int] | None = None,
    config: str | os.PathLike[str] | None = None,
    sets: Sequence[str] = (),
    filter: bool = False,  # noqa: A002 (the command's --filter)
    filter_thresholds: str | None = None,
    source_kind: str | None = None,
    source_labels: str | None = None,
    follow_symlinks: bool = False,
    batch_size: int | None = None,
    runner: str = "local",
    address: str | None = None,
    echo: Echo = print,
) -> "BuildSummary":
    """Score ``classifiers`` on ``source``'s images into ``output`` and return the run's summary
    (``.lines()``; the numbers: ``cnsbench.open_output(output).metrics()``).

    ``name``, ``preprocess``, ``label_map``: a model held in memory's name, input transform
    (``'cns'`` or resize, crop, interpolation, mean, std) and output index -> class id.
    ``config`` (with ``sets``): the config supplying classifiers, filter and resources (default:
    a built benchmark's own).  ``filter``: run the out-of-class filter again (default: a built
    benchmark's own decisions; other images are all kept).  ``source_kind``,
    ``source_labels`` (class folders: a JSON file {folder: class id}), ``follow_symlinks``:
    how the images are read.  ``runner``: ``local`` (this process) or ``ray``."""

    where, dest = path_arg(source, "source"), path_arg(output, "output")
    with user_errors():
        check_runner(runner)
        same = _same_place(where, dest)
        if same and not in_place:
            raise CnsbenchError(f"--output {dest} is the source itself: evaluate writes its results to another output; "
                                "pass --in-place to add the classifiers to the source")
        if in_place and not same:
            raise CnsbenchError(f"--in-place adds to the source, but --output {dest} is not the source {where}")
        if not same and _inside(dest, where):
            raise CnsbenchError(f"--output {dest} lies inside the source {where}: the source is only read; "
                                "give an output outside it")
        base = _base_config(where, config, sets, filter_thresholds)
        named = base if config is not None else with_referenced(where, base)
        chosen, held = _classifiers(classifiers, named, name=name, preprocess=preprocess, label_map=label_map)
        if in_place:  # the entries chosen (from config= too) join the benchmark's own config
            own = source_config(where) if config is not None else base
            if own is None:
                raise CnsbenchError(f"--in-place adds to a built benchmark; {where} is none (no config.json)")
            return _in_place(where, own, chosen, held, batch_size=batch_size, runner=runner, echo=echo)
        return _into_output(where, dest, base, chosen, held, use_filter=filter, source_kind=source_kind,
                            source_labels=source_labels, follow_symlinks=follow_symlinks, batch_size=batch_size,
                            runner=runner, address=address, echo=echo)


def _uri(location: str) -> str:
    from pipeline.io.store import OutputStore

    return OutputStore(location).uri.rstrip("/")


def _same_place(a: str, b: str) -> bool:
    ua, ub = _uri(a), _uri(b)
    if ua == ub:
        return True
    return "://" not in ua and "://" not in ub and os.path.exists(ua) and os.path.exists(ub) and os.path.samefile(ua, ub)


def _inside(dest: str, source: str) -> bool:
    d, s = _uri(dest), _uri(source)
    if "://" not in d and "://" not in s:
        d, s = os.path.realpath(d), os.path.realpath(s)
    return d.startswith(s.rstrip("/") + "/")


def _base_config(source: str, config: Any, sets: Sequence[str], filter_thresholds: str | None) -> "BuildConfig":
    """The config file's (with ``sets``), or a built benchmark's own config."""
    from pipeline.config import deep_merge, parse_config, resolved_dict
    from pipeline.config.overrides import apply_overrides

    overrides = None
    if filter_thresholds:  # a `cnsbench calibrate-filter` result
        from pipeline.models.calibrate import threshold_overrides

        overrides = threshold_overrides(filter_thresholds)
    if config is not None:
        from pipeline.api.common import load_config_file

        return load_config_file(config, sets, overrides)
    cfg = source_config(source)
    if cfg is None:
        raise CnsbenchError(f"evaluate: {source} is no built benchmark (no config.json): pass --config CONFIG, "
                            "which supplies the classifiers, filter and resources")
    if overrides or sets:
        raw = apply_overrides(deep_merge(resolved_dict(cfg), overrides or {}), list(sets))
        cfg = parse_config(raw, source=f"{source}/config.json")
    return cfg


def with_referenced(location: str, cfg: "BuildConfig") -> "BuildConfig":
    """``cfg`` (an evaluation output's) with the classifiers of the benchmark whose images it
    refers to that it lacks, so a name of that benchmark's config can be chosen; else ``cfg``."""
    from pipeline.aggregate.run import load_output_config
    from pipeline.io.image_refs import referenced
    from pipeline.io.store import OutputStore

    bench = referenced(OutputStore(location))
    if bench is None:
        return cfg
    have = {c.name for c in cfg.classifiers}
    extra = [c for c in load_output_config(bench).classifiers if c.name not in have]
    return cfg.model_copy(update={"classifiers": [*cfg.classifiers, *extra]}) if extra else cfg


def source_config(location: str) -> "BuildConfig | None":
    """The config a built benchmark was made with, None for other images."""
    from pipeline.aggregate.run import load_output_config
    from pipeline.io.store import OutputStore

    store = OutputStore(location)
    return load_output_config(store) if store.exists("config.json") else None


def _classifiers(classifiers: Any, base: "BuildConfig", *, name: str | None, preprocess: Any,
                 label_map: dict[int, int] | None) -> tuple[list["ClassifierSpec"], dict[str, Any]]:
    """The entries to score, and the models they hold in memory by name."""
    from pipeline.api.models import held_entry
    from pipeline.config import ClassifierSpec
    from pipeline.evaluate import select_classifiers

    if classifiers is None or isinstance(classifiers, (str, list, tuple)):
        names = [n.strip() for n in classifiers.split(",") if n.strip()] if isinstance(classifiers, str) else classifiers
        if names is not None and not all(isinstance(n, str) for n in names):
            raise CnsbenchError("classifiers: a list holds classifier names (str) only")
        if name is not None or preprocess is not None or label_map is not None:
            raise CnsbenchError("name=, preprocess= and label_map= describe a model held in memory; configured "
                                "classifiers are named by their entries")
        try:
            specs = select_classifiers(base, list(names) if names else None)
        except CnsbenchError as err:
            raise CnsbenchError(str(err).replace("--classifiers:", "classifiers:")) from None
        # The config's own entries: the keys each one set stay its own (a released layout's
        # protocol fills the rest, pipeline.sources.release_protocol)
        entries = {c.name: c for c in base.classifiers}
        return [entries[s["name"]] for s in specs], {}
    if isinstance(classifiers, dict):
        from pydantic import ValidationError

        try:
            spec = ClassifierSpec.model_validate(classifiers)
        except ValidationError as err:
            detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<entry>'}: {e['msg']}" for e in err.errors())
            raise CnsbenchError(f"classifiers (an entry): {detail}"[:900]) from None
        return [spec], {}
    spec = held_entry(classifiers, name=name, preprocess=preprocess, label_map=label_map,
                      where="in the output and the report")
    return [spec], {spec.name: classifiers}


def _in_place(where: str, base: "BuildConfig", chosen: list["ClassifierSpec"], held: dict[str, Any], *,
              batch_size: int | None, runner: str, echo: Echo) -> "BuildSummary":
    """Add the classifiers to the benchmark itself (the one driver, :func:`pipeline.evaluate.add_classifiers`)."""
    from pipeline.api.models import check_held, check_same_weights, with_entry
    from pipeline.evaluate import add_classifiers

    cfg = base
    for spec in chosen:
        if spec.held is not None:
            check_held(spec, cfg, runner)
            check_same_weights(where, spec)
        cfg = with_entry(cfg, spec, batch_size)
    return add_classifiers(where, cfg, command="evaluate", runner=runner, echo=echo)


def _into_output(where: str, dest: str, base: "BuildConfig", chosen: list["ClassifierSpec"], held: dict[str, Any], *,
                 use_filter: bool, source_kind: str | None, source_labels: str | None, follow_symlinks: bool,
                 batch_size: int | None, runner: str, address: str | None, echo: Echo) -> "BuildSummary":
    """Read the source's images, score them, and write predictions and report to ``dest``."""
    from pipeline.api.models import check_held
    from pipeline.config import parse_config
    from pipeline.evaluate import attach_held, effective_config
    from pipeline.evaluate import evaluate as run_evaluate
    from pipeline.sources import open_source

    for spec in chosen:
        if spec.held is not None:
            check_held(spec, base, runner)
    # Only the keys the config set: a released layout fills the rest (its label space, its
    # protocol's inputs: effective_config), as it does for a config read from its file.
    raw = base.model_dump(mode="json", exclude_unset=True)
    raw["classifiers"] = [s.model_dump(mode="json", exclude_unset=True) for s in chosen]
    if batch_size is not None:
        raw.setdefault("resources", {}).setdefault("classify", {})["batch_size"] = batch_size
    cfg = attach_held(parse_config(raw, source=f"the config of {where} with the classifiers to score"), held)
    images = open_source(where, cfg.benchmark.label_space, kind=source_kind, label_map=source_labels,
                         follow_symlinks=follow_symlinks)
    eff = attach_held(effective_config(cfg, images, use_filter=use_filter), held)
    return run_evaluate(eff, images, dest, runner=runner, address=address, echo=echo)
