"""What a ``card.json`` may hold, and reading the files of a card's folder strictly.

A card is read by ``cnsbench leaderboard`` and, with its kept entries
(``benchmarks/<name>.json``), by the next ``cnsbench card`` into the same folder.  Both
come from users, so every file is read as a regular file with a size bound
(:mod:`pipeline.io.regular`: never a FIFO, a device or a symlink to one), parsed as strict
JSON (:mod:`pipeline.io.safejson`: finite numbers, bounded nesting) and checked against
the schema below (docs/card.md, "card.json").  Each refusal is a :class:`CardError` naming
the file and the key.

The numbers are finite numbers or ``null`` (a metric undefined on the data), never
strings or booleans; a benchmark is listed once; the direction of a metric
(``higher_is_better``) is the metric's definition (:func:`metrics`), never the card's say:
a card that states the other direction is refused.  Keys the schema does not name are
left alone (a later version may add some).

The folder of a card carries the marker :data:`CARD_MARKER` (written before anything
else, naming the model), as a comparison carries ``compare.json``: ``card`` writes only
into a new or empty folder or one with that marker (see :mod:`pipeline.card.make`).
"""

from __future__ import annotations

import math
import re
from typing import Any

from pipeline.card.suite import NAME, card_benchmarks
from pipeline.errors import CnsbenchError
from pipeline.io.regular import read_bounded
from pipeline.io.safejson import loads as safe_loads
from pipeline.io.store import OutputStore

CARD_VERSION = 1
CARD_LIMIT = 16 << 20  # bytes of one card file (a card of five benchmarks is ~100 KB)
CARD_MARKER = "cnsbench-card.json"


def metrics() -> dict[str, dict[str, bool]]:
    """Card benchmark (a card entry's ``family``) -> headline metric -> higher is better: the
    metrics' own definitions, as the shift families declare them (``CardHeadline.metrics``)."""
    return {name: dict(h.metrics) for name, h in card_benchmarks().items()}


_NAME = re.compile(NAME)
# the tail of a local atomic write interrupted before its rename (pipeline.io.store.OutputStore.write_bytes)
TMP = re.compile(r"\.tmp-[0-9a-f]{32}-.+")


class CardError(CnsbenchError):
    """A card file that is not a card; the message names the file and the key."""


def higher_is_better(family: str, metric: str) -> bool:
    """The direction of a family's headline metric (KeyError for one the family does not have)."""
    return card_benchmarks()[family].metrics[metric]


# --------------------------------------------------------------------------- reading
def read_json(store: OutputStore, rel: str, what: str = "card file") -> Any:
    """The JSON document at ``rel`` of ``store``: a regular file (locally), at most
    :data:`CARD_LIMIT` bytes, strict JSON; :class:`CardError` naming it otherwise."""
    where = store.url(rel)
    try:
        if store.local:
            data = read_bounded(store.path(rel), CARD_LIMIT, what)
        else:
            size = store.fs.size(store.path(rel))
            if size is not None and size > CARD_LIMIT:
                raise CardError(f"{what} {where}: {size} bytes; at most {CARD_LIMIT} are read")
            data = store.read_bytes(rel)
        return safe_loads(data, where)
    except FileNotFoundError:
        raise
    except CardError:
        raise
    except (ValueError, OSError) as err:  # NotRegularFile, JSONInputError, undecodable bytes, unreadable
        text = str(err)
        raise CardError(text if where in text else f"{where}: {text}") from None


# --------------------------------------------------------------------------- checks
def _bad(where: str, key: str, problem: str, value: Any = ...) -> CardError:
    shown = "" if value is ... else f" (got {_show(value)})"
    return CardError(f"{where}: {key}: {problem}{shown}")


def _show(value: Any) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) else f"a {type(value).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."


_TYPE_NAMES = {str: "a string", int: "a whole number", dict: "an object", list: "a list", bool: "true or false"}


