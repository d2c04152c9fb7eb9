"""A suite: the benchmarks a robustness card covers, read from a YAML file.

::

    suite: world                     # the suite's name
    baseline: linear                 # mCE's reference: a classifier of the corruption output, or alexnet
    outputs: ../runs/suite_world     # where benchmarks without an `output` are built / evaluated
    benchmarks:
      - {name: cns, family: cns, config: demo.yaml}                  # a build config, built when missing
      - {name: cns-old, family: cns, output: /data/runs/cns}         # an existing output, used as it is
      - {name: small, family: cns, config: demo.yaml, sets: [benchmark.seeds=[1]]}   # --set overrides
      - {name: imagenet-c, family: corruptions, release: /data/ImageNet-C,   # a released tree,
         source_kind: imagenet_c, protocol: imagenet_c, config: cns_bench.yaml}  # evaluated once

Each entry names its ``family``, which decides the headline metrics of its card entry: a
card benchmark that a registered shift family declares (``Family.headline``, a
:class:`~pipeline.families.base.CardHeadline`: ``cns`` from slider and prompt, ``corruptions``,
``imagenet_d``, ``ximagenet``, ``imagenet_e``; :func:`card_benchmarks`), whose function
computes them (:mod:`pipeline.card.headline`), and exactly one of three kinds:

* ``config`` (no ``release``): a build config, built into ``output`` when that is missing or
  incomplete (``cnsbench build``), then reused;
* ``output`` alone: an existing build or evaluate output, never rebuilt;
* ``release``: a released dataset, evaluated once into ``output`` with the ``config``'s
  filter, resources and label space (``cnsbench evaluate``) under its authors' protocol
  (``protocol`` names it and is checked against the layout's,
  :mod:`pipeline.sources.release_protocol`).

Relative paths are relative to the suite file.  The suite's hash covers what the suite
says (names, families, configs as written, protocols, the baseline), not where its
outputs or releases lie: a card records each output's own identity beside it.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pydantic import Field, ValidationError, field_validator, model_validator

from pipeline.config import BuildConfig, ConfigError, resolved_dict
from pipeline.config.base import Strict
from pipeline.errors import CnsbenchError
from pipeline.io import bounds

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.families.base import CardHeadline

ALEXNET = "alexnet"  # the corruption baseline of ImageNet-C: AlexNet's published errors
NAME = r"^[A-Za-z0-9_\-]+$"


def card_benchmarks() -> dict[str, "CardHeadline"]:
    """The card benchmarks, by name, that the registered shift families declare
    (``Family.headline``; pipeline.registry.FAMILIES).  A suite entry's ``family`` is one of
    them: one paper's benchmark, not a shift family (the CNS entry's output may hold slider,
    prompt or corruption families alike).  Families sharing a benchmark declare the same;
    :class:`~pipeline.registry.PluginError` naming both otherwise.  Loading the families imports
    no torch."""
    from pipeline.registry import FAMILIES, PluginError

    found: dict[str, tuple[str, CardHeadline]] = {}
    for kind in FAMILIES.keys():
        declared = FAMILIES.get(kind).headline
        if declared is None:
            continue
        first, known = found.setdefault(declared.benchmark, (kind, declared))
        if known != declared:
            raise PluginError(f"families {first!r} and {kind!r} declare card benchmark {declared.benchmark!r} "
                              f"differently: {known} and {declared}")
    return {name: h for name, (_, h) in found.items()}


def headline_function(benchmark: str) -> Callable[[Any], Any]:
    """The function computing ``benchmark``'s headline metrics (its family's ``CardHeadline.function``)."""
    module, _, attr = card_benchmarks()[benchmark].function.partition(":")
    return getattr(importlib.import_module(module), attr)


class BenchmarkEntry(Strict):
    name: str = Field(..., pattern=NAME, description="the benchmark's name on the card")
    family: str = Field(
        ..., description="whose headline metrics the card shows: a card benchmark of a registered family "
        "(cns, corruptions, imagenet_d, ximagenet, imagenet_e; card_benchmarks)"
    )
    config: str | None = Field(None, min_length=1, description="build config; with release: the evaluate config")
    output: str | None = Field(None, min_length=1, description="the benchmark's output (default: <outputs>/<name>)")
    release: str | None = Field(None, min_length=1, description="a released dataset, evaluated once into the output")
    source_kind: str | None = Field(None, description="release: its layout (default: detected)")
    protocol: str | None = Field(None, description="the protocol the benchmark is evaluated with (checked)")
    filter: bool = Field(False, description="release: run the config's OOC filter too")
    sets: list[str] = Field(default_factory=list, description="`--set key.path=value` overrides of the config")
    reuse: list[str] = Field(
        default_factory=list,
        description="build entry: existing outputs used instead of building when `output` holds none yet, the first "
        "whose benchmark equals the config's (config without classifiers, resources and location)",
    )

    @field_validator("family")
    @classmethod
    def _family(cls, value: str) -> str:
        known = card_benchmarks()
        if value not in known:
            raise CnsbenchError(f"unknown card benchmark {value!r}; one of {', '.join(known)} (the registered "
                             "families' headlines)")
        return value

    @model_validator(mode="after")
    def _kind(self) -> "BenchmarkEntry":
        if self.release is not None:
            if not self.config:
                raise CnsbenchError("a release entry needs `config` (the evaluate config: label space, resources)")
        elif not (self.config or self.output):
            raise CnsbenchError("give `config` (a build config), `output` (an existing output) or `release`")
        elif self.source_kind is not None or self.filter:
            raise CnsbenchError("`source_kind` and `filter` belong to release entries")
        if self.reuse and (self.release is not None or not self.config):
            raise CnsbenchError("`reuse` belongs to build entries (a `config` without `release`)")
        return self


class SuiteSpec(Strict):
    suite: str = Field(..., pattern=NAME, description="the suite's name")
    description: str = ""
    baseline: str | None = Field(None, description="mCE's reference classifier (a name) or alexnet")
    outputs: str | None = Field(None, min_length=1, description="folder of the outputs of entries without `output`")
    benchmarks: list[BenchmarkEntry] = Field(..., min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> "SuiteSpec":
        names = [b.name for b in self.benchmarks]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise CnsbenchError(f"benchmark names repeat: {twice}")
        return self


@dataclass(frozen=True)
class Benchmark:
    """One entry with its paths resolved: ``kind`` is ``build``, ``output`` or ``release``;
    ``reuse``: the existing outputs a build entry may use instead of building (none when the
    card names its own ``--outputs`` folder)."""

    index: int
    entry: BenchmarkEntry
    kind: str
    config: str | None
    output: str
    release: str | None
    reuse: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def family(self) -> str:
        return self.entry.family

    @property
    def where(self) -> str:
        return f"benchmarks[{self.index}] ({self.name})"

    def load_config(self) -> Any:
        """The entry's config with its ``sets`` applied (ConfigError naming what is wrong)."""
        from pipeline.config import load_config

        if self.config is None:
            raise ConfigError(f"{self.where}: no config")
        return load_config(self.config, sets=self.entry.sets or None)


