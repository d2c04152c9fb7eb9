"""Limits checked before any work starts: YAML size and alias expansion, seed ranges,
finite numbers, scale spacing and the format fields of prompts and patterns.

Each check raises ``ValueError`` with a message naming what is wrong; config validators
(:mod:`pipeline.config`) call them so that ``cnsbench validate`` and the start of
``build`` refuse a config that would otherwise fail hours later (or exhaust memory).
"""

from __future__ import annotations

import math
import re
import string
from pathlib import Path
from typing import Any, Iterable

from pipeline.errors import CnsbenchError

MAX_CONFIG_BYTES = 8 * 1024 * 1024  # a YAML config larger than this is refused unread
MAX_NODES = 1_000_000  # values in a config after expanding YAML aliases
MAX_DEPTH = 64  # nesting of mappings/lists in a config
MAX_SEEDS = 1_000_000  # seeds of one benchmark (the reference uses 50)
MAX_ABS_SCALE = 10_000.0
SCALE_RESOLUTION = 0.001  # ids store scales in thousandths (pipeline.plan.scale_tag)
MAX_RESOLUTION = 8192  # generated / saved image sizes in pixels
MAX_BATCH = 65_536  # branch batches, rows per batch, trajectories per shard
MAX_FORMAT_WIDTH = 256  # width and precision in a template's format spec ({class_id:03d})


# --------------------------------------------------------------------------- YAML
def _count(node: Any, path: str, budget: list[int], depth: int, source: str) -> None:
    budget[0] -= 1
    if budget[0] < 0:
        raise CnsbenchError(
            f"{source}: more than {MAX_NODES} values after expanding YAML aliases (an alias bomb?); refused"
        )
    if depth > MAX_DEPTH:
        raise CnsbenchError(f"{source}: nested deeper than {MAX_DEPTH} levels at {path or '<root>'} (a recursive alias?)")
    if isinstance(node, dict):
        for k, v in node.items():
            _count(v, f"{path}.{k}" if path else str(k), budget, depth + 1, source)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _count(v, f"{path}[{i}]", budget, depth + 1, source)


