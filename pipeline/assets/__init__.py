"""Up-front checks of everything a run will load, before any model or GPU is touched.

:func:`resolve_assets` reads a config once into an :class:`Assets`: the problems with the
names it uses (unknown kinds, refused combinations, analysis options), every missing file
(model directory, class tokens, each (class, shift) slider, detector and classifier weights,
what a family, source or mask provider needs; one line each, naming its config key), and
on demand the hub artefacts it names.  A user fixes them in one round instead of
discovering them one crash at a time.  ``build``, ``evaluate``, ``validate`` and ``serve``
all go through it.  Weights named by hub id are :mod:`pipeline.assets.hub`'s.
"""

from __future__ import annotations

import os
from typing import Iterable

from pipeline.assets.hub import (  # noqa: F401 (hub weights: pipeline.assets.hub)
    HubArtefact,
    hub_artefacts,
    hub_id_problems,
    local_file_ref,
    remote_weights_not_cached,
)
from pipeline.config import BuildConfig
from pipeline.errors import CnsbenchError
from pipeline.io.files import exists
from pipeline.models.diffusion import class_token_files, is_local_path
from pipeline.registry import CLASSIFIERS, FAMILIES, FILTERS, MASKS, SOURCES


class AssetError(FileNotFoundError, CnsbenchError):
    """One or more files a build needs are missing; the message lists all of them."""


def missing_assets(cfg: BuildConfig, shifts_by_class: Iterable[tuple[int, str]] | None = None) -> list[str]:
    """Human-readable lines, one per missing file, each naming the config key it came from."""
    missing: list[str] = []
    gen = cfg.generator
    families = [FAMILIES.get(g.kind) for g in cfg.family_groups()]
    uses_model = any(f.generates_base for f in families) or (
        cfg.source.kind == "seed" and not all(f.generates_base for f in families)
    )
    if uses_model and is_local_path(gen.model) and not os.path.isfile(os.path.join(gen.model, "model_index.json")):
        missing.append(f"generator.model: no diffusers model at {gen.model} (model_index.json missing)")
    for f in class_token_files(gen.class_tokens, list(cfg.benchmark.classes)) if uses_model else []:
        if not os.path.exists(f):
            missing.append(f"generator.class_tokens: {f}")
    for group in cfg.family_groups():
        family = FAMILIES.get(group.kind)
        pairs = shifts_by_class
        if pairs is None:
            pairs = [(c, s) for c in cfg.benchmark.classes for s in group.shifts]
        missing.extend(family.missing_files(cfg, group, [(c, s) for c, s in pairs if s in group.shifts]))
    missing.extend(SOURCES.get(cfg.source.kind).missing_files(cfg))
    missing.extend(MASKS.get(cfg.source.masks.kind).missing_files(cfg))
    flt = cfg.filter
    if flt.enabled and flt.kind != "none":
        for key, value in (
            ("filter.clip.pretrained", flt.clip.pretrained),
            ("filter.clip.model_config_file", flt.clip.model_config_file),
            ("filter.dino.checkpoint", flt.dino.checkpoint),
        ):
            if value and (local_file_ref(value) or key.endswith("model_config_file")) and not exists(value):
                missing.append(f"{key}: {value}")
    for i, clf in enumerate(cfg.classifiers):
        if clf.kind not in CLASSIFIERS.keys():
            continue  # the registry check names it
        for f in CLASSIFIERS.get(clf.kind).local_files(clf):
            # a checkpoint may be a pretrained tag, a vlm's model a hub id: files only when they look like paths
            if (f.or_hub_id or (f.key == "checkpoint" and not local_file_ref(f.path))):
                continue
            if not exists(f.path):
                missing.append(f"classifiers[{i}] ({clf.name}).{f.key}: {f.path}")
    return missing


