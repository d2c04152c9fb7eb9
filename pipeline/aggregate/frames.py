"""What every metric table shares: scales checked and matched at 1/1000 (the resolution of
:func:`pipeline.plan.scale_tag`), required columns, keep decisions as booleans, empty tables,
and tables as plain JSON (NaN and infinities as null).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import pandas as pd

from pipeline.errors import CnsbenchError


def check_scales(scales: Iterable[float]) -> list[float]:
    """The benchmark's scales as floats: non-empty, with 0, unique, ascending, at least 0.001 apart (ValueError)."""
    values = [float(s) for s in scales]
    if not values:
        raise CnsbenchError("scales must not be empty")
    if 0.0 not in values:
        raise CnsbenchError(f"scales must include 0 (the reference of every trajectory), got {values}")
    if sorted(set(values)) != values:
        raise CnsbenchError(f"scales must be unique and ascending, got {values}")
    milli = [round(v * 1000) for v in values]
    if len(set(milli)) != len(milli):
        raise CnsbenchError(f"scales must differ by at least 0.001, got {values}")
    return values


def milli_keys(values: pd.Series) -> pd.Series:
    """Scales as integer thousandths: the key every table matches scales by."""
    # Integer key at scale_tag's resolution: exact equality on floats read back from
    # parquet/CSV is fragile, the rounded thousandth is what the sample ids encode anyway.
    return (values.astype(float) * 1000).round().astype("int64")


def require_columns(df: pd.DataFrame, columns: list[str], name: str) -> pd.DataFrame:
    """``df``, or an empty frame of ``columns`` when it is empty without them; ValueError naming the missing ones."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        if len(df) == 0:
            # An empty frame built without a schema (pd.DataFrame()) is still "no data".
            return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
        raise CnsbenchError(f"{name} table lacks columns {missing}; has {list(df.columns)}")
    return df


def kept_flags(values: pd.Series) -> pd.Series:
    """The ``kept`` column as plain booleans."""
    # Nulls count as False: an image without a keep decision was not kept.
    return values.astype("boolean").fillna(False).astype(bool)


def empty_frame(columns: list[str], dtypes: dict[str, Any]) -> pd.DataFrame:
    """A table of ``columns`` without rows (``dtypes`` per column, object for the rest)."""
    return pd.DataFrame({c: pd.Series(dtype=dtypes.get(c, object)) for c in columns})


def jsonable(value: Any) -> Any:
    """Plain JSON types: numpy scalars unwrapped, NaN/inf -> None."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is pd.NA or value is pd.NaT:
        return None
    return value


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The table's rows as JSON-ready dicts (:func:`jsonable`)."""
    return [jsonable(dict(zip(df.columns, row))) for row in df.itertuples(index=False, name=None)]