def check_expansion(data: Any, source: str) -> None:
    """ValueError when ``data`` (aliases expanded) exceeds :data:`MAX_NODES` or :data:`MAX_DEPTH`."""
    _count(data, "", [MAX_NODES], 0, source)


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file with bounded size, nesting and alias expansion (ValueError naming the file)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        what = "is a directory, not a file" if p.is_dir() else "not found"
        raise FileNotFoundError(f"{p}: {what}")
    size = p.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise CnsbenchError(f"{p}: {size} bytes; a config may have at most {MAX_CONFIG_BYTES}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise CnsbenchError(f"{p}: not UTF-8 text: {err}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise CnsbenchError(f"invalid YAML in {p}: {err}") from None
    except RecursionError:
        raise CnsbenchError(f"invalid YAML in {p}: nested too deeply") from None
    check_expansion(data, str(p))
    return data


# --------------------------------------------------------------------------- numbers
def nonfinite_path(data: Any, path: str = "") -> str | None:
    """Key path of the first NaN or infinite number in ``data`` (JSON-like), else None."""
    if isinstance(data, float) and not math.isfinite(data):
        return path or "<root>"
    if isinstance(data, dict):
        for k, v in data.items():
            found = nonfinite_path(v, f"{path}.{k}" if path else str(k))
            if found:
                return found
    elif isinstance(data, list):
        for i, v in enumerate(data):
            found = nonfinite_path(v, f"{path}[{i}]")
            if found:
                return found
    return None


def seed_range(text: str, limit: int = MAX_SEEDS) -> list[int]:
    """``"1..50"`` -> [1, ..., 50]; ValueError for other text or more than ``limit`` seeds (nothing allocated)."""
    m = re.fullmatch(r"\s*(\d+)\s*\.\.\s*(\d+)\s*", text)
    if not m or int(m.group(1)) > int(m.group(2)):
        raise CnsbenchError(f"seed range must look like '1..50', got {text!r}")
    lo, hi = int(m.group(1)), int(m.group(2))
    if hi - lo + 1 > limit:
        raise CnsbenchError(f"seed range {text!r} has {hi - lo + 1} seeds; at most {limit} are allowed")
    if hi >= 2**63:
        raise CnsbenchError(f"seed range {text!r}: seeds must be < 2**63")
    return list(range(lo, hi + 1))


def check_scales(scales: Iterable[float]) -> None:
    """Finite, within +-:data:`MAX_ABS_SCALE`, and at least :data:`SCALE_RESOLUTION` apart.

    Sample ids name a scale in thousandths (``scale_1000``), so two scales closer than
    that would share ids and overwrite each other's images.
    """
    values = list(scales)
    for s in values:
        if not math.isfinite(s):
            raise CnsbenchError(f"scales must be finite numbers, got {s}")
        if abs(s) > MAX_ABS_SCALE:
            raise CnsbenchError(f"scale {s} is outside +-{MAX_ABS_SCALE:g}")
    milli: dict[int, float] = {}
    for s in values:
        key = round(s / SCALE_RESOLUTION)
        if key in milli:
            raise CnsbenchError(
                f"scales {milli[key]} and {s} are closer than {SCALE_RESOLUTION} (the resolution of sample ids); "
                "they would get the same ids"
            )
        milli[key] = s


# --------------------------------------------------------------------------- templates
_SAMPLE = {"token": "tok", "shift_words": "words", "class_name": "name", "class_id": 1, "shift": "shift", "c": "name"}


def _check_format_spec(template_text: str, field_name: str, spec: str) -> None:
    """Refuse nested fields and widths/precisions over :data:`MAX_FORMAT_WIDTH` (``{x:>999999999}``
    would allocate that many characters per prompt, or exhaust memory)."""
    if "{" in spec or "}" in spec:
        raise CnsbenchError(f"{template_text}: nested field in the format spec of {{{field_name}:{spec}}}; not allowed")
    digits = max(re.findall(r"\d+", spec), key=lambda n: (len(n.lstrip("0")), n.lstrip("0")), default="0")
    if len(digits.lstrip("0")) > 9 or int(digits) > MAX_FORMAT_WIDTH:
        raise CnsbenchError(
            f"{template_text[:200]}: the format spec of {{{field_name}:{spec[:40]}}} asks for a width or precision "
            f"of {digits.lstrip('0')[:40]}; at most {MAX_FORMAT_WIDTH} is allowed"
        )


def check_template(template: str, allowed: Iterable[str], required: Iterable[str] = (), where: str = "") -> None:
    """ValueError unless ``template`` uses only the named ``allowed`` fields with valid, bounded formats.

    ``where`` (a config key) starts the message when given.
    """
    allowed, required = set(allowed), set(required)
    fields = ", ".join("{" + n + "}" for n in sorted(allowed))
    template_text = f"{where} {template!r}" if where else repr(template)
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise CnsbenchError(f"{template_text} is not a valid format string: {err} (write '{{{{' for a literal brace)") from None
    names = set()
    for _, field_name, spec, _ in parsed:
        if field_name is None:
            continue
        _check_format_spec(template_text, field_name, spec or "")
        base = re.split(r"[.\[]", field_name, maxsplit=1)[0]
        if base == "" or base.isdigit():
            raise CnsbenchError(f"{template_text}: positional field {{{field_name}}}; use named fields {fields}")
        if base not in allowed or base != field_name:
            raise CnsbenchError(f"{template_text}: unknown field {{{field_name}}}; allowed: {fields}")
        names.add(base)
    missing = required - names
    if missing:
        raise CnsbenchError(f"{template_text} must contain {', '.join('{' + n + '}' for n in sorted(missing))}")
    try:
        template.format(**{k: v for k, v in _SAMPLE.items() if k in allowed})
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise CnsbenchError(f"{template_text}: bad format specification: {err}") from None
