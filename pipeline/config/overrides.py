"""``--set key.path=value`` overrides: parsed once, applied to the raw config before validation.

A key path is dot-separated (``generator.steps``); list items are addressed by index,
``classifiers[0].batch_size`` or ``classifiers.0.batch_size``.  The value is YAML
(``[2]``, ``3``, ``bfloat16``, ``{a: 1}``), read with the same bounds as a config file.
``key.path+=value`` appends to a list (``classifiers+={name: mine, kind: exported,
checkpoint: ./mine.pt2}``); a list value extends it (``benchmark.seeds+=[7, 8]``).  A string
starting with ``./`` or ``../``, anywhere in the value, is a path typed on the command line:
it is made absolute against the current folder.  Overrides are applied in order to the file's raw mapping, so the merged config is
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


def parse_overrides(items: Sequence[str] | None) -> list[tuple[str, list[str | int], Any, bool]]:
    """``["a.b=1", "c+=2", ...]`` -> ``[(key text, key path, value, append), ...]`` in order."""
    out = []
    for item in items or ():
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(f"--set {item}: expected key.path=value (or key.path+=value to append to a list)")
        append = key.endswith("+")
        key = key[:-1].rstrip() if append else key
        out.append((key, parse_key(key), parse_value(text, key), append))
    return out


def typed_paths(value: Any) -> Any:
    """``value`` with every string that starts with ``./`` or ``../`` made absolute (a path
    typed on the command line is relative to where it is typed, not to the config file)."""
    if isinstance(value, str) and value.startswith(("./", "../")):
        return os.path.abspath(value)
    if isinstance(value, dict):
        return {k: typed_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed_paths(v) for v in value]
    return value


def _append(node: Any, part: str | int, value: Any, key: str, where: str) -> None:
    current = node.get(part) if isinstance(node, dict) else node[part]
    if current is None:
        current = []
    if not isinstance(current, list):
        raise ConfigError(f"--set {key}+=...: {where} is not a list (+= appends to a list; use = to replace it)")
    node[part] = current + (value if isinstance(value, list) else [value])


def apply_overrides(raw: Any, items: Sequence[str] | None) -> dict[str, Any]:
    """A copy of the raw config mapping with every ``--set`` applied, in order."""
    import copy

    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"--set: the config's top level must be a mapping, got {type(raw).__name__}")
    out = copy.deepcopy(raw)
    for key, path, value, append in parse_overrides(items):
        value = typed_paths(value)
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
            if last and append:
                _append(node, part, value, key, where)
            elif last:
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