@dataclass(frozen=True)
class Suite:
    path: str
    spec: SuiteSpec
    benchmarks: tuple[Benchmark, ...]
    hash: str

    @property
    def name(self) -> str:
        return self.spec.suite

    @property
    def baseline(self) -> str | None:
        return self.spec.baseline

    def describe(self) -> dict[str, Any]:
        """The suite as a card records it."""
        return {"name": self.name, "file": self.path, "hash": self.hash, "baseline": self.baseline,
                "benchmarks": [b.name for b in self.benchmarks]}


def _is_uri(value: str) -> bool:
    return "://" in value


def _resolve(value: str | None, base: Path) -> str | None:
    if value is None or _is_uri(value) or os.path.isabs(value):
        return value
    return str((base / value).resolve())


def _is_output(path: str) -> bool:
    """Whether ``path`` is an output (a folder or URI holding ``config.json``), not a suite file."""
    if _is_uri(path):
        from pipeline.io.store import OutputStore

        return OutputStore(path).exists("config.json")
    return Path(path).is_dir() and (Path(path) / "config.json").is_file()


def read_yaml(path: str | os.PathLike[str]) -> Any:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"suite file not found: {p}")
    try:
        return bounds.load_yaml(p)
    except (ValueError, OSError) as err:
        raise ConfigError(str(err)) from None


def is_suite_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a suite (a YAML mapping with ``suite`` and ``benchmarks``), not a config."""
    try:
        raw = read_yaml(path)
    except ConfigError:
        return False
    return isinstance(raw, dict) and "suite" in raw and "benchmarks" in raw


def suite_hash(spec: SuiteSpec) -> str:
    """SHA-256 of what the suite says, leaving out where its outputs and releases lie."""
    data = spec.model_dump(mode="json")
    data.pop("outputs", None)
    data.pop("description", None)
    for b in data["benchmarks"]:
        b.pop("output", None)
        b.pop("release", None)
        b.pop("reuse", None)  # where an output may already lie: not what the suite measures
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _format(err: ValidationError, source: str) -> str:
    lines = [f"invalid suite {source}:"]
    for e in err.errors():
        loc = [p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        key = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[") or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            model = BenchmarkEntry if "benchmarks" in loc[:1] else SuiteSpec
            msg = f"unknown key; allowed keys here: {', '.join(model.model_fields)}"
        value = e.get("input")
        shown = "" if e["type"] in ("missing", "extra_forbidden") or isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"  {key}: {msg}{shown}"[:400])
    return "\n".join(lines)


def output_suite(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The suite of one existing output (a folder holding ``config.json``): the quickest card,
    "this model on this output", its CNS headline metrics."""
    where = path if _is_uri(str(path)) else Path(path).resolve()
    return {"suite": "output", "description": f"the output {where}",
            "benchmarks": [{"name": "cns", "family": "cns", "output": str(where)}]}


