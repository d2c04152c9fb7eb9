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

import os
import re
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from pipeline.assets.weights import combined_digest, weights
from pipeline.config import ClassifierSpec, ConfigError, spec_class
from pipeline.config.classifiers import SPEC_TAGS
from pipeline.io import bounds



def _resolve_entry_paths(entry: dict[str, Any], base: Path) -> dict[str, Any]:
    out = dict(entry)
    for key in spec_class(out.get("kind")).file_keys:  # the keys its kind's options name files with
        value = out.get(key)
        if isinstance(value, str) and (value.startswith("./") or value.startswith("../")):
            out[key] = str((base / value).resolve())
    return out


def _spec(entry: dict[str, Any], where: str) -> ClassifierSpec:
    try:
        return ClassifierSpec.model_validate(entry)
    except ValidationError as err:
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'] if p not in SPEC_TAGS) or '<entry>'}: {e['msg']}"
                           for e in err.errors())
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
def own_preprocess(spec: ClassifierSpec) -> dict[str, Any] | str:
    """The model's own input transform as numbers (its kind's ``input_transform``), or ``"model"``
    where the kind states none."""
    from pipeline.registry import CLASSIFIERS

    try:
        p = CLASSIFIERS.get(spec.kind).input_transform(spec)
    except Exception:  # a model its library cannot describe here: the classify stage says why
        p = None
    return p if p is not None else "model"


def identity(spec: ClassifierSpec) -> dict[str, Any]:
    """Name, entry, weights (files and SHA-256) and the own input transform of the model."""
    files = weights(spec)
    combined = combined_digest(files)
    return {
        "name": spec.name,
        "kind": spec.kind,
        "model": spec.model,
        "entry": spec.model_dump(mode="json", exclude_unset=True),
        "weights": files,
        "weights_sha256": combined,
        "preprocess": own_preprocess(spec),
    }
