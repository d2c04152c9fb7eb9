"""Refinement stages: images at scales between a build's grid points, for ``cnsbench refine``.

A refinement round makes one image per trajectory, at the midpoint of what is left of the
trajectory's first failing grid interval (docs/refine.md).  It runs the build's chain
shape, generate -> filter -> classify -> write, with two stages of its own:

* :class:`RefineGenerateStage` takes one row per (class, seed) unit listing its points
  (shift, scale, the trajectory's stored scale-0 image) and makes each point's image with
  the build's family, seed and settings: the slider family's points of a unit continue
  from the unit's one pre-window prefix, each as one branch (:mod:`.refine_sampling`, the
  prefix cached for the next round); any other family is called per distinct scale.  Its
  rows carry two images, the stored scale-0 reference and the new one, so the filter
  judges the new image against the same reference the build's filter used;
* :class:`RefineFilterStage` is the build's filter on those rows, after which the
  reference is dropped: a point's row holds its one image.

The classify stage and the writer are the build's.  A point's row is known by its
refinement key (:func:`point_key`: the sample id, i.e. trajectory and scale in
thousandths), which is what a refinement shard's manifest lists, so each (trajectory,
scale) image is committed once and every later classifier reuses it.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

import pyarrow as pa

from pipeline import plan
from pipeline.plan import schema
from pipeline.stages.filter import FilterStage
from pipeline.stages.generate import GenerateStage

log = logging.getLogger(__name__)

# Input rows of a round: one (class, seed) unit and its points, aligned lists.
REFINE_UNIT = pa.schema(
    list(schema.UNIT)
    + [
        ("scales", pa.list_(pa.float64())),
        ("references", pa.list_(pa.binary())),  # each point's trajectory's committed scale-0 image
    ]
)

# Per-image list columns of a FILTERED row (all aligned with ``scales``).
_PER_IMAGE = ("scales", "sample_ids", "images", "params", *schema.SCORE_COLUMNS, "n_pass", "kept",
              *schema.REALISATION_COLUMNS)


def _first_two(row: dict[str, Any]) -> dict[str, Any]:
    """A GENERATED row cut to its first two images (scale 0 and the point's scale)."""
    for key in ("scales", "sample_ids", "images", "params"):
        if row.get(key) is not None:
            row[key] = row[key][:2]
    return row


def point_key(shift: str, class_id: int, seed: int, scale: float) -> str:
    """The refinement key of the image of trajectory (shift, class, seed) at ``scale``: its sample id."""
    return plan.sample_id(shift, class_id, seed, scale)


class RefineGenerateStage(GenerateStage):
    """(class, seed) units with their points -> one GENERATED row per point: ``scales`` [0, s],
    ``images`` [stored scale-0 image, the new image at s]; ``trajectory_id`` is the point's key."""

    def batch_keys(self, rows: list[dict[str, Any]]) -> list[str]:
        return [r["unit_id"] for r in rows]

    def fail_rows(self, rows: list[dict[str, Any]], message: str) -> list[dict[str, Any]]:
        return [_failed(row, shift, scale, message) for row in rows for shift, scale in zip(row["shifts"], row["scales"])]

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for row in rows:
            unit = plan.WorkUnit(int(row["class_id"]), int(row["seed"]), tuple(row["shifts"]), row["class_name"])
            ctx = self.unit_context(unit)
            refs = {(sh, sc): ref for sh, sc, ref in zip(row["shifts"], row["scales"], row["references"])}
            for group, family in self.families:
                if self.shares_prefix(family):
                    out.extend(self.slider_rows(row, unit, family, [
                        (sh, float(sc)) for sh, sc in zip(row["shifts"], row["scales"]) if sh in group.shifts]))
                    continue
                # Any other family: one family call per distinct scale, at [0, scale, top]: the
                # grid's top scale is in every build's call, and a family may set a trajectory up
                # for its farthest level (ImageNet-E's position picks the direction in which
                # the top level's offset fits), so the call has it too and its image is dropped.
                by_scale: dict[float, list[str]] = {}
                for shift, scale in zip(row["shifts"], row["scales"]):
                    if shift in group.shifts:
                        by_scale.setdefault(float(scale), []).append(shift)
                top = float(max(group.scales))
                for scale, shifts in sorted(by_scale.items()):
                    try:
                        made = [_first_two(r) for r in self.family_rows(
                            unit, ctx, family, shifts, [0.0, scale] + ([top] if top > scale else []))]
                    except Exception as err:  # recorded per point; the round goes on
                        log.exception("refinement generation failed for %s at %s", unit.id, scale)
                        message = f"[generate] {type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"
                        out.extend(_failed(row, s, scale, message) for s in shifts)
                        continue
                    for made_row in made:
                        shift = made_row["shift"]
                        made_row["images"][0] = refs[(shift, scale)]  # the build's own reference
                        made_row["trajectory_id"] = point_key(shift, unit.class_id, unit.seed, scale)
                        out.append(made_row)
        return out

    def shares_prefix(self, family) -> bool:
        """Whether the family's points come from the slider sampler's shared prefix (:mod:`.refine_sampling`)."""
        from pipeline.families.slider import PromptFamily, SliderFamily

        return (isinstance(family, SliderFamily) and not isinstance(family, PromptFamily)
                and self.config.generator.share_prefix)

    def slider_rows(self, row: dict[str, Any], unit: plan.WorkUnit, family, points: list[tuple[str, float]]) -> list[dict[str, Any]]:
        """The points of one unit of the slider family: one window per point, one prefix per unit."""
        from pipeline.stages.base import encode_image
        from pipeline.stages.refine_sampling import generate_points

        if not points:
            return []
        refs = {(sh, float(sc)): ref for sh, sc, ref in zip(row["shifts"], row["scales"], row["references"])}
        try:
            images, evals, seconds = generate_points(family.sampler, unit.class_id, unit.seed, points)
        except Exception as err:  # recorded per point; the round goes on
            log.exception("refinement generation failed for %s", unit.id)
            message = f"[generate] {type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"
            return [_failed(row, sh, sc, message) for sh, sc in points]
        fmt, quality = self.config.output.image_format, self.config.output.jpeg_quality
        out = []
        for shift, scale in points:
            made = schema.trajectory_row(
                class_id=unit.class_id, class_name=unit.class_name, seed=unit.seed, shift=shift, scales=[0.0, scale],
                images=[refs[(shift, scale)], encode_image(images[(shift, scale)], fmt, quality)],
                unet_evals=evals / len(points), gen_seconds=seconds / len(points))
            made["trajectory_id"] = point_key(shift, unit.class_id, unit.seed, scale)
            out.append(made)
        return out

    def unit_context(self, unit: plan.WorkUnit):
        """The unit's context, as a build's generation makes it (base images from the build's source)."""
        from pipeline.families.base import UnitContext

        return UnitContext(unit.class_id, unit.class_name, unit.seed, self._load_base)

    def family_rows(self, unit, ctx, family, shifts: list[str], scales: list[float]) -> list[dict[str, Any]]:
        """The GENERATED rows of ``shifts`` of a unit at ``scales``: the build's family call and encoding."""
        return self._family_rows(unit, ctx, family, shifts, scales, {})


def _failed(row: dict[str, Any], shift: str, scale: float, message: str) -> dict[str, Any]:
    failed = schema.trajectory_row(class_id=int(row["class_id"]), class_name=row["class_name"], seed=int(row["seed"]),
                                   shift=shift, scales=[], images=[], error=message)
    failed["trajectory_id"] = point_key(shift, int(row["class_id"]), int(row["seed"]), scale)
    return failed


class RefineFilterStage(FilterStage):
    """The build's filter on [reference, point] rows, then the reference dropped: one image per row."""

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for row in super().process(rows):
            if not row.get("error") and len(row.get("scales") or []) == 2:
                row = {**row, **{k: row[k][1:] for k in _PER_IMAGE if row.get(k) is not None}}
            out.append(row)
        return out
