"""Errors the routes turn into HTTP answers, and JSON-ready values of table cells.

* :class:`NotFound` -> 404 with the valid ``choices``;
* :class:`InvalidRequest` -> 422 with pydantic's error list;
* :class:`PreviewFailed` -> 500 naming the model error;
* :class:`OutputReplaced` -> 503 with ``Retry-After`` (the output is being rebuilt);
* :class:`BadBody` -> 415 for a body not declared as JSON, 400 for one that is not JSON (:func:`json_body`).

The value helpers turn what Parquet and the models give (nullable booleans, NaN scores)
into what JSON can carry.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pipeline.errors import CnsbenchError

T = TypeVar("T")


class NotFound(LookupError):
    """An unknown name in a request; the 404 body lists the valid ``choices``."""

    def __init__(self, message: str, choices: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.choices = list(choices)


class OutputReplaced(RuntimeError):
    """A file the index lists is gone because the output is being replaced (HTTP 503, try again)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PreviewFailed(RuntimeError):
    """A model deployment raised while making a preview (HTTP 500 with the error)."""


class InvalidRequest(CnsbenchError):
    """Request values that fail validation (HTTP 422)."""

    def __init__(self, errors: list[dict[str, Any]] | str) -> None:
        super().__init__(str(errors))
        self.errors = errors


def read_listed(what: str, read: Callable[[], T], changed: Callable[[], bool], retry_after_s: float) -> T:
    """``read()`` of a file an index lists.  Missing or short, it is :class:`OutputReplaced`
    when ``changed()`` (the output moved under us: a rebuild), else :class:`NotFound` (or the error)."""
    try:
        return read()
    except (FileNotFoundError, ValueError) as err:
        try:
            moved = changed()
        except Exception:  # noqa: BLE001 - an output that cannot even be listed is being replaced
            moved = True
        if moved:
            raise OutputReplaced(
                f"{what}: the output is being replaced (a rebuild moved its files); try again in a few seconds",
                retry_after_s,
            ) from None
        if isinstance(err, FileNotFoundError):
            raise NotFound(f"{what} is no longer in the output", []) from None
        raise


class BadBody(CnsbenchError):
    """A request body the routes cannot read: not declared as JSON (415) or not JSON (400)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


async def json_body(request: Any) -> Any:
    """The JSON value of a POST's body; :class:`BadBody` 415 unless it is declared
    ``application/json`` (which also keeps cross-site "simple" POSTs, text/plain forms, from
    reaching the models), 400 when it is not JSON."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise BadBody("Content-Type must be application/json", 415)
    try:
        return parse_json_body(await request.body())
    except ValueError as err:
        raise BadBody(f"request body is not valid JSON: {err}", 400) from None


def parse_json_body(body: bytes) -> Any:
    """The JSON value of a request body; ValueError (-> 400) when it is not JSON or nested too deeply."""
    try:
        return json.loads(body)
    except RecursionError:
        raise CnsbenchError("JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise CnsbenchError(str(err)) from None


def is_missing(value: Any) -> bool:
    """None or NaN: a null of a Parquet column after ``to_pandas()``."""
    if value is None:
        return True
    try:
        return math.isnan(value)
    except TypeError:  # not a number at all
        return False


def as_flag(value: Any) -> bool:
    """A nullable boolean column's value; null counts as False (as in the metrics)."""
    return False if is_missing(value) else bool(value)


def json_number(value: Any) -> float | None:
    """A float for JSON: NaN/inf (a disabled detector's score, a never-failed trajectory) become null."""
    if value is None:
        return None
    f = float(value)
    return f if math.isfinite(f) else None
