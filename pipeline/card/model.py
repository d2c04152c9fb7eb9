"""The model a card is about: its classifier entry and its identity.

A model is given as a classifier entry of a config (:class:`pipeline.config.ClassifierSpec`):

* a YAML file holding one entry (a mapping, or ``classifiers:`` with one item); its
  ``./`` and ``../`` paths are relative to the file, as in a config;
* inline: ``kind`` and ``model`` (``--model-kind``, ``--model``, and ``--checkpoint`` /
  ``--model-config-file`` for the kinds that load files);
* the name of a classifier that the suite's build configs define (``linear`` of the
  world), taken from the first of them that has it.

Its identity on a card (:func:`identity`) is the entry, the SHA-256 of the weights it loads
(local files; hub weights from the local cache when they are there, else named by their
hub id) and its own input transform as numbers where the kind states one
(:meth:`pipeline.models.classifiers.Classifier.own_preprocess`, or the transform stored in a
TorchScript / ``torch.export`` archive).  Nothing here loads weights.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from pipeline.config import ClassifierSpec, ConfigError
from pipeline.io import bounds

PATH_KEYS = ("checkpoint", "model_config_file", "label_map")
ARCHIVE_KINDS = ("torchscript", "exported")  # kinds whose archive stores the input transform


def _resolve_entry_paths(entry: dict[str, Any], base: Path) -> dict[str, Any]:
    out = dict(entry)
    keys = PATH_KEYS + (("model",) if out.get("kind") == "vlm" else ())
    for key in keys:
        value = out.get(key)
        if isinstance(value, str) and (value.startswith("./") or value.startswith("../")):
            out[key] = str((base / value).resolve())
    return out


def _spec(entry: dict[str, Any], where: str) -> ClassifierSpec:
    try:
        return ClassifierSpec.model_validate(entry)
    except ValidationError as err:
        detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<entry>'}: {e['msg']}" for e in err.errors())
        raise ConfigError(f"invalid model entry {where}: {detail}"[:800]) from None


def default_name(model: str) -> str:
    """A classifier name from a model string: its last path part, other characters as '-'."""
    base = model.rstrip("/").rsplit("/", 1)[-1]
    base = re.sub(r"\.(pt2|pt|pth|safetensors|bin)$", "", base)
    return re.sub(r"[^A-Za-z0-9_.\-]+", "-", base).strip("-") or "model"


def from_yaml(path: str) -> dict[str, Any]:
    """The one classifier entry of a YAML file."""
    p = Path(path)
    try:
        raw = bounds.load_yaml(p)
    except (ValueError, OSError) as err:
        raise ConfigError(str(err)) from None
    if isinstance(raw, dict) and "classifiers" in raw:
        items = raw["classifiers"]
        if not isinstance(items, list) or len(items) != 1:
            raise ConfigError(f"{path}: `classifiers` must hold exactly one entry (the card's model), got "
                              f"{len(items) if isinstance(items, list) else type(items).__name__}")
        raw = items[0]
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected one classifier entry (a mapping with kind, model, ...), got {type(raw).__name__}")
    return _resolve_entry_paths(raw, p.resolve().parent)


def suite_classifier(name: str, configs: list[Callable[[], Any]]) -> dict[str, Any] | None:
    """The entry named ``name`` in the first of the build configs (loaders) that defines it."""
    for load in configs:
        try:
            cfg = load()
        except (ConfigError, OSError, ValueError):  # a config or output that is not there: the card says so later
            continue
        for clf in cfg.classifiers:
            if clf.name == name:
                return clf.model_dump(mode="json", exclude_unset=True)
    return None


def resolve_model(
    model: str | None,
    *,
    kind: str | None = None,
    checkpoint: str | None = None,
    model_config_file: str | None = None,
    name: str | None = None,
    configs: list[Callable[[], Any]] = (),
) -> ClassifierSpec:
    """The card's model as a classifier entry (see the module doc); ``name`` renames it."""
    if not model:
        raise ConfigError("card: name the model (MODEL or --model): a YAML file with one classifier entry, "
                          "a model with --model-kind, or a classifier of the suite's configs")
    if kind is None and (checkpoint is not None or model_config_file is not None):
        raise ConfigError("card: --checkpoint and --model-config-file go with --model-kind")
    if kind is None and model.endswith((".yaml", ".yml")):
        if not os.path.isfile(model):
            raise FileNotFoundError(f"model file not found: {model}")
        entry, where = from_yaml(model), model
    elif kind is not None:
        entry = {"kind": kind, "model": model, "name": default_name(model)}
        for key, value in (("checkpoint", checkpoint), ("model_config_file", model_config_file)):
            if value is not None:
                entry[key] = str(Path(value).resolve()) if not value.startswith(("s3://", "gs://", "hf-hub:")) else value
        where = f"--model-kind {kind} --model {model}"
    else:
        entry = suite_classifier(model, list(configs))
        if entry is None:
            entry = {"kind": "timm", "model": model, "name": default_name(model)}
            where = f"--model {model} (kind timm)"
        else:
            where = f"classifier {model!r} of the suite's configs"
    if name:
        entry = {**entry, "name": name}
    entry.setdefault("name", default_name(str(entry.get("model", "model"))))
    return _spec(entry, where)


