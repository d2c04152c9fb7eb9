"""Reading a config: YAML, relative paths, readable validation errors, the resolved dump and hash."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Sequence

import yaml
from pydantic import BaseModel, ValidationError

from pipeline.config.base import ConfigError
from pipeline.config.build import BuildConfig
from pipeline.config.classifiers import SPEC_TAGS, VLM_ONLY, spec_class
from pipeline.config.overrides import apply_overrides
from pipeline.io import bounds
from pipeline.io.regular import NotRegularFile, regular_file

_PATH_KEYS = {
    ("benchmark", "labels"),
    ("generator", "model"),
    ("generator", "class_tokens", "path"),
    ("generator", "slider_store"),
    ("filter", "clip", "pretrained"),
    ("filter", "clip", "model_config_file"),
    ("filter", "dino", "checkpoint"),
    ("output", "path"),
    ("source", "path"),
    ("source", "label_map"),
    ("source", "masks", "path"),
}


def _looks_relative_path(value: Any) -> bool:
    return isinstance(value, str) and (value.startswith("./") or value.startswith("../"))


def _resolve_paths(raw: dict[str, Any], base: Path) -> None:
    """Make ``./`` and ``../`` paths absolute relative to the config's directory."""

    def fix(container: dict[str, Any], key: str) -> None:
        if key in container and _looks_relative_path(container[key]):
            container[key] = str((base / container[key]).resolve())

    for path in _PATH_KEYS:
        node: Any = raw
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            fix(node, path[-1])
    for clf in raw.get("classifiers") or []:
        if isinstance(clf, dict):
            for key in spec_class(clf.get("kind")).file_keys:  # the keys its kind's options name files with
                fix(clf, key)


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """Walk a model class along an error location and list the keys allowed there."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if part in SPEC_TAGS:  # a classifier entry: the spec of its kind
            current = SPEC_TAGS[part]
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(part)
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ()) or ()
        candidates = [ann, *args]
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return None


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        tagged = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        loc = tuple(p for p in tagged if p not in SPEC_TAGS)
        key = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc).replace(".[", "[")
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(BuildConfig, tagged)
            msg = f"unknown key; allowed keys here: {', '.join(allowed) if allowed else '?'}"
        elif e["type"] == "literal_error":
            msg = f"{msg}"
        value = e.get("input")
        shown = "" if e["type"] in ("missing", "extra_forbidden") or isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"  {key or '<root>'}: {msg}{shown}")
    return "\n".join(lines)


def parse_config(raw: dict[str, Any], source: str = "<dict>", base_dir: Path | None = None) -> BuildConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"invalid config {source}: the top level must be a mapping, got {type(raw).__name__}")
    try:
        bounds.check_expansion(raw, source)  # before the copy below expands aliases
    except ValueError as err:
        raise ConfigError(str(err)) from None
    bad = bounds.nonfinite_path(raw)
    if bad:
        raise ConfigError(f"invalid config {source}:\n  {bad}: NaN or infinite numbers are not allowed")
    try:
        raw = json.loads(json.dumps(raw))  # deep copy, and rejects non-JSON values early
    except (TypeError, ValueError) as err:
        raise ConfigError(f"invalid config {source}: {err} (values must be strings, numbers, lists or mappings)") from None
    if base_dir is not None:
        _resolve_paths(raw, base_dir)
    try:
        return BuildConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def load_config(
    path: str | os.PathLike[str], overrides: dict[str, Any] | None = None, sets: Sequence[str] | None = None
) -> BuildConfig:
    """Load and validate a YAML config file; raises :class:`ConfigError` with a readable message.

    ``overrides`` (a partial config) is merged into the file, then ``sets`` (``--set
    key.path=value`` items, :mod:`.overrides`) are applied, all before validation."""
    p = Path(path)
    try:  # a FIFO, a device, a directory or a link to one says what it is, never "not found"
        regular_file(p, "config file")
    except (FileNotFoundError, NotRegularFile) as err:
        raise ConfigError(str(err)) from None
    try:
        raw = bounds.load_yaml(p)  # bounded size, nesting and alias expansion
    except (ValueError, OSError) as err:
        raise ConfigError(str(err)) from None
    if overrides:
        raw = deep_merge(raw or {}, overrides)
    source = str(p)
    if sets:
        raw = apply_overrides(raw, sets)
        source = f"{p} with --set {' --set '.join(sets)}"
    return parse_config(raw, source=source, base_dir=p.resolve().parent)


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def resolved_dict(cfg: BuildConfig) -> dict[str, Any]:
    data = cfg.model_dump(mode="json")
    if data.get("sampling") is None:  # a uniform build's config reads as it did before adaptive builds
        data.pop("sampling", None)
    return data


HASHED_WHEN_SET = ("vision_dtype", "image_aspect_ratio")  # classifier keys hashed only when not None


def config_hash(cfg: BuildConfig) -> str:
    """Hash of the resolved config (resources excluded: they never change outputs, but for a
    filter or classify precision other than float32, which does; :data:`.resources.OUTPUT_CHANGING`)."""
    from pipeline.config.resources import output_changing

    from pipeline.config.refine import RefineSpec

    data = resolved_dict(cfg)
    numeric = output_changing(data.pop("resources", None) or {})
    if numeric:  # float32 configs hash as they did before precision was a key
        data["resources"] = numeric
    # Keys added since outputs were first hashed count only when set, so that an output's
    # hash stays what it was: the refinement's defaults change no row, and a classifier without
    # a vision_dtype / image_aspect_ratio runs as before they existed.
    if data.get("refine") == RefineSpec().model_dump(mode="json"):
        data.pop("refine")
    for clf in data.get("classifiers", []):
        # An entry of a kind without a vlm's options hashes as it did when every entry held them.
        for key in VLM_ONLY:
            clf.setdefault(key, None)
        for key in HASHED_WHEN_SET:
            if clf.get(key) is None:
                clf.pop(key, None)
    blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def dump_yaml(cfg: BuildConfig) -> str:
    return yaml.safe_dump(resolved_dict(cfg), sort_keys=False)
