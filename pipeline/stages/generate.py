"""Generate stage: work units (class, seed, shifts) -> trajectory rows with encoded images.

One call handles one (class, seed) group, so the pre-window steps and the scale-0 image
are shared by all its shifts (see ``pipeline.models.sampler``).  A group that raises is
returned as failed trajectory rows (``error`` set) instead of crashing the actor, so the
build completes and reports it.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from pipeline import plan, schema
from pipeline.models.sampler import encode_image
from pipeline.stages.base import Stage, pick_device, pick_dtype

log = logging.getLogger(__name__)


class GenerateStage(Stage):
    name = "generate"
    output_schema = schema.GENERATED

    def batch_keys(self, rows: list[dict[str, Any]]) -> list[str]:
        return [r["unit_id"] for r in rows]

    def fail_rows(self, rows: list[dict[str, Any]], message: str) -> list[dict[str, Any]]:
        return [f for row in rows for f in failed_rows(plan.WorkUnit.from_row(row), row["class_name"], message)]

    def setup(self) -> None:
        from pipeline.models.sampler import create_sampler

        cfg = self.config
        self.device = pick_device(self.device_override)
        self.sampler = create_sampler(
            cfg.generator, cfg.benchmark, self.device, pick_dtype(cfg.generator.dtype, self.device)
        )

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for row in rows:
            unit = plan.WorkUnit.from_row(row)
            try:
                out.extend(self.generate_unit(unit))
            except Exception as err:  # recorded per trajectory; the build goes on
                log.exception("generation failed for %s", unit.id)
                message = f"[generate] {type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"
                out.extend(failed_rows(unit, row["class_name"], message))
        return out

    def generate_unit(self, unit: plan.WorkUnit) -> list[dict[str, Any]]:
        cfg = self.config
        scales = list(cfg.benchmark.scales)
        if cfg.generator.share_prefix:
            result = self.sampler.generate_group(unit.class_id, unit.seed, list(unit.shifts), scales)
        else:
            result = self.sampler.reference_group(unit.class_id, unit.seed, list(unit.shifts), scales)
        fmt, quality = cfg.output.image_format, cfg.output.jpeg_quality
        encoded: dict[int, bytes] = {}  # scale-0 image is encoded once and shared by every shift

        def enc(img) -> bytes:
            if id(img) not in encoded:
                encoded[id(img)] = encode_image(img, fmt, quality)
            return encoded[id(img)]

        n = len(unit.shifts)
        rows = []
        for shift in unit.shifts:
            rows.append(
                {
                    "trajectory_id": plan.trajectory_id(shift, unit.class_id, unit.seed),
                    "unit_id": unit.id,
                    "class_id": unit.class_id,
                    "class_name": unit.class_name,
                    "seed": unit.seed,
                    "shift": shift,
                    "scales": scales,
                    "sample_ids": [plan.sample_id(shift, unit.class_id, unit.seed, s) for s in scales],
                    "images": [enc(result.image(shift, s)) for s in scales],
                    "unet_evals": result.unet_evals / n,
                    "gen_seconds": result.seconds / n,
                    "error": None,
                }
            )
        return rows


def failed_rows(unit: plan.WorkUnit, class_name: str, message: str) -> list[dict[str, Any]]:
    return [
        {
            "trajectory_id": plan.trajectory_id(shift, unit.class_id, unit.seed),
            "unit_id": unit.id,
            "class_id": unit.class_id,
            "class_name": class_name,
            "seed": unit.seed,
            "shift": shift,
            "scales": [],
            "sample_ids": [],
            "images": [],
            "unet_evals": 0.0,
            "gen_seconds": 0.0,
            "error": message,
        }
        for shift in unit.shifts
    ]
