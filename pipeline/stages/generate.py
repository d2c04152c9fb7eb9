"""Generate stage: work units (class, seed, shifts) -> trajectory rows with encoded images.

One call handles one (class, seed) unit.  Its shifts may belong to several families
(:meth:`pipeline.config.BuildConfig.family_groups`); families that generate from the seed
run first and share their scale-0 image with the transforming ones through the unit's
:class:`~pipeline.families.base.UnitContext`, which otherwise loads it from the build's
image source.  A family that raises fails its trajectories (``error`` set) instead of
crashing the actor, so the build completes and reports them.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from pipeline import plan, registry

from pipeline.errors import CnsbenchError
from pipeline.plan import schema
from pipeline.families.base import BaseImage, UnitContext
from pipeline.stages.base import Stage, encode_image, pick_device, pick_dtype

log = logging.getLogger(__name__)


class GenerateStage(Stage):
    name = "generate"
    output_schema = schema.GENERATED

    def batch_keys(self, rows: list[dict[str, Any]]) -> list[str]:
        return [r["unit_id"] for r in rows]

    def fail_rows(self, rows: list[dict[str, Any]], message: str) -> list[dict[str, Any]]:
        return [f for row in rows for f in failed_rows(plan.WorkUnit.from_row(row), row["class_name"], message)]

    def setup(self) -> None:
        cfg = self.config
        self.device = pick_device(self.device_override)
        dtype = pick_dtype(cfg.generator.dtype, self.device)
        groups = cfg.family_groups()
        families = [(g, registry.FAMILIES.get(g.kind)(cfg, g, self.device, dtype)) for g in groups]
        # Families that make their own scale 0 first: the others then reuse it.
        self.families = sorted(families, key=lambda gf: not gf[1].generates_base)
        for _, family in self.families:
            family.setup()
        self._source = None
        self._masks = None
        self._dtype = dtype

    def _load_base(self, ctx: UnitContext) -> BaseImage:
        cfg = self.config
        if self._source is None:
            self._source = registry.SOURCES.get(cfg.source.kind)(cfg, self.device, self._dtype)
            self._source.setup()
        return self._source.load(ctx)

    def _with_mask(self, ctx: UnitContext) -> BaseImage:
        base = ctx.base()
        if base.mask is None and base.unusable is None:
            cfg = self.config
            if self._masks is None:
                self._masks = registry.MASKS.get(cfg.source.masks.kind)(cfg, self.device, self._dtype)
                self._masks.setup()
            base.mask = self._masks.mask(ctx, base.image, base.info)
        return base

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for row in rows:
            unit = plan.WorkUnit.from_row(row)
            spent: list[float] = []  # the UNet work of the base images the unit's families read

            def load(ctx: UnitContext) -> BaseImage:
                base = self._load_base(ctx)
                spent.append(base.unet_evals)
                return base

            ctx = UnitContext(unit.class_id, unit.class_name, unit.seed, load)
            first = len(out)
            encoded: dict[int, tuple[Any, bytes]] = {}  # a scale-0 image shared by several shifts is encoded once
            for group, family in self.families:
                shifts = [s for s in unit.shifts if s in group.shifts]
                if not shifts:
                    continue
                try:
                    out.extend(self._family_rows(unit, ctx, family, shifts, list(group.scales), encoded))
                except Exception as err:  # recorded per trajectory; the build goes on
                    log.exception("generation failed for %s (%s)", unit.id, group.kind)
                    message = f"[generate] {type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"
                    out.extend(failed_rows(plan.WorkUnit(unit.class_id, unit.seed, tuple(shifts)), unit.class_name, message))
            charge_base(out[first:], sum(spent))
        return out

    def trajectory(self, class_id: int, seed: int, shift: str, scales: list[float]) -> dict[str, Any]:
        """One trajectory of ``shift`` at arbitrary ``scales`` -> a GENERATED row (the Serve preview).

        The same family call and image encoding as :meth:`process` (which is bound to the
        build's scale grids), so at the grid's scales it reproduces the stored images.
        Raises instead of returning a failed row.
        """
        self.ensure_setup()
        family = next((f for g, f in self.families if shift in g.shifts), None)
        if family is None:
            raise CnsbenchError(f"shift {shift!r} is not part of this build; its shifts: {self.config.all_shifts()}")
        class_name = self.config.benchmark.class_name(class_id)
        unit = plan.WorkUnit(class_id, seed, (shift,), class_name)
        ctx = UnitContext(class_id, class_name, seed, self._load_base)
        return self._family_rows(unit, ctx, family, [shift], list(scales), {})[0]

    def _family_rows(self, unit, ctx, family, shifts, scales, encoded) -> list[dict[str, Any]]:
        """The rows of one family's shifts of a unit (raises on failure)."""
        if family.needs_mask:
            self._with_mask(ctx)
        made = family.generate(ctx, shifts, scales)
        if family.needs_mask and ctx.base().unusable:
            for result in made.values():
                result.unusable = result.unusable or ctx.base().unusable
        return self._rows(unit, shifts, scales, made, encoded)

    def _rows(self, unit, shifts, scales, made, encoded) -> list[dict[str, Any]]:
        fmt, quality = self.config.output.image_format, self.config.output.jpeg_quality

        def enc(img) -> bytes:
            # Keyed by identity; the image is kept in the entry so its id cannot be reused.
            if id(img) not in encoded:
                encoded[id(img)] = (img, encode_image(img, fmt, quality))
            return encoded[id(img)][1]

        rows = []
        for shift in shifts:
            result = made[shift]
            if len(result.images) != len(scales):
                raise CnsbenchError(f"family returned {len(result.images)} images for {len(scales)} scales ({shift})")
            rows.append(
                schema.trajectory_row(
                    class_id=unit.class_id,
                    class_name=unit.class_name,
                    seed=unit.seed,
                    shift=shift,
                    scales=scales,
                    images=[enc(img) for img in result.images],
                    params=result.params,
                    unet_evals=result.unet_evals,
                    gen_seconds=result.seconds,
                    unusable=result.unusable,
                )
            )
        return rows


def charge_base(rows: list[dict[str, Any]], unet_evals: float) -> None:
    """Add the UNet work of a unit's base images (the seed source's generation) to the unit's
    first row that did not fail: a shard's ``stats.unet_evals`` sums those rows only."""
    target = next((r for r in rows if r["error"] is None), None)
    if unet_evals and target is not None:
        target["unet_evals"] += unet_evals


def failed_rows(unit: plan.WorkUnit, class_name: str, message: str) -> list[dict[str, Any]]:
    return [
        schema.trajectory_row(
            class_id=unit.class_id, class_name=class_name, seed=unit.seed, shift=shift, scales=[], images=[], error=message
        )
        for shift in unit.shifts
    ]