def load_suite(path: str | os.PathLike[str], outputs: str | None = None) -> Suite:
    """Read and check a suite file (or make the one-entry suite of an output folder,
    :func:`output_suite`); ``outputs`` replaces its ``outputs`` folder.

    Raises :class:`ConfigError` naming the file and key of a malformed suite."""
    if outputs is not None and not outputs.strip():
        raise ConfigError("--outputs is empty: give the folder of the suite's outputs (or leave --outputs out)")
    is_output = _is_output(str(path))
    raw = output_suite(path) if is_output else read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"invalid suite {path}: the top level must be a mapping, got {type(raw).__name__}")
    try:
        spec = SuiteSpec.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format(err, str(path))) from None
    base = Path(path).resolve() if is_output else Path(path).resolve().parent
    folder = outputs if outputs is not None else _resolve(spec.outputs, base)
    benchmarks = []
    for i, entry in enumerate(spec.benchmarks):
        kind = "release" if entry.release is not None else ("build" if entry.config else "output")
        output = _resolve(entry.output, base) if entry.output else None
        if output is None:
            if folder is None:
                raise ConfigError(
                    f"invalid suite {path}: benchmarks[{i}] ({entry.name}) has no `output` and the suite no "
                    "`outputs` folder; set one of them (or pass --outputs DIR)"
                )
            output = folder.rstrip("/") + "/" + entry.name
        reuse = () if outputs is not None else tuple(str(_resolve(r, base)) for r in entry.reuse)
        benchmarks.append(Benchmark(i, entry, kind, _resolve(entry.config, base), output, _resolve(entry.release, base),
                                    reuse))
    return Suite(str(path) if _is_uri(str(path)) else str(Path(path).resolve()), spec, tuple(benchmarks), suite_hash(spec))


def benchmark_hash(cfg: BuildConfig) -> str:
    """SHA-256 of what defines a benchmark's images and metrics: the output's config
    without its classifiers, resources and location."""
    data = resolved_dict(cfg)
    for key in ("classifiers", "resources"):
        data.pop(key, None)
    data.get("output", {}).pop("path", None)
    analyses = []
    for a in data.get("aggregate", {}).get("analyses", []):
        if isinstance(a, dict):  # the release protocol's entry names every classifier's inputs
            a = {k: v for k, v in a.items() if k not in ("classifiers", "overridden")}
        analyses.append(a)
    if "aggregate" in data:
        data["aggregate"]["analyses"] = analyses
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()



SETTINGS = ("kind", "config", "sets", "release", "source_kind", "filter")  # what makes an output, per entry


def _settings(b: Benchmark) -> dict[str, Any]:
    e = b.entry
    return {"kind": b.kind, "config": b.config, "sets": list(e.sets), "release": b.release,
            "source_kind": e.source_kind, "filter": e.filter}


def _same_place(location: str) -> str:
    return location.rstrip("/") if _is_uri(location) else os.path.normpath(os.path.abspath(location))


def shared_output_problems(suite: Suite) -> list[str]:
    """Entries that share one output but would make it differently (another config, ``sets``,
    release, ...), each pair named with the settings that differ.  An ``output`` entry
    makes nothing, so it may share an output with any entry; entries with the same settings
    (one output measured by two families) share it by design."""
    problems = []
    makers = [b for b in suite.benchmarks if b.kind != "output"]
    for i, a in enumerate(makers):
        for b in makers[i + 1:]:
            if _same_place(a.output) != _same_place(b.output):
                continue
            sa, sb = _settings(a), _settings(b)
            differ = [k for k in SETTINGS if sa[k] != sb[k]]
            if differ:
                detail = "; ".join(f"{k}: {sa[k]!r} and {sb[k]!r}" for k in differ)
                problems.append(f"{a.where} and {b.where} share the output {a.output} with different settings "
                                f"({detail}): give one of them an `output` of its own")
    return problems
