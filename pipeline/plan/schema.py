"""Arrow schemas of the rows that flow between stages (the output's stored tables: :mod:`pipeline.io.tables`).

Between stages a row is one trajectory (shift, class, seed) carrying all its scales as
lists: the filter needs each image's scale-0 reference, and a trajectory is the unit the
metrics use, so keeping it whole avoids any regrouping.  The writer explodes trajectory
rows into the per-image ``samples`` and per-(image, classifier) ``predictions`` tables.
"""

from __future__ import annotations

import pyarrow as pa

# The stored tables and the per-image score columns are the output's format: pipeline.io.tables.
from pipeline.io.tables import (  # noqa: E402,F401
    FAILURES, PREDICTIONS, REALISATION_COLUMNS, SAMPLES, SCORE_COLUMNS, UNIT_COORDINATES,
)

# Work units going into generation (see pipeline.plan.WorkUnit.to_row).
UNIT = pa.schema([("unit_id", pa.string())] + UNIT_COORDINATES + [("shifts", pa.list_(pa.string()))])

# The ids and coordinates of one trajectory, with its scales and their sample ids: the
# leading columns of every trajectory row, the stages' below and a source's pointer rows
# (pipeline.sources.common.SOURCE_ROW).
TRAJECTORY = pa.schema(
    [("trajectory_id", pa.string()), ("unit_id", pa.string())]
    + UNIT_COORDINATES
    + [("shift", pa.string()), ("scales", pa.list_(pa.float64())), ("sample_ids", pa.list_(pa.string()))]
)

# After generation: one row per trajectory.  `images[i]` is the encoded image at
# `scales[i]`; a failed trajectory has `error` set and empty lists.
GENERATED = pa.schema(
    list(TRAJECTORY)
    + [
        ("images", pa.list_(pa.binary())),
        ("unet_evals", pa.float64()),  # UNet sample-evaluations attributed to this trajectory
        ("gen_seconds", pa.float64()),  # generation wall time attributed to this trajectory
        ("error", pa.string()),
        # What the family did to each image (JSON object per image, or null), see PARAMS_NOTE.
        ("params", pa.list_(pa.string())),
        # Set when the trajectory is usable for nothing (e.g. its object mask failed the
        # quality check): every image is filtered out, the trajectory is not a failure.
        ("unusable", pa.string()),
    ]
)

# After the filter: per-image detector scores (NaN when a detector is disabled) and keep flags.
FILTERED = pa.schema(
    list(GENERATED)
    + [pa.field(name, pa.list_(pa.float64())) for name in SCORE_COLUMNS]
    + [("n_pass", pa.list_(pa.int64())), ("kept", pa.list_(pa.bool_()))]
    + [pa.field(name, pa.list_(pa.float64())) for name in REALISATION_COLUMNS]
)

# After classification: [image][classifier] in the config's classifier order.
CLASSIFIED = pa.schema(
    list(FILTERED)
    + [
        ("pred_top1", pa.list_(pa.list_(pa.int64()))),
        ("pred_top5", pa.list_(pa.list_(pa.list_(pa.int64())))),
        ("pred_p_true", pa.list_(pa.list_(pa.float64()))),
        # A vlm classifier's answer text and whether its protocol excluded it (null for the others).
        ("pred_answer", pa.list_(pa.list_(pa.string()))),
        ("pred_excluded", pa.list_(pa.list_(pa.bool_()))),
    ]
)

# Returned by the write stage to the driver, one row per committed shard.
WRITTEN = pa.schema(
    [
        ("shard", pa.string()),
        ("n_trajectories", pa.int64()),
        ("n_samples", pa.int64()),
        ("n_failed", pa.int64()),
        ("unet_evals", pa.float64()),
        ("gen_seconds", pa.float64()),
    ]
)


# ---- the one place a trajectory row is assembled ----------------------------------------
def trajectory_row(
    *,
    class_id: int,
    class_name: str,
    seed: int,
    shift: str,
    scales: list[float],
    images: list[bytes],
    params: list[dict | None] | None = None,
    unet_evals: float = 0.0,
    gen_seconds: float = 0.0,
    error: str | None = None,
    unusable: str | None = None,
) -> dict:
    """A :data:`GENERATED` row; ids follow :mod:`pipeline.plan` from the coordinates.

    A failed trajectory (``error`` set) carries empty scale, id, image and params lists.
    """
    import json

    from pipeline import plan
    if error is not None:
        scales, images, params = [], [], None
    if params is not None and len(params) != len(scales):
        raise ValueError(f"params has {len(params)} entries for {len(scales)} scales")
    return {
        "trajectory_id": plan.trajectory_id(shift, class_id, seed),
        "unit_id": plan.unit_id(class_id, seed),
        "class_id": int(class_id),
        "class_name": class_name,
        "seed": int(seed),
        "shift": shift,
        "scales": [float(s) for s in scales],
        "sample_ids": [plan.sample_id(shift, class_id, seed, s) for s in scales],
        "images": list(images),
        "unet_evals": float(unet_evals),
        "gen_seconds": float(gen_seconds),
        "error": error,
        "params": None if params is None else [None if p is None else json.dumps(p, sort_keys=True) for p in params],
        "unusable": unusable,
    }
