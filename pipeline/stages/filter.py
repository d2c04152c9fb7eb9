"""Filter stage: scores every generated image with the out-of-class detectors.

Input rows follow :data:`pipeline.plan.schema.GENERATED` (one trajectory each, ``images``
aligned with ``scales``); output rows follow :data:`pipeline.plan.schema.FILTERED`, adding one
score list per detector plus ``n_pass`` and ``kept``.  All trajectories of a batch go
through each encoder in a single forward.  Rows that failed upstream (``error`` set)
pass through with empty lists so the writer can record them as failures.

The class names and shift texts of the filter's prompts come from the build's protocol
(:func:`pipeline.config.protocol.filter_class_name`, :func:`pipeline.config.protocol.filter_shift_text`):
under ``cns`` the original's Keras ImageNet names and the verbatim shift name.
"""

from __future__ import annotations

from typing import Any

from pipeline import registry

from pipeline.config import protocol

from pipeline.plan import schema
from pipeline.models.keep_all import KeepAll
from pipeline.stages.base import Stage, decode_image, pick_device

_ADDED = (*schema.SCORE_COLUMNS, "n_pass", "kept", *schema.REALISATION_COLUMNS)


class FilterStage(Stage):
    name = "filter"
    output_schema = schema.FILTERED

    @property
    def filter_class(self) -> type:
        """The configured filter's class (``KeepAll`` when the filter is disabled)."""
        spec = self.config.filter
        return registry.FILTERS.get(spec.kind) if spec.enabled else KeepAll

    @property
    def uses_torch(self) -> bool:
        return self.filter_class is not KeepAll

    def setup(self) -> None:
        """Pick the device and build the configured filter, in the configured precision."""
        cfg = self.config
        # Every shift's filter text resolved once, so the filter needs nothing but its spec.
        texts = {s: protocol.filter_shift_text(cfg, s) for s in cfg.all_shifts()}
        spec = cfg.filter.model_copy(update={"shift_text": texts})
        cls = self.filter_class
        # Keeping every image needs no device (nor torch, which choosing one imports).
        self.device = pick_device(self.device_override) if cls is not KeepAll else (self.device_override or "cpu")
        self.filter = cls(spec, self.device)
        if self.uses_torch:  # resources.filter.precision / channels_last (keeping all imports no torch)
            from pipeline.models.precision import ModelPrecision

            self.filter.set_precision(ModelPrecision.of(cfg.resources.filter))
        # Shifts of families that bypass the filter (e.g. corruptions): kept, scores NaN.
        self.unfiltered = {
            s
            for g in self.config.family_groups()
            if not registry.FAMILIES.get(g.kind).uses_ooc_filter(g.options)
            for s in g.shifts
        }

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """GENERATED rows -> FILTERED rows, same order."""
        todo = [
            i for i, r in enumerate(rows)
            if not r.get("error") and r.get("images") and r.get("shift") not in self.unfiltered
        ]
        items = [
            (
                [decode_image(b) for b in rows[i]["images"]],
                rows[i]["scales"],
                protocol.filter_class_name(self.config, int(rows[i]["class_id"])),
                rows[i]["shift"],
            )
            for i in todo
        ]
        results = dict(zip(todo, self.filter.evaluate(items))) if items else {}
        out = []
        for i, row in enumerate(rows):
            extra = results.get(i) or {k: [] for k in _ADDED}
            if i not in results and row.get("shift") in self.unfiltered and not row.get("error"):
                extra = _unscored(len(row.get("images") or []))
            if row.get("unusable") and extra.get("kept"):
                # The family marked the whole trajectory unusable (e.g. its object mask failed
                # the quality check): scored as usual, but every image is filtered out.
                extra = {**extra, "kept": [False] * len(extra["kept"])}
            out.append({**row, **extra})
        return out


def _unscored(n: int) -> dict[str, Any]:
    """Filter columns of images the filter does not judge: scores NaN, ``n_pass`` 0, kept."""
    nan = [float("nan")] * n
    return {
        **{c: list(nan) for c in (*schema.SCORE_COLUMNS, *schema.REALISATION_COLUMNS)},
        "n_pass": [0] * n,
        "kept": [True] * n,
    }
