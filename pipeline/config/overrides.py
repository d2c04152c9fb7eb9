"""``--set key.path=value`` overrides: parsed once, applied to the raw config before validation.

A key path is dot-separated (``generator.steps``); list items are addressed by index,
``classifiers[0].batch_size`` or ``classifiers.0.batch_size``.  The value is YAML
(``[2]``, ``3``, ``bfloat16``, ``{a: 1}``), read with the same bounds as a config file.
Overrides are applied in order to the file's raw mapping, so the merged config is
validated exactly like a file would be and its resolved dump records the result.
"""

from __future__ import annotations

import os
import re
from typing import Any, Sequence

from pipeline.config.base import ConfigError
from pipeline.io import bounds

MAX_OVERRIDE_CHARS = 64 * 1024  # one --set value; a whole config belongs in a file
_PART = re.compile(r"([A-Za-z_][A-Za-z0-9_\-]*)?((?:\[\d+\])*)")


def parse_key(path: str) -> list[str | int]:
    """``a.b[0].c`` or ``a.b.0.c`` -> ``['a', 'b', 0, 'c']``; ConfigError on a malformed path."""
    if not path:
        raise ConfigError("--set: empty key; use --set key.path=value")
    parts: list[str | int] = []
    for piece in path.split("."):
        if piece.isdigit():
            parts.append(int(piece))
            continue
        m = _PART.fullmatch(piece)
        if not piece or not m or not (m.group(1) or m.group(2)):
            raise ConfigError(f"--set {path}: malformed key path (use dotted names, list items as name[0] or name.0)")
        if m.group(1):
            parts.append(m.group(1))
        parts.extend(int(i) for i in re.findall(r"\[(\d+)\]", m.group(2)))
    if not isinstance(parts[0], str):
        raise ConfigError(f"--set {path}: a key path starts with a section name")
    return parts


def parse_value(text: str, key: str) -> Any:
    """A --set value as YAML (bounded like a config file); ConfigError naming the key."""
    import yaml

    if len(text) > MAX_OVERRIDE_CHARS:
        raise ConfigError(f"--set {key}: value of {len(text)} characters; at most {MAX_OVERRIDE_CHARS}")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except (yaml.YAMLError, RecursionError) as err:
        raise ConfigError(f"--set {key}: the value is not valid YAML: {err}") from None
    try:
        bounds.check_expansion(value, f"--set {key}")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return value


def parse_overrides(items: Sequence[str] | None) -> list[tuple[str, list[str | int], Any]]:
    """``["a.b=1", ...]`` -> ``[(key text, key path, value), ...]`` in order."""
    out = []
    for item in items or ():
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(f"--set {item}: expected key.path=value")
        out.append((key, parse_key(key), parse_value(text, key)))
    return out


def apply_overrides(raw: Any, items: Sequence[str] | None) -> dict[str, Any]:
    """A copy of the raw config mapping with every ``--set`` applied, in order."""
    import copy

    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"--set: the config's top level must be a mapping, got {type(raw).__name__}")
    out = copy.deepcopy(raw)
    for key, path, value in parse_overrides(items):
        if isinstance(value, str) and (value.startswith("./") or value.startswith("../")):
            value = os.path.abspath(value)  # a path typed on the command line is relative to where it is typed
        node: Any = out
        for depth, part in enumerate(path):
            last = depth == len(path) - 1
            where = _show(path[: depth + 1])
            if isinstance(part, int):
                if not isinstance(node, list):
                    raise ConfigError(f"--set {key}: {_show(path[:depth]) or '<root>'} is not a list")
                if not 0 <= part < len(node):
                    raise ConfigError(f"--set {key}: {where}: index out of range (the list has {len(node)} items)")
            elif not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {_show(path[:depth])} is not a mapping")
            if last:
                node[part] = value
            elif isinstance(node, dict) and not isinstance(node.get(part), (dict, list)):
                # A section the file leaves out (its defaults apply): start it as a mapping.
                node[part] = {}
                node = node[part]
            else:
                node = node[part]
    return out


def _show(path: Sequence[str | int]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(path))
