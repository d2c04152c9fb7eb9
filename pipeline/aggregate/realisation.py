"""How strongly each shift is realised at each scale (CNS-Bench Fig. 3): the CLIPScore gain
towards the shift's words and the DINOv2 similarity to the unshifted image, per (shift, scale).

A measure of the generator, not of the classifiers: part of every build's metrics
(:attr:`pipeline.aggregate.metrics.Metrics.shift_realisation`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from pipeline.aggregate.frames import check_scales, empty_frame, kept_flags, milli_keys
from pipeline.errors import CnsbenchError

REALISATION_TABLE_COLUMNS = ["shift", "scale", "n", "clip_shift_alignment_delta", "dino_similarity"]
REALISATION_DTYPES = {"scale": float, "n": "int64", "clip_shift_alignment_delta": float, "dino_similarity": float}


def empty_realisation() -> pd.DataFrame:
    """The realisation table without rows."""
    return empty_frame(REALISATION_TABLE_COLUMNS, REALISATION_DTYPES)


def shift_realisation(samples: pd.DataFrame, scales: Sequence[float], kept_only: bool = False) -> pd.DataFrame:
    """How strongly each shift is realised at each scale (CNS-Bench Fig. 3).

    Columns ``shift, scale, n, clip_shift_alignment_delta, dino_similarity``, one row per
    (shift, benchmark scale) that has samples, ordered by shift name then scale:

    * ``n``: number of samples of that shift at that scale (one per trajectory).
    * ``clip_shift_alignment_delta``: mean over those samples of
      ``clip_shift_alignment(sample) - clip_shift_alignment(scale-0 sample of the same
      trajectory)``, i.e. the CLIPScore gain towards ``"a picture in {shift words}"``
      relative to the unshifted image (0 at scale 0).  Samples whose own or reference
      value is missing/NaN are left out of the mean.
    * ``dino_similarity``: mean of the stored ``dino_image`` score, the DINOv2 class-token
      cosine similarity to the trajectory's scale-0 image (1 at scale 0; with
      ``filter.dino.softmax_cls`` the cosine of the softmaxed tokens, as the filter
      computes it).  NaN values are left out.

    A mean over no values is NaN (e.g. an evaluate-only output without ``--filter``).  All
    samples count, kept by the filter or not (the measure describes the generator, not the
    filter), unless ``kept_only``.  Scales are matched at 1/1000 like every other metric;
    samples at other scales are ignored.  Outputs written before the
    ``clip_shift_alignment`` column existed give NaN deltas.
    """
    scale_list = check_scales(scales)
    required = ["trajectory_id", "shift", "scale"] + (["kept"] if kept_only else [])
    missing = [c for c in required if c not in samples.columns]
    if missing or samples.empty:
        if missing and len(samples):
            raise CnsbenchError(f"samples table lacks columns {missing}; has {list(samples.columns)}")
        return empty_realisation()

    def score(column: str) -> Any:
        # Score columns are optional (tables from older outputs or tests may lack them).
        if column not in samples.columns:
            return np.nan
        return pd.to_numeric(samples[column], errors="coerce").astype(float)

    df = pd.DataFrame(
        {
            "trajectory_id": samples["trajectory_id"].astype(str),
            "shift": samples["shift"].astype(str),
            "milli": milli_keys(samples["scale"]),
            "kept": kept_flags(samples["kept"]) if "kept" in samples.columns else True,
            "dino": score("dino_image"),
            "align": score("clip_shift_alignment"),
        }
    )
    canonical = {round(s * 1000): s for s in scale_list}
    df = df[df["milli"].isin(list(canonical))]
    if df.duplicated(["trajectory_id", "milli"]).any():
        row = df.loc[df.duplicated(["trajectory_id", "milli"])].iloc[0]
        raise CnsbenchError(f"trajectory {row['trajectory_id']!r} has several samples at scale {row['milli'] / 1000}")
    # The reference is the trajectory's own scale-0 sample, taken before the kept_only
    # selection: an unkept scale-0 image is still what the shift departs from.
    ref = df.loc[df["milli"] == 0].set_index("trajectory_id")["align"]
    df["delta"] = df["align"] - df["trajectory_id"].map(ref).astype(float)
    if kept_only:
        df = df[df["kept"]]
    if df.empty:
        return empty_realisation()
    g = df.groupby(["shift", "milli"], sort=True).agg(
        n=("trajectory_id", "size"), clip_shift_alignment_delta=("delta", "mean"), dino_similarity=("dino", "mean")
    )
    out = g.reset_index()
    out["scale"] = out["milli"].map(canonical).astype(float)
    out["n"] = out["n"].astype("int64")
    return out[REALISATION_TABLE_COLUMNS].reset_index(drop=True)
