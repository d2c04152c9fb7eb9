"""The live preview on the ingress side: request validation, model calls, the answer.

A preview request names a (class, shift, seed) and optionally scales.  It is validated
(:class:`PreviewRequest` against the config's :class:`PreviewBounds`) before anything
reaches a model; :class:`PreviewService` then calls the generator deployment (generate +
filter) and the classifier deployment, and assembles per-scale images, filter scores,
keep decisions, predictions and failure points.  The keep decision is the filter's
(:func:`pipeline.models.detectors.keep_decision`, inside the generator deployment) and
the failure point the metrics' (:func:`pipeline.aggregate.metrics.first_failure`).
"""

from __future__ import annotations

import base64
import io
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from pipeline.errors import CnsbenchError
from pipeline.plan import schema
from pipeline.config import BuildConfig
from pipeline.serve.errors import InvalidRequest, NotFound, json_number
from pipeline.serve.options import IMAGE_TYPES, MAX_SEED, ServeOptions


@dataclass(frozen=True)
class PreviewBounds:
    """What a preview request may ask for: scales within [lo, hi], at most ``max_scales``."""

    lo: float
    hi: float
    max_scales: int

    @staticmethod
    def from_config(cfg: BuildConfig, factor: float, max_scales: int) -> "PreviewBounds":
        """The scale range of every family of the build, times ``factor`` (0 when none is negative)."""
        scales = [s for group in cfg.family_groups() for s in group.scales] or list(cfg.benchmark.scales)
        lo = factor * min(scales) if min(scales) < 0 else 0.0
        return PreviewBounds(lo=lo, hi=factor * max(scales), max_scales=max_scales)


ClassRef = StrictInt | Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]