# --------------------------------------------------------------------------- identity
def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def path_sha256(path: str) -> str:
    """SHA-256 of a file, or of a directory's files (relative path and digest, sorted)."""
    if os.path.isfile(path):
        return file_sha256(path)
    h = hashlib.sha256()
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for f in sorted(files):
            full = os.path.join(root, f)
            h.update(f"{os.path.relpath(full, path)}\0{file_sha256(full)}\n".encode())
    return h.hexdigest()


def _hub_weights(spec: ClassifierSpec) -> tuple[str | None, str | None]:
    """(cached file, hub reference) of a timm model's pretrained weights."""
    if spec.kind != "timm" or spec.checkpoint:
        return None, None
    try:
        from huggingface_hub import try_to_load_from_cache
        from timm.models import get_pretrained_cfg

        pcfg = get_pretrained_cfg(spec.model)
    except Exception:
        return None, None
    if pcfg is None or not pcfg.hf_hub_id:
        return None, getattr(pcfg, "url", None) or None
    for fname in ("model.safetensors", "open_clip_model.safetensors", "pytorch_model.bin"):
        hit = try_to_load_from_cache(pcfg.hf_hub_id, fname)
        if isinstance(hit, str):
            return hit, f"hf-hub:{pcfg.hf_hub_id}"
    return None, f"hf-hub:{pcfg.hf_hub_id}"


def weights(spec: ClassifierSpec) -> list[dict[str, Any]]:
    """The files the entry loads, each with its SHA-256 (None where not available here)."""
    out = []
    local = [(k, getattr(spec, k)) for k in ("checkpoint", "model_config_file")]
    if spec.kind == "vlm":
        local.insert(0, ("model", spec.model))
    if isinstance(spec.label_map, str):
        local.append(("label_map", spec.label_map))
    for key, value in local:
        if value and os.path.exists(value):
            out.append({"key": key, "path": os.path.abspath(value), "sha256": path_sha256(value)})
        elif value:
            out.append({"key": key, "ref": value, "sha256": None})
    cached, ref = _hub_weights(spec)
    if cached:
        out.append({"key": "pretrained", "ref": ref, "path": cached, "sha256": file_sha256(cached)})
    elif ref:
        out.append({"key": "pretrained", "ref": ref, "sha256": None})
    return out


def own_preprocess(spec: ClassifierSpec) -> dict[str, Any] | str:
    """The model's own input transform as numbers, or ``"model"`` where the kind states none."""
    if spec.kind in ARCHIVE_KINDS and spec.checkpoint and os.path.isfile(spec.checkpoint):
        from pipeline.models import stored_preprocess

        try:
            saved = stored_preprocess.archive_preprocess(spec.checkpoint)
            cfg = stored_preprocess.resolve(saved, spec.model_kwargs, f"classifiers[{spec.name}]", spec.checkpoint, spec.kind)
        except ValueError:
            return "model"
        return {"resize_to": cfg["input_size"], "interpolation": cfg["interpolation"], "mean": cfg["mean"], "std": cfg["std"]}
    from pipeline.registry import CLASSIFIERS

    try:
        own = getattr(CLASSIFIERS.get(spec.kind), "own_preprocess", None)
        p = own(spec) if own is not None else None
    except Exception:  # a model its library cannot describe here: the classify stage says why
        p = None
    return p.as_dict() if p is not None else "model"


def identity(spec: ClassifierSpec) -> dict[str, Any]:
    """Name, entry, weights (files and SHA-256) and the own input transform of the model."""
    files = weights(spec)
    digests = [f["sha256"] for f in files if f.get("sha256")]
    if len(digests) == 1:
        combined = digests[0]
    elif digests:
        combined = hashlib.sha256("\n".join(f"{f['key']}:{f['sha256']}" for f in files if f.get("sha256")).encode()).hexdigest()
    else:
        combined = None
    return {
        "name": spec.name,
        "kind": spec.kind,
        "model": spec.model,
        "entry": spec.model_dump(mode="json", exclude_unset=True),
        "weights": files,
        "weights_sha256": combined,
        "preprocess": own_preprocess(spec),
    }
