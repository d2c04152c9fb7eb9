"""The project's strict pydantic base: unknown keys, NaN and infinities refused.

The config sections (:mod:`pipeline.config`) and the documents read back from an output
(shard manifests, the lease) derive from :class:`Strict`; it lives here, in the lowest layer
that reads documents, so both can.  :func:`first_problem` gives the first error of a
``ValidationError`` as (key path, error type, offending value, message), for parsers that word
their own refusals.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class Strict(BaseModel):
    # allow_inf_nan=False: NaN or infinite numbers anywhere in a document are refused.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def first_problem(err: ValidationError) -> tuple[tuple[Any, ...], str, Any, str]:
    """(location, type, input, message) of ``err``'s first error; a validator's own ValueError
    keeps its message without pydantic's ``Value error, `` prefix."""
    first = err.errors(include_url=False)[0]
    message = str(first["ctx"]["error"]) if first["type"] == "value_error" and "ctx" in first else first["msg"]
    return tuple(first["loc"]), first["type"], first.get("input"), message


def errors_of_type(err: ValidationError, kind: str, depth: int = 1) -> list[str]:
    """The keys (at ``depth``) of ``err``'s errors of type ``kind`` (``missing``, ``extra_forbidden``)."""
    return sorted(str(e["loc"][depth - 1]) for e in err.errors(include_url=False)
                  if e["type"] == kind and len(e["loc"]) == depth)
