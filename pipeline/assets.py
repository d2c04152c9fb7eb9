"""Up-front checks of everything a build will load, before any model or GPU is touched.

``missing_assets`` lists every missing file at once (model directory, class tokens,
each (class, shift) slider, detector and classifier weights), so a user fixes them in
one round instead of discovering them one crash at a time.
"""

from __future__ import annotations

import os
from typing import Iterable

import fsspec

from pipeline.config import BuildConfig
from pipeline.models.diffusion import class_token_files, is_local_path, slider_path
from pipeline.registry import CLASSIFIERS, FAMILIES, FILTERS, MASKS, SOURCES


class AssetError(FileNotFoundError):
    """One or more files a build needs are missing; the message lists all of them."""


def _exists(path: str) -> bool:
    if "://" in path:
        fs, p = fsspec.core.url_to_fs(path)
        return fs.exists(p)
    return os.path.exists(path)


def _local_file_ref(value: str | None) -> bool:
    """open_clip ``pretrained`` / timm checkpoints may be tags; treat path-like values as files."""
    return bool(value) and ("/" in value or value.endswith((".pt", ".pth", ".bin", ".safetensors")))


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
            if value and (_local_file_ref(value) or key.endswith("model_config_file")) and not _exists(value):
                missing.append(f"{key}: {value}")
    for i, clf in enumerate(cfg.classifiers):
        for key in ("checkpoint", "model_config_file"):
            value = getattr(clf, key)
            if value and (_local_file_ref(value) or key == "model_config_file") and not _exists(value):
                missing.append(f"classifiers[{i}] ({clf.name}).{key}: {value}")
        if isinstance(clf.label_map, str) and not _exists(clf.label_map):
            missing.append(f"classifiers[{i}] ({clf.name}).label_map: {clf.label_map}")
    return missing


def missing_sliders(cfg: BuildConfig, pairs: Iterable[tuple[int, str]]) -> list[str]:
    """Missing slider files of the (class id, shift) pairs (family ``slider``)."""
    gen = cfg.generator
    if not gen.slider_store:
        return ["generator.slider_store: not set (the slider family needs one slider per class/shift)"]
    missing = []
    for class_id, shift in sorted(set(pairs)):
        p = slider_path(gen, class_id, shift, cfg.benchmark.class_name(class_id))
        if not _exists(p):
            missing.append(f"generator.slider_store: missing slider for class {class_id}, shift {shift}: {p}")
    return missing


def check_registry_keys(cfg: BuildConfig) -> list[str]:
    """Unknown generator/filter/classifier kinds, unknown timm model names, and the
    combinations the evaluation protocol refuses (:func:`pipeline.protocol.problems`)."""
    from pipeline.protocol import problems as protocol_problems

    problems = protocol_problems(cfg)
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
        if clf.kind == "torch_hub":
            from pipeline.models.classifiers import parse_hub_model

            try:
                parse_hub_model(clf.model, f"classifiers[{i}] ({clf.name})")
            except ValueError as err:
                problems.append(str(err))
        if clf.kind == "timm":
            from pipeline.models.classifiers import timm_name_problem

            problem = timm_name_problem(clf.model, local_weights=bool(clf.checkpoint))
            if problem:
                problems.append(f"classifiers[{i}] ({clf.name}).model: {problem}")
    problems.extend(analysis_option_problems(cfg))
    return problems


def analysis_option_problems(cfg: BuildConfig) -> list[str]:
    """Unknown analyses, and what an analysis module's ``check_options(options, cfg)`` finds wrong."""
    import importlib

    from pipeline.aggregate.run import analysis_plan
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


def check_build(cfg: BuildConfig, pairs: Iterable[tuple[int, str]] | None = None) -> None:
    """Raise :class:`AssetError` listing every problem, or return if the build can start."""
    problems = check_registry_keys(cfg) + missing_assets(cfg, pairs)
    if problems:
        raise AssetError(
            f"{len(problems)} problem(s) before the build could start:\n" + "\n".join(f"  - {p}" for p in problems)
        )