def _get(doc: dict[str, Any], key: str, where: str, path: str, types: tuple[type, ...], required: bool = True,
         nullable: bool = False) -> Any:
    if key not in doc:
        if required:
            raise _bad(where, path, "missing")
        return None
    value = doc[key]
    if value is None and nullable:
        return None
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        names = " or ".join(_TYPE_NAMES[t] for t in types) + (" or null" if nullable else "")
        raise _bad(where, path, f"must be {names}", value)
    return value


def number(doc: dict[str, Any], key: str, where: str, path: str, required: bool = True) -> float | None:
    """A finite number or null: never a string, a boolean, NaN or infinite."""
    if key not in doc:
        if required:
            raise _bad(where, path, "missing")
        return None
    v = doc[key]
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(where, path, "must be a finite number or null", v)
    if not math.isfinite(float(v)):
        raise _bad(where, path, "must be finite", v)
    return float(v)


def _value_in_interval(d: dict[str, Any], where: str, path: str, required: bool) -> None:
    """``value``, ``ci_low``, ``ci_high`` finite numbers or null, and a value inside its own
    interval (a bootstrap interval of the very statistic; float rounding aside)."""
    value = number(d, "value", where, f"{path}.value")
    low, high = (number(d, k, where, f"{path}.{k}", required=required) for k in ("ci_low", "ci_high"))
    if low is not None and high is not None and low > high:
        raise _bad(where, f"{path}.ci_low", f"above ci_high ({high!r})", low)
    slack = 1e-9 * max([1.0] + [abs(v) for v in (low, high) if v is not None])
    if value is not None and ((low is not None and value < low - slack) or (high is not None and value > high + slack)):
        raise _bad(where, f"{path}.value", f"outside its own interval [{_show(low)}, {_show(high)}]", value)


def check_entry(e: Any, where: str, path: str) -> dict[str, Any]:
    """One benchmark entry of a card (or a kept ``benchmarks/<name>.json``); CardError naming the key."""
    if not isinstance(e, dict):
        raise _bad(where, path, "must be an object", e)
    name = _get(e, "benchmark", where, f"{path}.benchmark", (str,))
    if not _NAME.match(name):
        raise _bad(where, f"{path}.benchmark", "must be a benchmark name (letters, digits, _ and -)", name)
    family = _get(e, "family", where, f"{path}.family", (str,))
    known = metrics()
    if family not in known:
        raise _bad(where, f"{path}.family", f"must be one of {', '.join(known)}", family)
    metric = _get(e, "metric", where, f"{path}.metric", (str,))
    if metric not in known[family]:
        raise _bad(where, f"{path}.metric", f"family {family} has the metric {' or '.join(known[family])}", metric)
    _value_in_interval(e, where, path, required=True)
    stated = _get(e, "higher_is_better", where, f"{path}.higher_is_better", (bool,), required=False)
    if stated is not None and stated != known[family][metric]:
        better = "higher" if known[family][metric] else "lower"
        raise _bad(where, f"{path}.higher_is_better", f"{metric} of {family} is better when {better}, by its definition", stated)
    _get(e, "protocol", where, f"{path}.protocol", (str,))
    for key in ("benchmark_hash", "images_digest"):
        _get(e, key, where, f"{path}.{key}", (str,))
    for key in ("config_hash", "description", "output"):
        _get(e, key, where, f"{path}.{key}", (str,), required=False, nullable=True)
    n = _get(e, "n_units", where, f"{path}.n_units", (int,), required=False)
    if n is not None and n < 0:
        raise _bad(where, f"{path}.n_units", "must be >= 0", n)
    for key in ("protocol_detail", "ci"):
        _get(e, key, where, f"{path}.{key}", (dict,), required=False)
    _get(e, "preprocess", where, f"{path}.preprocess", (dict, str), required=False)
    shards = _get(e, "left_out_shards", where, f"{path}.left_out_shards", (list,), required=False) or []
    if not all(isinstance(s, str) for s in shards):
        raise _bad(where, f"{path}.left_out_shards", "must list strings", shards)
    fp = _get(e, "failure_point", where, f"{path}.failure_point", (dict,), required=False)
    if fp is not None:
        for k in ("grid", "grid_ci_low", "grid_ci_high", "refined", "refined_ci_low", "refined_ci_high",
                  "refined_interval_width"):
            number(fp, k, where, f"{path}.failure_point.{k}", required=k == "grid")
    for i, d in enumerate(_get(e, "details", where, f"{path}.details", (list,), required=False) or []):
        at = f"{path}.details[{i}]"
        if not isinstance(d, dict):
            raise _bad(where, at, "must be an object", d)
        _get(d, "metric", where, f"{at}.metric", (str,))
        _value_in_interval(d, where, at, required=False)
        _get(d, "key", where, f"{at}.key", (dict,), required=False)
    return e