class PreviewRequest(BaseModel):
    """Body of ``POST /api/preview`` (and the query of ``GET /api/preview/strip.png``).

    ``scales`` are checked against the :class:`PreviewBounds` passed as validation
    context ``{"bounds": ...}``; scale 0 (the filter's reference image) is always added.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)

    class_: ClassRef = Field(alias="class", description="class id or name, one of the config's classes")
    shift: str = Field(min_length=1, max_length=100)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    scales: list[float] | None = Field(None, min_length=1, max_length=64)

    @field_validator("seed", mode="before")
    @classmethod
    def _seed_not_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise CnsbenchError("seed must be an integer")
        return value

    @field_validator("scales", mode="before")
    @classmethod
    def _scales_not_bool(cls, value: Any) -> Any:
        if isinstance(value, list) and any(isinstance(v, bool) for v in value):
            raise CnsbenchError("scales must be numbers")
        return value

    @field_validator("scales")
    @classmethod
    def _scales_in_bounds(cls, value: list[float] | None, info: ValidationInfo) -> list[float] | None:
        if value is None:
            return None
        bounds: PreviewBounds | None = (info.context or {}).get("bounds")
        if bounds is None:
            raise CnsbenchError("no preview bounds configured")
        outside = [v for v in value if not bounds.lo <= v <= bounds.hi]
        if outside:
            raise CnsbenchError(f"scales must lie in [{bounds.lo:g}, {bounds.hi:g}], got {outside}")
        milli = [round(v * 1000) for v in value]
        if len(set(milli)) != len(milli):
            raise CnsbenchError("scales must be distinct (at 0.001 resolution)")
        n = len(set(milli) | {0})
        if n > bounds.max_scales:
            raise CnsbenchError(f"at most {bounds.max_scales} scales per preview (scale 0 included), got {n}")
        return value


def parse_preview(data: Any, bounds: PreviewBounds) -> PreviewRequest:
    """Validate a preview request; raises :class:`InvalidRequest` with pydantic's error list.

    Any JSON value is accepted as ``data`` (wrong types and nesting are validation
    errors, never exceptions of another kind).
    """
    try:
        return PreviewRequest.model_validate(data, context={"bounds": bounds})
    except ValidationError as err:
        raise InvalidRequest(err.errors(include_url=False, include_context=False, include_input=False)) from None


def normalize_scales(scales: Sequence[float]) -> list[float]:
    """Sorted, distinct at 1/1000 (the resolution of sample ids), with 0 added."""
    milli = sorted({round(float(s) * 1000) for s in scales} | {0})
    return [m / 1000 for m in milli]


@dataclass
class PreviewResult:
    """A generated, filtered and classified preview trajectory."""

    payload: dict[str, Any]  # JSON-ready, without the image bytes
    images: list[bytes]
    mime: str

    def to_json(self) -> dict[str, Any]:
        out = dict(self.payload)
        out["images"] = []
        for entry, data in zip(self.payload["images"], self.images):
            url = f"data:{self.mime};base64," + base64.b64encode(data).decode("ascii")
            out["images"].append({**entry, "image": url})
        return out


def strip_png(images: Sequence[bytes], gap: int = 4) -> bytes:
    """Images side by side (left to right, white gaps) as one PNG."""
    from PIL import Image

    pics = [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
    width = sum(p.width for p in pics) + gap * (len(pics) - 1)
    canvas = Image.new("RGB", (width, max(p.height for p in pics)), (255, 255, 255))
    x = 0
    for p in pics:
        canvas.paste(p, (x, 0))
        x += p.width + gap
    buf = io.BytesIO()
    canvas.save(buf, format="PNG")
    return buf.getvalue()


class PreviewService:
    """Validates preview requests, calls the model deployments and assembles the answer.

    ``generator`` and ``classifier`` are deployment handles (or anything whose
    ``generate.remote(...)`` / ``classify.remote(...)`` are awaitable).  Keeps the last
    ``cache_size`` results, so the strip PNG of a trajectory just previewed as JSON does
    not generate it again.
    """

    def __init__(self, cfg: BuildConfig, generator: Any, classifier: Any, options: ServeOptions) -> None:
        self.cfg = cfg
        self.generator = generator
        self.classifier = classifier
        self.labels = cfg.benchmark.label_space
        self.shifts = cfg.all_shifts()
        self.bounds = PreviewBounds.from_config(cfg, options.scale_bound_factor, options.max_preview_scales)
        self.classifier_names = [c.name for c in cfg.classifiers]
        self.mime = IMAGE_TYPES[cfg.output.image_format]
        self._cache: OrderedDict[tuple, PreviewResult] = OrderedDict()
        self._cache_size = options.preview_cache_size

    def class_choices(self) -> list[dict[str, Any]]:
        return [{"class_id": c, "class_name": self.labels.name(c)} for c in self.cfg.benchmark.classes]

    def describe(self) -> dict[str, Any]:
        from pipeline.config import config_hash

        b = self.cfg.benchmark
        return {
            "name": b.name,
            "config_hash": config_hash(self.cfg),
            "classes": self.class_choices(),
            "shifts": list(self.shifts),
            "seeds": list(b.seeds[:50]),
            "scales": list(b.scales),
            "scale_bounds": [self.bounds.lo, self.bounds.hi],
            "max_scales": self.bounds.max_scales,
            "seed_bounds": [0, MAX_SEED],
            "classifiers": self.classifier_names,
            "image_size": self.cfg.generator.image_size,
        }

    def resolve(self, req: PreviewRequest) -> tuple[int, str, list[float]]:
        """(class id, shift, scales) of a validated request; :class:`NotFound` for unknown names.

        Without ``scales`` the request gets its shift's scale grid of the build.
        """
        try:
            class_id = self.labels.resolve(req.class_)
        except (ValueError, TypeError, OverflowError) as err:
            raise NotFound(f"unknown class {req.class_!r}: {err}", self.class_choices()) from None
        if class_id not in self.cfg.benchmark.classes:
            raise NotFound(f"class {class_id} ({self.labels.name(class_id)}) is not in the config", self.class_choices())
        if req.shift not in self.shifts:
            raise NotFound(f"unknown shift {req.shift!r}", list(self.shifts))
        scales = normalize_scales(req.scales if req.scales is not None else self.cfg.scales_of(req.shift))
        return class_id, req.shift, scales

    async def run(self, req: PreviewRequest) -> PreviewResult:
        class_id, shift, scales = self.resolve(req)
        key = (class_id, shift, req.seed, tuple(scales))
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        start = time.perf_counter()
        generated = await self.generator.generate.remote(class_id, req.seed, shift, scales)
        gen_s = time.perf_counter() - start
        preds = await self.classifier.classify.remote(class_id, generated["images"], generated["scales"])
        result = self._assemble(class_id, generated, preds, gen_s, time.perf_counter() - start - gen_s)
        if self._cache_size:
            self._cache[key] = result
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return result

    def _label(self, class_id: int) -> str:
        if 0 <= class_id < len(self.labels):
            return self.labels.name(class_id)
        return "(unmapped)"  # a label map may leave classifier outputs without a class

    def _assemble(
        self, class_id: int, gen: dict[str, Any], preds: dict[str, list], gen_s: float, clf_s: float
    ) -> PreviewResult:
        import numpy as np

        from pipeline.aggregate.metrics import first_failure

        entries = []
        for i, scale in enumerate(gen["scales"]):
            predictions = {}
            for j, name in enumerate(self.classifier_names):
                top1 = int(preds["pred_top1"][i][j])
                predictions[name] = {
                    "top1": top1,
                    "top1_name": self._label(top1),
                    "top5": [int(t) for t in preds["pred_top5"][i][j]],
                    "p_true": json_number(preds["pred_p_true"][i][j]),
                    "correct": top1 == class_id,
                }
            scores = {c: json_number(gen[c][i]) for c in schema.SCORE_COLUMNS}
            entries.append(
                {
                    "scale": float(scale),
                    "sample_id": gen["sample_ids"][i],
                    "filter": {**scores, "n_pass": int(gen["n_pass"][i]), "kept": bool(gen["kept"][i])},
                    "predictions": predictions,
                }
            )
        # The benchmark's definition, here over every scale of the preview (kept or not).
        correct = np.array(
            [[e["predictions"][name]["correct"] for e in entries] for name in self.classifier_names], dtype=bool
        ).reshape(len(self.classifier_names), len(entries))
        fps = first_failure([e["scale"] for e in entries], correct)
        payload = {
            "trajectory_id": gen["trajectory_id"],
            "class_id": class_id,
            "class_name": gen["class_name"],
            "shift": gen["shift"],
            "seed": int(gen["seed"]),
            "scales": [float(s) for s in gen["scales"]],
            "classifiers": self.classifier_names,
            "complete": all(e["filter"]["kept"] for e in entries),
            "failure_points": {name: json_number(fp) for name, fp in zip(self.classifier_names, fps)},
            "images": entries,
            "timing": {"generate_s": round(gen_s, 3), "classify_s": round(clf_s, 3)},
        }
        return PreviewResult(payload=payload, images=list(gen["images"]), mime=self.mime)