# --------------------------------------------------------------------------- hub weights
def _hf_cached(repo_id: str, filenames: Iterable[str]) -> bool:
    from huggingface_hub import try_to_load_from_cache

    for name in filenames:
        try:
            hit = try_to_load_from_cache(repo_id, name)
        except Exception:  # a malformed id: not something this check can decide
            return True
        if isinstance(hit, str):
            return True
    return False


_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "open_clip_model.safetensors", "open_clip_pytorch_model.bin")


def _timm_cached(name: str) -> bool:
    from timm.models import get_pretrained_cfg

    try:
        pcfg = get_pretrained_cfg(name)
    except Exception:
        pcfg = None
    if pcfg is None:
        return True  # unknown tag: check_registry_keys reports it
    if pcfg.hf_hub_id:
        return _hf_cached(pcfg.hf_hub_id, _WEIGHT_FILES)
    if pcfg.url:
        import torch.hub

        return os.path.isfile(os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(pcfg.url)))
    return True


def _open_clip_cached(model: str, tag: str) -> bool:
    from open_clip.pretrained import get_pretrained_cfg

    pcfg = get_pretrained_cfg(model, tag) or {}
    hub = pcfg.get("hf_hub")
    if hub:  # "org/repo/" or "org/repo/filename"
        parts = hub.strip("/").split("/")
        names = ["/".join(parts[2:])] if len(parts) > 2 else []
        return _hf_cached("/".join(parts[:2]), (*names, *_WEIGHT_FILES))
    return True


def _torch_hub_cached(repo: str) -> bool:
    import glob

    import torch.hub

    owner_name = repo.split(":", 1)[0].replace("/", "_")
    return bool(glob.glob(os.path.join(torch.hub.get_dir(), f"{owner_name}_*")))


def remote_weights_not_cached(cfg: BuildConfig) -> list[str]:
    """Weights the config names by hub id (SD2, timm and open_clip tags, torch hub entry points)
    that are not in this machine's caches, one line each.

    Informational: a build downloads them on first use (on a cluster, into the image's
    model cache); offline, such a build would fail when the model loads.
    """
    out: list[str] = []
    gen = cfg.generator
    families = [FAMILIES.get(g.kind) for g in cfg.family_groups()]
    uses_model = any(f.generates_base for f in families) or cfg.source.kind == "seed"
    if uses_model and not is_local_path(gen.model) and not _hf_cached(gen.model, ("model_index.json",)):
        out.append(f"generator.model: {gen.model} (Hugging Face hub)")
    flt = cfg.filter
    if flt.enabled and flt.kind != "none":
        clip_tag = flt.clip.pretrained
        if clip_tag and not _local_file_ref(clip_tag) and not _open_clip_cached(flt.clip.model, clip_tag):
            out.append(f"filter.clip: open_clip {flt.clip.model} pretrained={clip_tag}")
        if not flt.dino.checkpoint and not _timm_cached(flt.dino.model):
            out.append(f"filter.dino: timm {flt.dino.model}")
    for i, clf in enumerate(cfg.classifiers):
        where = f"classifiers[{i}] ({clf.name})"
        if clf.kind == "timm" and not clf.checkpoint and not _timm_cached(clf.model):
            out.append(f"{where}: timm {clf.model}")
        elif clf.kind == "open_clip_zeroshot" and clf.checkpoint and not _local_file_ref(clf.checkpoint):
            if not _open_clip_cached(clf.model, clf.checkpoint):
                out.append(f"{where}: open_clip {clf.model} pretrained={clf.checkpoint}")
        elif clf.kind == "torch_hub":
            repo = clf.model.rpartition(":")[0]
            if repo and not os.path.isdir(repo) and not _torch_hub_cached(repo):
                out.append(f"{where}: torch hub {clf.model}")
    return out