def check_card(doc: Any, where: str) -> dict[str, Any]:
    """``doc`` when it is a card (the schema of docs/card.md); CardError naming the key otherwise."""
    if not isinstance(doc, dict):
        raise CardError(f"{where}: not a card (an object with card, model, suite and benchmarks), got {_show(doc)}")
    version = _get(doc, "card", where, "card", (int,))
    if version != CARD_VERSION:
        raise _bad(where, "card", f"must be {CARD_VERSION} (the card format this cnsbench reads)", version)
    model = _get(doc, "model", where, "model", (dict,))
    name = _get(model, "name", where, "model.name", (str,))
    if not name.strip() or len(name) > 200:
        raise _bad(where, "model.name", "must be a name of 1 to 200 characters", name)
    _get(model, "weights_sha256", where, "model.weights_sha256", (str,), nullable=True)
    for key in ("kind", "model"):
        _get(model, key, where, f"model.{key}", (str,), required=False, nullable=True)
    suite = _get(doc, "suite", where, "suite", (dict,))
    _get(suite, "name", where, "suite.name", (str,))
    _get(suite, "hash", where, "suite.hash", (str,))
    _get(suite, "baseline", where, "suite.baseline", (str,), nullable=True)
    entries = _get(doc, "benchmarks", where, "benchmarks", (list,))
    if not entries:
        raise _bad(where, "benchmarks", "must list at least one benchmark", entries)
    seen: dict[str, int] = {}
    for i, e in enumerate(entries):
        check_entry(e, where, f"benchmarks[{i}]")
        if e["benchmark"] in seen:
            raise _bad(where, f"benchmarks[{i}].benchmark",
                       f"{e['benchmark']!r} is listed twice (also benchmarks[{seen[e['benchmark']]}])")
        seen[e["benchmark"]] = i
    listed = _get(suite, "benchmarks", where, "suite.benchmarks", (list,), required=False)
    if listed is not None and listed != list(seen):
        raise _bad(where, "suite.benchmarks", f"must be the card's benchmarks {list(seen)}", listed)
    return doc


def check_kept(doc: Any, where: str) -> dict[str, Any]:
    """A kept entry (``benchmarks/<name>.json``): a benchmark entry with the ``key`` it was made for."""
    entry = check_entry(doc, where, "<entry>")
    _get(entry, "key", where, "key", (dict,))
    return entry


def read_card(store: OutputStore, rel: str = "card.json") -> dict[str, Any]:
    """The checked card at ``rel`` of ``store`` (see the module doc)."""
    return check_card(read_json(store, rel), store.url(rel))


# --------------------------------------------------------------------------- the folder's marker
def read_card_marker(store: OutputStore) -> dict[str, Any]:
    """The content of a card folder's marker: ``{"cnsbench": "card", "model": name}``."""
    where = store.url(CARD_MARKER)
    doc = read_json(store, CARD_MARKER, "card folder marker")
    if not isinstance(doc, dict) or doc.get("cnsbench") != "card" or not isinstance(doc.get("model"), str):
        raise CardError(f"{where} is not a cnsbench card marker (expected an object with \"cnsbench\": \"card\" and "
                        f"the model's name); refusing to write into {store.uri}")
    return doc


def card_marker(model: str) -> dict[str, Any]:
    return {"cnsbench": "card", "model": model}