def check_registry_keys(cfg: BuildConfig) -> list[str]:
    """Unknown generator/filter/classifier kinds, unknown timm model names, model references that
    are neither paths nor hub ids (:func:`pipeline.assets.hub.hub_id_problems`), and the
    combinations the evaluation protocol refuses (:func:`pipeline.config.protocol.problems`)."""
    from pipeline.config.protocol import problems as protocol_problems

    problems = protocol_problems(cfg) + hub_id_problems(cfg)
    for reg, key, where in (
        (FAMILIES, cfg.generator.kind, "generator.kind"),
        (FILTERS, cfg.filter.kind, "filter.kind"),
        (SOURCES, cfg.source.kind, "source.kind"),
        (MASKS, cfg.source.masks.kind, "source.masks.kind"),
    ):
        try:
            reg.check(key)
        except KeyError as err:
            problems.append(f"{where}: {err.args[0]}")
    for i, clf in enumerate(cfg.classifiers):
        try:
            CLASSIFIERS.check(clf.kind)
        except KeyError as err:
            problems.append(f"classifiers[{i}] ({clf.name}).kind: {err.args[0]}")
            continue
        problems.extend(CLASSIFIERS.get(clf.kind).problems(clf, f"classifiers[{i}] ({clf.name})"))
    problems.extend(analysis_option_problems(cfg))
    problems.extend(weight_file_problems(cfg))
    return problems


def weight_file_problems(cfg: BuildConfig) -> list[str]:
    """Classifier files that must not be read: a FIFO, device, socket or directory where the
    kind loads a file (:mod:`pipeline.io.regular`), and what the kind refuses in their content
    (``file_problems``: an ``exported`` archive holding pickles or compiled code)."""
    from pipeline.assets.weights import check_readable
    from pipeline.io.regular import NotRegularFile

    problems = []
    for i, clf in enumerate(cfg.classifiers):
        where = f"classifiers[{i}] ({clf.name})"
        if clf.kind not in CLASSIFIERS.keys():
            continue  # the registry check names it
        try:
            check_readable(clf)
        except NotRegularFile as err:
            problems.append(f"{where}: {err}")
            continue
        problems.extend(CLASSIFIERS.get(clf.kind).file_problems(clf, where))
    return problems


def analysis_option_problems(cfg: BuildConfig) -> list[str]:
    """Unknown analyses, and what an analysis module's ``check_options(options, cfg)`` finds wrong."""
    import importlib

    from pipeline.plan.analyses import analysis_plan
    from pipeline.registry import ANALYSES

    problems = []
    for name, options in analysis_plan(cfg):
        try:
            run = ANALYSES.get(name)
        except KeyError as err:
            problems.append(f"aggregate.analyses: {err.args[0]}")
            continue
        check = getattr(importlib.import_module(run.__module__), "check_options", None)
        if check is not None:
            problems.extend(f"aggregate.analyses[{name}]: {p}" for p in check(options, cfg))
    return problems


class Assets:
    """What a config's run loads, resolved once by :func:`resolve_assets`.

    ``problems``: the names the config uses that cannot work (registry keys, the protocol's
    refusals, analysis options); ``missing``: the files that are not there.  Each is a line
    that starts with the config key it came from.
    """

    def __init__(self, config: BuildConfig, problems: list[str], missing: list[str]) -> None:
        self.config = config
        self.problems = problems
        self.missing = missing

    def lines(self, without: tuple[str, ...] = ()) -> list[str]:
        """Every problem, then every missing file; ``without``: leave out lines of these config keys."""
        return [line for line in self.problems + self.missing if not line.startswith(without)]

    def hub(self) -> list[HubArtefact]:
        """The hub artefacts the config names, cached here or not (:func:`pipeline.assets.hub.hub_artefacts`)."""
        return hub_artefacts(self.config)

    def require(self, without: tuple[str, ...] = (), what: str = "the build") -> Assets:
        """Raise :class:`AssetError` listing every line (less ``without``'s), or return self."""
        lines = self.lines(without)
        if lines:
            raise AssetError(
                f"{len(lines)} problem(s) before {what} could start:\n" + "\n".join(f"  - {p}" for p in lines)
            )
        return self


def resolve_assets(cfg: BuildConfig, pairs: Iterable[tuple[int, str]] | None = None) -> Assets:
    """The :class:`Assets` of ``cfg``; ``pairs``: the (class id, shift) pairs the run makes (default all)."""
    return Assets(cfg, check_registry_keys(cfg), missing_assets(cfg, pairs))


def check_build(cfg: BuildConfig, pairs: Iterable[tuple[int, str]] | None = None) -> Assets:
    """The build's check: :func:`resolve_assets` and what only a build refuses
    (:func:`build_problems`), raising :class:`AssetError` unless everything is there."""
    assets = resolve_assets(cfg, pairs)
    assets.problems.extend(build_problems(cfg))
    return assets.require()


def build_problems(cfg: BuildConfig) -> list[str]:
    """What a config may hold for ``cnsbench evaluate`` of a release but not for a build."""
    from pipeline.config.vqa import questions_in_a_build

    return questions_in_a_build(cfg.classifiers)
