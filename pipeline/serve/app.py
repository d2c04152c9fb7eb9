"""Ray Serve application: preview sliders live and browse a built benchmark in a browser.

Role
----
``cnsbench serve`` (:func:`run_server`) and ``serve run pipeline.serve.app:build_app``
(:func:`build_app`, also named by ``deploy/serve.yaml`` and
``deploy/kuberay/rayservice.yaml``) start one Serve application with three deployments,
each scaled on its own:

* ``PreviewGenerator`` (:class:`PreviewGenerator`): the config's generator (SD2 + class
  token + LoRA slider, through :class:`~pipeline.stages.generate.GenerateStage`'s sampler)
  and its out-of-class filter (:class:`~pipeline.stages.filter.FilterStage`).  Actor
  resources and autoscaling come from ``resources.generate`` (``num_gpus``, ``num_cpus``;
  ``pool_size`` .. ``max_pool_size`` replicas).
* ``PreviewClassifier`` (:class:`PreviewClassifier`): every configured classifier
  (:class:`~pipeline.stages.classify.ClassifyStage`), from ``resources.classify``.
* ``Ingress`` (:class:`Ingress`): a FastAPI app -- the JSON API, the web page at ``/``,
  and an in-memory index (:class:`BenchmarkIndex`) of a build output's committed shards.

The two model deployments exist only with a config (``--config``); the benchmark browser
only with a build output (``--output``); at least one of them is required.

HTTP API
--------
``GET /healthz``                       always open; ``{"status": "ok"}``
``GET /``                              the web page (self-contained HTML+JS, no external resources)
``GET /api/info``                      what is loaded: benchmark summary, preview choices and bounds
``POST /api/preview``                  JSON ``{"class": id|name, "shift", "seed", "scales"?}`` ->
                                       per-scale image (base64 data URL), filter scores + keep
                                       decision, each classifier's top-1/top-5/p_true/correct,
                                       and the failure point of each classifier
``GET /api/preview/strip.png``         ``?class=&shift=&seed=&scales=0,0.5,...``: the images as one PNG
``GET /api/benchmarks/shifts``         shifts of the build with trajectory counts
``GET /api/benchmarks/classes``        ``?shift=``: classes (of that shift) with counts
``GET /api/benchmarks/trajectories``   ``?shift=&class_id=``: trajectories, samples ordered by
                                       scale (kept flag, scores, per-classifier prediction), and
                                       per-classifier failure points of complete trajectories
``GET /api/benchmarks/image/{id}``     the stored image of a sample id (PNG or JPEG)
``GET /api/report``                    ``report/metrics.json``
``GET /report/{file}``                 a file of ``report/`` (plots, CSVs, index.html)

Errors are JSON ``{"detail": ...}``; an unknown class or shift is a 404 whose body also
holds ``"choices"``.  Bad input is rejected before it reaches a model: 422 for invalid
values (scales outside ``[lo, hi]`` = the config's scale range times
``scale_bound_factor``, more than ``max_preview_scales`` scales, seed outside
``0..2**31-1``), 400 for a body that is not JSON, 415 for a preview POST that is not
``application/json``, 413 for a body over ``max_body_bytes`` (16 KiB).  Images are served
only for sample ids present in the samples index and report files only by names listed
in ``report/``: no filesystem path is ever built from request input.

Security
--------
With a token (``token`` arg / ``--token`` / ``$CNSBENCH_API_TOKEN``), every path except
``/`` and ``/healthz`` needs ``Authorization: Bearer <token>`` (401 otherwise); the page
asks for the token and sends it with every request.  :func:`run_server` binds
127.0.0.1 unless told otherwise, and on a loopback address only accepts loopback
``Host`` headers (DNS-rebinding guard).  The page is served with a strict
Content-Security-Policy (its one script pinned by hash, no external origin).
"""

# No `from __future__ import annotations`: FastAPI resolves the route signatures inside
# make_api() at definition time, and their types are imported there, not globally.

import base64
import hashlib
import hmac
import io
import json
import logging
import math
import os
import socket
import tarfile
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

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

from pipeline import plan, schema
from pipeline.config import BuildConfig, ConfigError, StageResources, load_config

if TYPE_CHECKING:  # heavy imports stay out of `cnsbench --help`
    import argparse

    import pandas as pd
    from fastapi import FastAPI
    from ray.serve import Application

log = logging.getLogger(__name__)

APP_NAME = "cnsbench"
TOKEN_ENV = "CNSBENCH_API_TOKEN"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
MAX_SEED = 2**31 - 1
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
#: Paths reachable without the token: the page itself carries no data.
PUBLIC_PATHS = frozenset({"/", "/healthz"})
IMAGE_TYPES = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "webp": "image/webp"}
REPORT_TYPES = {
    ".png": "image/png",
    ".csv": "text/csv; charset=utf-8",
    ".json": "application/json",
    ".html": "text/html; charset=utf-8",
}


# =========================================================================== options
class ServeOptions(BaseModel):
    """Arguments of :func:`build_app` (the ``args:`` of a Serve config, or ``serve run ... key=value``).

    At least one of ``config`` (live preview) and ``output`` (browse a build) is required.
    """

    model_config = ConfigDict(extra="forbid")

    config: str | None = Field(None, description="build config YAML: enables the live preview")
    output: str | None = Field(None, description="build output directory or URI: enables the benchmark browser")
    token: str | None = Field(None, description=f"bearer token for the API (default: ${TOKEN_ENV})")
    max_body_bytes: int = Field(16 * 1024, ge=256, le=10 * 1024 * 1024, description="larger request bodies get 413")
    max_preview_scales: int = Field(12, ge=1, le=64, description="scales per preview request, scale 0 included")
    scale_bound_factor: float = Field(
        2.0, gt=0, le=100, description="preview scales must lie in the config's scale range times this"
    )
    refresh_s: float = Field(10.0, ge=0, description="how often to look for new committed shards (0: never)")
    preview_cache_size: int = Field(16, ge=0, le=1024, description="preview results kept in the ingress")
    max_queued_previews: int = Field(16, ge=1, description="previews waiting per generator before 503")
    ingress_num_cpus: float = Field(0.25, gt=0, description="CPUs of the ingress replica")
    allowed_hosts: list[str] | None = Field(None, description="accepted Host headers (None: any)")

    @field_validator("token", mode="before")
    @classmethod
    def _blank_token(cls, value: Any) -> Any:
        # An empty --token or an empty env var must not silently mean "token ''".
        return None if isinstance(value, str) and not value.strip() else value


def deployment_options(res: StageResources, *, max_ongoing_requests: int, max_queued_requests: int) -> dict[str, Any]:
    """Serve options of a model deployment from a stage's ``resources`` entry.

    Replicas autoscale between ``pool_size`` and ``max_pool_size`` (``pool_size`` when
    unset) on ongoing requests, one model call per replica at a time.
    """
    return {
        "ray_actor_options": {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus},
        "autoscaling_config": {
            "min_replicas": res.pool_size,
            "initial_replicas": res.pool_size,
            "max_replicas": res.max_pool_size or res.pool_size,
            "target_ongoing_requests": 1,
        },
        "max_ongoing_requests": max_ongoing_requests,
        "max_queued_requests": max_queued_requests,
    }


# =========================================================================== errors
class NotFound(LookupError):
    """An unknown name in a request; the 404 body lists the valid ``choices``."""

    def __init__(self, message: str, choices: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.choices = list(choices)


class PreviewFailed(RuntimeError):
    """A model deployment raised while making a preview (HTTP 500 with the error)."""


class InvalidRequest(ValueError):
    """Request values that fail validation (HTTP 422)."""

    def __init__(self, errors: list[dict[str, Any]] | str) -> None:
        super().__init__(str(errors))
        self.errors = errors


def _missing(value: Any) -> bool:
    """None or NaN: a null of a Parquet column after ``to_pandas()``."""
    if value is None:
        return True
    try:
        return math.isnan(value)
    except TypeError:  # not a number at all
        return False


def _flag(value: Any) -> bool:
    """A nullable boolean column's value; null counts as False (as in the metrics)."""
    return False if _missing(value) else bool(value)


def _num(value: Any) -> float | None:
    """A float for JSON: NaN/inf (a disabled detector's score) become null."""
    if value is None:
        return None
    f = float(value)
    return f if math.isfinite(f) else None


# =========================================================================== preview requests
@dataclass(frozen=True)
class PreviewBounds:
    """What a preview request may ask for: scales within [lo, hi], at most ``max_scales``."""

    lo: float
    hi: float
    max_scales: int

    @staticmethod
    def from_config(cfg: BuildConfig, factor: float, max_scales: int) -> "PreviewBounds":
        scales = cfg.benchmark.scales
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
            raise ValueError("seed must be an integer")
        return value

    @field_validator("scales", mode="before")
    @classmethod
    def _scales_not_bool(cls, value: Any) -> Any:
        if isinstance(value, list) and any(isinstance(v, bool) for v in value):
            raise ValueError("scales must be numbers")
        return value

    @field_validator("scales")
    @classmethod
    def _scales_in_bounds(cls, value: list[float] | None, info: ValidationInfo) -> list[float] | None:
        if value is None:
            return None
        bounds: PreviewBounds | None = (info.context or {}).get("bounds")
        if bounds is None:
            raise ValueError("no preview bounds configured")
        outside = [v for v in value if not bounds.lo <= v <= bounds.hi]
        if outside:
            raise ValueError(f"scales must lie in [{bounds.lo:g}, {bounds.hi:g}], got {outside}")
        milli = [round(v * 1000) for v in value]
        if len(set(milli)) != len(milli):
            raise ValueError("scales must be distinct (at 0.001 resolution)")
        n = len(set(milli) | {0})
        if n > bounds.max_scales:
            raise ValueError(f"at most {bounds.max_scales} scales per preview (scale 0 included), got {n}")
        return value


def parse_preview(data: Any, bounds: PreviewBounds) -> PreviewRequest:
    """Validate a preview request; raises :class:`InvalidRequest` with pydantic's error list."""
    try:
        return PreviewRequest.model_validate(data, context={"bounds": bounds})
    except ValidationError as err:
        raise InvalidRequest(err.errors(include_url=False, include_context=False, include_input=False)) from None


def normalize_scales(scales: Sequence[float]) -> list[float]:
    """Sorted, distinct at 1/1000 (the resolution of sample ids), with 0 added."""
    milli = sorted({round(float(s) * 1000) for s in scales} | {0})
    return [m / 1000 for m in milli]


# =========================================================================== model deployments
def generate_row(stage: Any, class_id: int, seed: int, shift: str, scales: list[float]) -> dict[str, Any]:
    """One trajectory of a :class:`GenerateStage` at arbitrary ``scales`` -> a GENERATED row.

    The same sampler call and image encoding as ``GenerateStage.generate_unit`` (which is
    bound to the config's scales), so a preview at the config's scales reproduces the
    stored images.  ``scales`` must include 0: the filter compares against it.
    """
    cfg = stage.config
    if class_id not in cfg.benchmark.classes or shift not in cfg.benchmark.shifts:
        raise ValueError(f"({class_id}, {shift!r}) is not a (class, shift) of the config")
    if 0.0 not in scales:
        raise ValueError("scales must include 0 (the reference image of the trajectory)")
    from pipeline.models.sampler import encode_image

    stage.ensure_setup()
    if cfg.generator.share_prefix:
        result = stage.sampler.generate_group(class_id, seed, [shift], list(scales))
    else:
        result = stage.sampler.reference_group(class_id, seed, [shift], list(scales))
    fmt, quality = cfg.output.image_format, cfg.output.jpeg_quality
    return {
        "trajectory_id": plan.trajectory_id(shift, class_id, seed),
        "unit_id": plan.unit_id(class_id, seed),
        "class_id": class_id,
        "class_name": cfg.benchmark.class_name(class_id),
        "seed": seed,
        "shift": shift,
        "scales": list(scales),
        "sample_ids": [plan.sample_id(shift, class_id, seed, s) for s in scales],
        "images": [encode_image(result.image(shift, s), fmt, quality) for s in scales],
        "unet_evals": float(result.unet_evals),
        "gen_seconds": float(result.seconds),
        "error": None,
    }


class PreviewGenerator:
    """Serve deployment: the config's generator and OOC filter, loaded once per replica.

    ``generate(class_id, seed, shift, scales)`` returns a FILTERED row
    (:data:`pipeline.schema.FILTERED`): encoded images aligned with ``scales``, one score
    list per detector, ``n_pass`` and ``kept``.
    """

    def __init__(self, config: dict[str, Any], threads: int | None = None) -> None:
        from pipeline.stages.filter import FilterStage
        from pipeline.stages.generate import GenerateStage

        self._generate = GenerateStage(config, threads=threads)
        self._filter = FilterStage(config, threads=threads)
        # Load weights now so that the replica is only reported ready with its models.
        self._generate.ensure_setup()
        self._filter.ensure_setup()
        # The slider bank's routing is per-call state on a shared UNet: one call at a time.
        self._lock = threading.Lock()
        self._calls = 0
        self._images = 0

    def generate(self, class_id: int, seed: int, shift: str, scales: list[float]) -> dict[str, Any]:
        with self._lock:
            self._calls += 1
            row = generate_row(self._generate, int(class_id), int(seed), shift, [float(s) for s in scales])
            self._images += len(row["images"])
            return self._filter.process([row])[0]

    def stats(self) -> dict[str, int]:
        """Calls and images generated by this replica (observability; tests check rejects never arrive)."""
        return {"calls": self._calls, "images": self._images}


class PreviewClassifier:
    """Serve deployment: every configured classifier, loaded once per replica.

    ``classify(class_id, images)`` returns ``pred_top1``, ``pred_top5``, ``pred_p_true``
    as ``[image][classifier]`` lists in the config's classifier order.
    """

    def __init__(self, config: dict[str, Any], threads: int | None = None) -> None:
        from pipeline.stages.classify import ClassifyStage

        self._stage = ClassifyStage(config, threads=threads)
        self._stage.ensure_setup()
        self._lock = threading.Lock()
        self._calls = 0
        self._images = 0

    def classify(self, class_id: int, images: list[bytes]) -> dict[str, list]:
        row = {"class_id": int(class_id), "images": list(images), "error": None}
        with self._lock:
            self._calls += 1
            self._images += len(row["images"])
            out = self._stage.process([row])[0]
        return {k: out[k] for k in ("pred_top1", "pred_top5", "pred_p_true")}

    def stats(self) -> dict[str, int]:
        """Calls and images classified by this replica."""
        return {"calls": self._calls, "images": self._images}


# =========================================================================== preview (ingress side)
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

    Keeps the last ``cache_size`` results, so the strip PNG of a trajectory just
    previewed as JSON does not generate it again.
    """

    def __init__(self, cfg: BuildConfig, generator: Any, classifier: Any, options: ServeOptions) -> None:
        self.cfg = cfg
        self.generator = generator
        self.classifier = classifier
        self.labels = cfg.benchmark.label_space
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
            "shifts": list(b.shifts),
            "seeds": list(b.seeds[:50]),
            "scales": list(b.scales),
            "scale_bounds": [self.bounds.lo, self.bounds.hi],
            "max_scales": self.bounds.max_scales,
            "seed_bounds": [0, MAX_SEED],
            "classifiers": self.classifier_names,
            "image_size": self.cfg.generator.image_size,
        }

    def resolve(self, req: PreviewRequest) -> tuple[int, str, list[float]]:
        """(class id, shift, scales) of a validated request; :class:`NotFound` for unknown names."""
        try:
            class_id = self.labels.resolve(req.class_)
        except ValueError as err:
            raise NotFound(f"unknown class {req.class_!r}: {err}", self.class_choices()) from None
        if class_id not in self.cfg.benchmark.classes:
            raise NotFound(f"class {class_id} ({self.labels.name(class_id)}) is not in the config", self.class_choices())
        if req.shift not in self.cfg.benchmark.shifts:
            raise NotFound(f"unknown shift {req.shift!r}", list(self.cfg.benchmark.shifts))
        scales = normalize_scales(req.scales if req.scales is not None else self.cfg.benchmark.scales)
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
        preds = await self.classifier.classify.remote(class_id, generated["images"])
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
        entries = []
        for i, scale in enumerate(gen["scales"]):
            predictions = {}
            for j, name in enumerate(self.classifier_names):
                top1 = int(preds["pred_top1"][i][j])
                predictions[name] = {
                    "top1": top1,
                    "top1_name": self._label(top1),
                    "top5": [int(t) for t in preds["pred_top5"][i][j]],
                    "p_true": _num(preds["pred_p_true"][i][j]),
                    "correct": top1 == class_id,
                }
            scores = {c: _num(gen[c][i]) for c in schema.SCORE_COLUMNS}
            entries.append(
                {
                    "scale": float(scale),
                    "sample_id": gen["sample_ids"][i],
                    "filter": {**scores, "n_pass": int(gen["n_pass"][i]), "kept": bool(gen["kept"][i])},
                    "predictions": predictions,
                }
            )
        # Same definition as the benchmark: the smallest scale with a wrong prediction.
        fps = {
            name: next((e["scale"] for e in entries if not e["predictions"][name]["correct"]), None)
            for name in self.classifier_names
        }
        payload = {
            "trajectory_id": gen["trajectory_id"],
            "class_id": class_id,
            "class_name": gen["class_name"],
            "shift": gen["shift"],
            "seed": int(gen["seed"]),
            "scales": [float(s) for s in gen["scales"]],
            "classifiers": self.classifier_names,
            "complete": all(e["filter"]["kept"] for e in entries),
            "failure_points": fps,
            "images": entries,
            "timing": {"generate_s": round(gen_s, 3), "classify_s": round(clf_s, 3)},
        }
        return PreviewResult(payload=payload, images=list(gen["images"]), mime=self.mime)


# =========================================================================== benchmark index
@dataclass
class _Snapshot:
    """Everything the browse endpoints need, derived once from the committed shards."""

    key: tuple
    name: str
    config_hash: str | None
    scales: list[float]
    classifiers: list[str]
    labels: Any
    samples: "pd.DataFrame"  # positional rows; one per sample id
    groups: dict[tuple[str, int], Any]  # (shift, class_id) -> positions into samples
    preds: dict[str, dict[str, Any]]  # classifier -> {"top1", "p_true", "correct", "has"} arrays by position
    location: dict[str, tuple[str, str]]  # sample id -> (shard tar, member key)
    complete: set[str]
    failure_points: dict[tuple[str, str], float | None]
    shifts: list[dict[str, Any]]
    classes: dict[str, list[dict[str, Any]]]  # shift -> classes of that shift
    report_files: list[str]


def _open_output(output: str):
    """The :class:`OutputStore` of an existing build output, or a clear FileNotFoundError."""
    from pipeline.io.store import OutputStore

    if "://" not in output and not Path(output).is_dir():
        raise FileNotFoundError(f"output {output!r} is not a directory; build one with `cnsbench build CONFIG --output DIR`")
    store = OutputStore(output)
    if not store.exists("config.json"):
        raise FileNotFoundError(f"{store.url('config.json')} not found: is {output} a cnsbench build output?")
    return store


class BenchmarkIndex:
    """In-memory index of a build output: samples, predictions, failure points, tar offsets.

    Reads only shards vouched for by a manifest (as the aggregation does) and reloads
    when the set of manifests or report files changes (checked at most every
    ``refresh_s`` seconds), so a build still running shows up as it commits shards.
    Image bytes are read straight from the tar at the member's offset; the offsets of a
    shard are indexed on first use and kept.
    """

    def __init__(self, output: str, refresh_s: float = 10.0) -> None:
        self.store = _open_output(output)
        self.refresh_s = refresh_s
        self._lock = threading.RLock()
        self._tar_index: dict[str, dict[str, dict[str, tuple[int, int]]]] = {}
        self._snap = self._build(self._listing())
        self._checked = time.monotonic()

    # ------------------------------------------------------------------ loading
    def _listing(self) -> tuple:
        return (tuple(self.store.list("manifest", ".json")), tuple(self.store.list("report")))

    def _build(self, key: tuple) -> _Snapshot:
        import numpy as np
        import pandas as pd

        from pipeline.aggregate.metrics import complete_trajectories, failure_points
        from pipeline.aggregate.run import (
            load_output_config,
            load_predictions,
            load_samples,
        )

        cfg = load_output_config(self.store)
        try:
            digest = json.loads(self.store.read_text("config.json")).get("config_hash")
        except ValueError:
            digest = None
        scales = list(cfg.benchmark.scales)
        samples = load_samples(self.store).drop_duplicates("sample_id").reset_index(drop=True)
        preds = load_predictions(self.store)
        position = pd.Series(np.arange(len(samples)), index=samples["sample_id"].astype(str))

        # The config's classifiers, as the aggregation counts them (an output may hold
        # predictions of others, e.g. added later and not yet in its config).
        names = [c.name for c in cfg.classifiers]
        preds = preds[preds["classifier"].isin(names)].reset_index(drop=True)
        per_clf: dict[str, dict[str, Any]] = {}
        for name in names:
            g = preds[preds["classifier"] == name]
            pos = position.reindex(g["sample_id"].astype(str)).to_numpy()
            ok = ~np.isnan(pos)
            idx = pos[ok].astype(np.int64)
            arrays = {
                "has": np.zeros(len(samples), dtype=bool),
                "top1": np.full(len(samples), -1, dtype=np.int64),
                "p_true": np.full(len(samples), np.nan),
                "correct": np.zeros(len(samples), dtype=bool),
            }
            arrays["has"][idx] = g["correct"].notna().to_numpy()[ok]
            arrays["top1"][idx] = g["top1"].fillna(-1).astype(np.int64).to_numpy()[ok]
            arrays["p_true"][idx] = g["p_true"].astype(float).to_numpy()[ok]
            arrays["correct"][idx] = g["correct"].astype("boolean").fillna(False).astype(bool).to_numpy()[ok]
            per_clf[name] = arrays

        complete = complete_trajectories(samples, scales)
        fps = {
            (str(r.trajectory_id), str(r.classifier)): (None if pd.isna(r.failure_point) else float(r.failure_point))
            for r in failure_points(samples, preds, scales).itertuples(index=False)
        }
        groups = {(str(s), int(c)): idx for (s, c), idx in samples.groupby(["shift", "class_id"]).indices.items()}

        classes: dict[str, list[dict[str, Any]]] = {}
        for (shift, class_id), idx in sorted(groups.items()):
            tids = set(samples["trajectory_id"].iloc[idx].astype(str))
            classes.setdefault(shift, []).append(
                {
                    "class_id": class_id,
                    "class_name": str(samples["class_name"].iloc[idx[0]]),
                    "n_trajectories": len(tids),
                    "n_complete": len(tids & complete),
                }
            )
        shifts = []
        for shift in sorted(classes):
            shifts.append(
                {
                    "shift": shift,
                    "n_classes": len(classes[shift]),
                    "n_trajectories": sum(c["n_trajectories"] for c in classes[shift]),
                    "n_complete": sum(c["n_complete"] for c in classes[shift]),
                }
            )
        location = dict(zip(samples["sample_id"].astype(str), zip(samples["shard"].astype(str), samples["key"].astype(str))))
        return _Snapshot(
            key=key,
            name=cfg.benchmark.name,
            config_hash=digest,
            scales=scales,
            classifiers=names,
            labels=cfg.benchmark.label_space,
            samples=samples,
            groups=groups,
            preds=per_clf,
            location=location,
            complete=complete,
            failure_points=fps,
            shifts=shifts,
            classes=classes,
            report_files=sorted(rel.rsplit("/", 1)[-1] for rel in key[1]),
        )

    def snapshot(self) -> _Snapshot:
        """The current snapshot, reloaded first when the committed shards changed."""
        if self.refresh_s and time.monotonic() - self._checked >= self.refresh_s:
            with self._lock:
                if time.monotonic() - self._checked >= self.refresh_s:
                    key = self._listing()
                    if key != self._snap.key:
                        log.info("benchmark output changed; reloading the index")
                        self._snap = self._build(key)
                        self._tar_index.clear()  # a redone shard keeps its name but not its offsets
                    self._checked = time.monotonic()
        return self._snap

    # ------------------------------------------------------------------ queries
    def info(self) -> dict[str, Any]:
        snap = self.snapshot()
        return {
            "name": snap.name,
            "config_hash": snap.config_hash,
            "scales": snap.scales,
            "classifiers": snap.classifiers,
            "shifts": [s["shift"] for s in snap.shifts],
            "n_samples": len(snap.samples),
            "n_trajectories": int(sum(s["n_trajectories"] for s in snap.shifts)),
            "n_complete": int(sum(s["n_complete"] for s in snap.shifts)),
            "report": "metrics.json" in snap.report_files,
            "report_files": snap.report_files,
        }

    def shifts(self) -> dict[str, Any]:
        snap = self.snapshot()
        return {"shifts": snap.shifts, "scales": snap.scales, "classifiers": snap.classifiers}

    def _check_shift(self, snap: _Snapshot, shift: str) -> None:
        if shift not in snap.classes:
            raise NotFound(f"unknown shift {shift!r}", sorted(snap.classes))

    def classes(self, shift: str | None = None) -> dict[str, Any]:
        snap = self.snapshot()
        if shift is not None:
            self._check_shift(snap, shift)
            return {"shift": shift, "classes": snap.classes[shift]}
        merged: dict[int, dict[str, Any]] = {}
        for rows in snap.classes.values():
            for c in rows:
                m = merged.setdefault(c["class_id"], {**c, "n_trajectories": 0, "n_complete": 0})
                m["n_trajectories"] += c["n_trajectories"]
                m["n_complete"] += c["n_complete"]
        return {"shift": None, "classes": [merged[k] for k in sorted(merged)]}

    def trajectories(self, shift: str, class_id: int) -> dict[str, Any]:
        """Trajectories of (shift, class): samples by scale, predictions, failure points.

        ``failure_points[classifier]`` is the smallest scale at which the classifier is
        wrong, ``null`` if it is never wrong; it is given only for complete trajectories
        (every scale present and kept), the ones the metrics use, and is ``null`` as a
        whole for incomplete ones.
        """
        snap = self.snapshot()
        self._check_shift(snap, shift)
        idx = snap.groups.get((shift, int(class_id)))
        if idx is None:
            raise NotFound(f"class {class_id} has no trajectories for shift {shift!r}", snap.classes[shift])
        sub = snap.samples.iloc[idx].assign(row_pos=idx).sort_values(["seed", "trajectory_id", "scale"], kind="stable")
        out = []
        for tid, g in sub.groupby("trajectory_id", sort=False):
            tid = str(tid)
            complete = tid in snap.complete
            entries = []
            for r in g.itertuples(index=False):
                pos = int(r.row_pos)
                predictions = {}
                for name, a in snap.preds.items():
                    if not a["has"][pos]:
                        continue
                    top1 = int(a["top1"][pos])
                    predictions[name] = {
                        "top1": top1,
                        "top1_name": snap.labels.name(top1) if 0 <= top1 < len(snap.labels) else "(unmapped)",
                        "p_true": _num(a["p_true"][pos]),
                        "correct": bool(a["correct"][pos]),
                    }
                sid = str(r.sample_id)
                entries.append(
                    {
                        "sample_id": sid,
                        "scale": float(r.scale),
                        "kept": _flag(r.kept),
                        "n_pass": None if _missing(r.n_pass) else int(r.n_pass),
                        "scores": {c: _num(getattr(r, c)) for c in schema.SCORE_COLUMNS},
                        "image": "api/benchmarks/image/" + quote(sid, safe="/"),
                        "predictions": predictions,
                    }
                )
            fps = None
            if complete:
                fps = {n: snap.failure_points[(tid, n)] for n in snap.classifiers if (tid, n) in snap.failure_points}
            out.append(
                {
                    "trajectory_id": tid,
                    "seed": int(g["seed"].iloc[0]),
                    "complete": complete,
                    "failure_points": fps,
                    "samples": entries,
                }
            )
        return {
            "shift": shift,
            "class_id": int(class_id),
            "class_name": str(sub["class_name"].iloc[0]),
            "scales": snap.scales,
            "classifiers": snap.classifiers,
            "trajectories": out,
        }

    def image(self, sample_id: str) -> tuple[bytes, str] | None:
        """(bytes, content type) of a sample's stored image; None for an unknown sample id.

        ``sample_id`` is only used as a dictionary key: the shard and member come from
        the samples table, never from the request.
        """
        snap = self.snapshot()
        loc = snap.location.get(sample_id)
        if loc is None:
            return None
        shard, key = loc
        members = self._members(shard).get(key, {})
        for ext, mime in IMAGE_TYPES.items():
            if ext in members:
                offset, size = members[ext]
                with self.store.fs.open(self.store.path(shard), "rb") as fh:
                    fh.seek(offset)
                    data = fh.read(size)
                if len(data) != size:
                    raise ValueError(f"{self.store.url(shard)} is truncated at member {key}.{ext}")
                return data, mime
        raise ValueError(f"{self.store.url(shard)} has no image member for sample {key!r}")

    def _members(self, shard: str) -> dict[str, dict[str, tuple[int, int]]]:
        """Member key -> {extension: (data offset, size)} of a tar shard; read once, then cached."""
        with self._lock:
            cached = self._tar_index.get(shard)
            if cached is not None:
                return cached
            index: dict[str, dict[str, tuple[int, int]]] = {}
            try:
                with self.store.fs.open(self.store.path(shard), "rb") as fh, tarfile.open(fileobj=fh, mode="r:") as tar:
                    for info in tar:
                        if not info.isfile():
                            continue
                        head, _, tail = info.name.rpartition("/")
                        stem, _, ext = tail.partition(".")
                        key = f"{head}/{stem}" if head else stem
                        index.setdefault(key, {})[ext] = (info.offset_data, info.size)
            except (tarfile.TarError, EOFError) as err:
                raise ValueError(f"malformed WebDataset shard {self.store.url(shard)}: {err}") from None
            self._tar_index[shard] = index
            return index

    def report_metrics(self) -> bytes:
        snap = self.snapshot()
        if "metrics.json" not in snap.report_files:
            raise NotFound("no report yet: run `cnsbench aggregate` on the output", [])
        return self.store.read_bytes("report/metrics.json")

    def report_file(self, name: str) -> tuple[bytes, str]:
        """A report file by its listed name; the path is built from the listing, not the request."""
        snap = self.snapshot()
        for listed in snap.report_files:
            suffix = "." + listed.rsplit(".", 1)[-1] if "." in listed else ""
            if listed == name and suffix in REPORT_TYPES:
                return self.store.read_bytes(f"report/{listed}"), REPORT_TYPES[suffix]
        raise NotFound(f"no report file {name!r}", [f for f in snap.report_files if "." + f.rsplit(".", 1)[-1] in REPORT_TYPES])


# =========================================================================== HTTP plumbing
def _app_path(scope: dict[str, Any]) -> str:
    """Request path relative to the app's route prefix."""
    path = scope.get("path", "")
    root = scope.get("root_path", "") or ""
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    return path


async def _send_json(send: Any, status: int, body: dict[str, Any], headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": data})


class BearerAuth:
    """ASGI middleware: every path except :data:`PUBLIC_PATHS` needs ``Authorization: Bearer <token>``.

    Protects by default (the report files and any path added later included), compares
    in constant time; no token configured means no check.
    """

    def __init__(self, app: Any, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.token and _app_path(scope) not in PUBLIC_PATHS:
            header = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
            scheme, _, credentials = header.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(credentials.strip(), self.token):
                await _send_json(
                    send, 401, {"detail": "missing or wrong bearer token"}, [(b"www-authenticate", b'Bearer realm="cnsbench"')]
                )
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """ASGI middleware: request bodies over ``max_bytes`` get 413 before any handler runs.

    Checks the declared Content-Length first, then counts what actually arrives (chunked
    bodies declare none); the body is small by construction, so it is buffered and
    replayed to the app.
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _too_large(self, send: Any) -> None:
        await _send_json(send, 413, {"detail": f"request body larger than {self.max_bytes} bytes"})

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope.get("headers", []) if k == b"content-length"), None)
        if declared is not None:
            try:
                if int(declared) > self.max_bytes:
                    await self._too_large(send)
                    return
            except ValueError:
                await _send_json(send, 400, {"detail": "invalid Content-Length"})
                return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # client went away; the app sees the disconnect on its own receive
            body.extend(message.get("body", b""))
            if len(body) > self.max_bytes:
                await self._too_large(send)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class SecurityHeaders:
    """ASGI middleware: ``nosniff`` and ``no-referrer`` on every response."""

    HEADERS = ((b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"))

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.HEADERS]}
            await send(message)

        await self.app(scope, receive, with_headers)


def make_api(
    index: BenchmarkIndex | None,
    preview: PreviewService | None,
    *,
    token: str | None = None,
    max_body_bytes: int = 16 * 1024,
    allowed_hosts: Sequence[str] | None = None,
) -> "FastAPI":
    """The FastAPI app of the ingress (see the module docstring for the endpoints)."""
    from fastapi import FastAPI, Query, Request
    from fastapi.responses import HTMLResponse, JSONResponse, Response

    app = FastAPI(title="cnsbench", docs_url=None, redoc_url=None, openapi_url="/api/openapi.json")

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, err: NotFound) -> JSONResponse:
        return JSONResponse({"detail": err.message, "choices": err.choices}, status_code=404)

    @app.exception_handler(PreviewFailed)
    async def _failed(_: Request, err: PreviewFailed) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=500)

    @app.exception_handler(InvalidRequest)
    async def _invalid(_: Request, err: InvalidRequest) -> JSONResponse:
        return JSONResponse({"detail": err.errors}, status_code=422)

    def need_index() -> BenchmarkIndex:
        if index is None:
            raise NotFound("no benchmark loaded: start the server with --output DIR")
        return index

    def need_preview() -> PreviewService:
        if preview is None:
            raise NotFound("live preview is off: start the server with --config CONFIG")
        return preview

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/", response_class=HTMLResponse)
    def page() -> HTMLResponse:
        return HTMLResponse(PAGE, headers={"content-security-policy": PAGE_CSP, "cache-control": "no-cache"})

    @app.get("/api/info")
    def api_info() -> dict[str, Any]:
        bench = index.info() if index else None
        prev = preview.describe() if preview else None
        same = None
        if bench and prev:
            same = bench["config_hash"] == prev["config_hash"]
        return {"app": APP_NAME, "benchmark": bench, "preview": prev, "same_config": same}

    async def run_preview(data: Any) -> PreviewResult:
        svc = need_preview()
        req = parse_preview(data, svc.bounds)
        try:
            return await svc.run(req)
        except (NotFound, InvalidRequest):
            raise
        except Exception as err:
            # Serve's own overload errors keep their 503 handlers; anything else is a model failure.
            from ray.serve.exceptions import (
                BackPressureError,
                DeploymentUnavailableError,
            )

            if isinstance(err, (BackPressureError, DeploymentUnavailableError)):
                raise
            log.exception("preview failed")
            raise PreviewFailed(f"preview failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from err

    @app.post("/api/preview")
    async def api_preview(request: Request) -> Response:
        need_preview()
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            # Also keeps cross-site "simple" POSTs (text/plain forms) from reaching the GPU.
            return JSONResponse({"detail": "Content-Type must be application/json"}, status_code=415)
        try:
            data = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as err:
            return JSONResponse({"detail": f"request body is not valid JSON: {err}"}, status_code=400)
        return JSONResponse((await run_preview(data)).to_json())

    @app.get("/api/preview/strip.png")
    async def api_preview_strip(request: Request) -> Response:
        need_preview()
        q = request.query_params
        unknown = sorted(set(q) - {"class", "shift", "seed", "scales"})
        if unknown:
            raise InvalidRequest([{"loc": ["query", k], "msg": "unknown parameter", "type": "extra_forbidden"} for k in unknown])
        data: dict[str, Any] = {k: q[k] for k in ("class", "shift", "seed") if k in q}
        if "scales" in q:
            try:
                data["scales"] = [float(s) for s in q["scales"].split(",") if s.strip()]
            except ValueError:
                raise InvalidRequest([{"loc": ["query", "scales"], "msg": "comma-separated numbers", "type": "float_parsing"}]) from None
        result = await run_preview(data)
        return Response(strip_png(result.images), media_type="image/png")

    @app.get("/api/benchmarks/shifts")
    def api_shifts() -> dict[str, Any]:
        return need_index().shifts()

    @app.get("/api/benchmarks/classes")
    def api_classes(shift: str | None = Query(None, max_length=100)) -> dict[str, Any]:
        return need_index().classes(shift)

    @app.get("/api/benchmarks/trajectories")
    def api_trajectories(
        shift: str = Query(..., max_length=100), class_id: int = Query(..., ge=0, le=10**9)
    ) -> dict[str, Any]:
        return need_index().trajectories(shift, class_id)

    @app.get("/api/benchmarks/image/{sample_id:path}")
    def api_image(sample_id: str) -> Response:
        found = need_index().image(sample_id)
        if found is None:
            # No choices here: the list of every sample id is not an error message.
            return JSONResponse({"detail": "unknown sample id"}, status_code=404)
        data, mime = found
        return Response(data, media_type=mime, headers={"cache-control": "private, max-age=3600"})

    @app.get("/api/report")
    def api_report() -> Response:
        return Response(need_index().report_metrics(), media_type="application/json")

    @app.get("/report/{name}")
    def report_file(name: str) -> Response:
        data, mime = need_index().report_file(name)
        headers = {"content-security-policy": "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'"}
        return Response(data, media_type=mime, headers=headers)

    # Starlette runs the last added middleware first: hosts, then auth, then the body limit.
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(BearerAuth, token=token)
    app.add_middleware(SecurityHeaders)
    if allowed_hosts:
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))
    return app


class Ingress:
    """Serve ingress deployment: builds the FastAPI app per replica (see :func:`make_api`).

    ``generator`` / ``classifier`` are handles of the model deployments (None without a
    config).  The token falls back to ``$CNSBENCH_API_TOKEN`` of the replica's process,
    so a cluster can inject it from a secret instead of the Serve config.
    """

    def __init__(
        self, options: dict[str, Any], config: dict[str, Any] | None, generator: Any = None, classifier: Any = None
    ) -> None:
        self.options = ServeOptions.model_validate(options)
        self.token = self.options.token or os.environ.get(TOKEN_ENV) or None
        self.index = BenchmarkIndex(self.options.output, self.options.refresh_s) if self.options.output else None
        self.preview = None
        if config is not None and generator is not None and classifier is not None:
            cfg = BuildConfig.model_validate(config)
            self.preview = PreviewService(cfg, generator, classifier, self.options)

    def __serve_build_asgi_app__(self) -> "FastAPI":
        return make_api(
            self.index,
            self.preview,
            token=self.token,
            max_body_bytes=self.options.max_body_bytes,
            allowed_hosts=self.options.allowed_hosts,
        )


# =========================================================================== application
def make_app(options: ServeOptions) -> "Application":
    """The Serve application for ``options`` (see :class:`ServeOptions`)."""
    from ray import serve

    if not options.config and not options.output:
        raise ConfigError("serve needs --config CONFIG (live preview) and/or --output DIR (browse a build)")
    cfg = load_config(options.config) if options.config else None
    if cfg is not None:
        from pipeline.assets import check_build

        # Every model file and slider the preview could load, checked before any replica
        # starts (a replica failing in its constructor would be retried, not reported).
        check_build(cfg)
    if options.output:
        _open_output(options.output)  # fail here, with the path, rather than in a replica
    cfg_dict = cfg.model_dump(mode="json") if cfg is not None else None
    options = options.model_copy(update={"token": options.token or os.environ.get(TOKEN_ENV) or None})

    generator = classifier = None
    if cfg is not None:
        gen_res, clf_res = cfg.resources.generate, cfg.resources.classify
        generator = (
            serve.deployment(name="PreviewGenerator")(PreviewGenerator)
            .options(**deployment_options(gen_res, max_ongoing_requests=1, max_queued_requests=options.max_queued_previews))
            .bind(cfg_dict, threads=max(1, int(gen_res.num_cpus)))
        )
        classifier = (
            serve.deployment(name="PreviewClassifier")(PreviewClassifier)
            .options(
                **deployment_options(clf_res, max_ongoing_requests=2, max_queued_requests=4 * options.max_queued_previews)
            )
            .bind(cfg_dict, threads=max(1, int(clf_res.num_cpus)))
        )
    ingress = serve.deployment(
        name="Ingress",
        ray_actor_options={"num_cpus": options.ingress_num_cpus},
        max_ongoing_requests=64,  # the page loads many small images at once
    )(serve.ingress()(Ingress))
    return ingress.bind(options.model_dump(), cfg_dict, generator, classifier)


def build_app(args: dict[str, Any] | None = None) -> "Application":
    """Application builder for ``serve run pipeline.serve.app:build_app config=... output=...``
    and the ``args:`` of a Serve config file; keys are those of :class:`ServeOptions`."""
    try:
        options = ServeOptions.model_validate(dict(args or {}))
    except ValidationError as err:
        lines = [f"  {'.'.join(map(str, e['loc'])) or '<args>'}: {e['msg']}" for e in err.errors()]
        raise ConfigError("invalid cnsbench serve args:\n" + "\n".join(lines)) from None
    return make_app(options)


def _is_loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def _check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as err:
            raise ValueError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None


def _wait_until_serving(host: str, port: int, timeout: float = 30.0) -> None:
    """Fail loudly when nothing answers at host:port after ``serve.run``.

    Serve keeps the HTTP options of an instance already running in the cluster (it only
    logs that new ones are ignored), so the app could be up on another port than asked.
    """
    import urllib.error
    import urllib.request

    probe = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    if ":" in probe and not probe.startswith("["):
        probe = f"[{probe}]"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://{probe}:{port}/healthz", timeout=5):
                return
        except urllib.error.HTTPError:
            return  # something of ours answered (e.g. a Host check); it is serving
        except OSError as err:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the app is deployed but nothing answers on {host}:{port} ({err}); is Serve already "
                    "running in this Ray cluster with other http options? `serve shutdown` it first"
                ) from None
            time.sleep(0.5)


def run_server(
    config: str | None = None,
    output: str | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str | None = None,
    blocking: bool = True,
    *,
    echo: Any = print,
    **options: Any,
) -> str:
    """Start the app on a local Ray (or the one already initialised) at ``http://host:port/``.

    Returns the URL once every deployment is ready; with ``blocking`` it then serves
    until interrupted and shuts Serve (and a Ray it started) down.  Extra keyword
    arguments are :class:`ServeOptions` fields.  On a loopback ``host`` only loopback
    ``Host`` headers are accepted unless ``allowed_hosts`` says otherwise.
    """
    import ray
    from ray import serve

    if not 1 <= int(port) <= 65535:
        raise ValueError(f"port must be in 1..65535, got {port}")
    token = token or os.environ.get(TOKEN_ENV) or None
    if options.get("allowed_hosts") is None and _is_loopback(host):
        options["allowed_hosts"] = ["127.0.0.1", "localhost", "[::1]"]
    opts = ServeOptions(config=config, output=output, token=token, **options)
    app = make_app(opts)  # validates config and output before anything starts
    if not _is_loopback(host) and not opts.token:
        echo(f"[cnsbench] WARNING: serving on {host} without a token: anyone who reaches it can use the API")
    _check_port_free(host, port)

    started_ray = False
    if not ray.is_initialized():
        from pipeline.runners.ray_runner import init_ray

        sizing = load_config(config) if config else None
        if sizing is None and output:
            from pipeline.aggregate.run import load_output_config

            sizing = load_output_config(_open_output(output))
        init_ray(None, sizing) if sizing is not None else ray.init(include_dashboard=False)
        started_ray = True
    try:
        serve.start(http_options={"host": host, "port": int(port)})
        serve.run(app, name=APP_NAME, route_prefix="/")
    except BaseException:
        if started_ray:
            serve.shutdown()
            ray.shutdown()
        raise
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    url = f"http://{shown}:{int(port)}/"
    _wait_until_serving(host, int(port))
    echo(f"[cnsbench] serving {url}" + (" (API token required)" if opts.token else ""))
    if not blocking:
        return url
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        echo("[cnsbench] stopping")
    finally:
        serve.shutdown()
        if started_ray:
            ray.shutdown()
    return url


def _cmd_serve(args: "argparse.Namespace") -> int:
    run_server(args.config, args.output, host=args.host, port=args.port, token=args.token, blocking=True)
    return 0


def add_cli(subparsers: Any) -> None:
    """Register ``cnsbench serve`` on the CLI's subparsers (``func(args) -> exit code``)."""
    s = subparsers.add_parser(
        "serve",
        help="web UI + API: browse a build (--output) and preview sliders live (--config)",
        description="Serve the cnsbench web page and JSON API with Ray Serve. Give --output to browse "
        "a built benchmark, --config to generate, filter and classify trajectories live, or both.",
    )
    s.add_argument("--output", help="build output directory or URI to browse")
    s.add_argument("--config", help="build config whose generator, filter and classifiers run the live preview")
    s.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}: this machine only)")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    s.add_argument(
        "--token",
        default=None,
        help=f"require 'Authorization: Bearer TOKEN' on the API (default: ${TOKEN_ENV}; prefer the env var, "
        "a command line is visible to other local users)",
    )
    s.set_defaults(func=_cmd_serve)


# =========================================================================== the web page
_STYLE = """
:root { --fg:#1d232b; --muted:#6a7380; --bg:#f6f7f9; --card:#fff; --line:#dde1e6; --bad:#c62828; --ok:#2e7d32; }
* { box-sizing: border-box; }
[hidden] { display: none !important; }
body { margin:0; font:14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color:var(--fg); background:var(--bg); }
header { display:flex; gap:16px; align-items:center; padding:10px 18px; background:#20262e; color:#fff; flex-wrap:wrap; }
header h1 { font-size:18px; margin:0; }
#status { color:#cfd6de; } #status.error { color:#ffb4a9; font-weight:600; }
#token-form { margin-left:auto; display:flex; gap:6px; align-items:center; }
main { padding:12px 18px; display:grid; gap:14px; }
section { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:12px 14px; }
section h2 { font-size:15px; margin:0 0 10px; }
.controls { display:flex; gap:14px; align-items:center; flex-wrap:wrap; margin-bottom:8px; }
label { color:var(--muted); } select, input { font:inherit; padding:3px 6px; }
#legend, #preview-legend { display:flex; gap:12px; flex-wrap:wrap; margin:6px 0 10px; color:var(--muted); }
.key { display:inline-flex; gap:5px; align-items:center; }
.swatch { width:12px; height:12px; border-radius:3px; display:inline-block; }
.traj { border-top:1px solid var(--line); padding:8px 0; }
.traj-head { margin-bottom:6px; display:flex; gap:8px; align-items:baseline; flex-wrap:wrap; }
.muted { color:var(--muted); }
.tag { font-size:12px; padding:1px 6px; border-radius:9px; background:#fff3e0; color:#8a4b00; }
.tag.ok { background:#e8f5e9; color:var(--ok); }
.cells { display:flex; gap:14px; flex-wrap:wrap; }
figure.cell { margin:0; width:124px; }
.frame { width:116px; height:116px; margin:6px; border-radius:3px; background:#eceff3; }
.frame img { width:116px; height:116px; display:block; image-rendering:pixelated; border-radius:3px; }
figure.filtered img { filter:grayscale(1); opacity:.35; }
figure.filtered figcaption { color:var(--bad); }
figcaption { font-size:12px; color:var(--muted); text-align:center; }
.badges { display:flex; gap:3px; justify-content:center; min-height:18px; flex-wrap:wrap; }
.badge { font-size:11px; color:#fff; padding:0 5px; border-radius:8px; font-weight:600; }
.dots { display:flex; gap:3px; justify-content:center; margin-top:2px; }
.dot { width:9px; height:9px; border-radius:50%; border:2px solid; display:inline-block; }
.dot.right { background:var(--ok); } .dot.wrong { background:#fff; }
.scores { font-size:11px; color:var(--muted); text-align:center; }
#plots { display:flex; gap:12px; flex-wrap:wrap; } #plots img { max-width:min(100%, 560px); border:1px solid var(--line); }
table { border-collapse:collapse; margin-bottom:10px; } th, td { border-bottom:1px solid var(--line); padding:3px 8px; text-align:right; }
th:first-child, td:first-child { text-align:left; }
.note { color:var(--muted); font-size:12px; }
button { font:inherit; padding:3px 12px; cursor:pointer; }
"""

_SCRIPT = r"""
"use strict";
const PALETTE = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42a5a5", "#f032e6", "#9a6324", "#808000", "#000075"];
const TOKEN_KEY = "cnsbench-api-token";
const MAX_CLASSES_ALL = 10;
const state = { token: sessionStorage.getItem(TOKEN_KEY) || "", info: null, colors: new Map(), blobs: new Map(), seq: 0 };
const $ = (sel) => document.querySelector(sel);

function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "style") e.style.cssText = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : String(c));  // text nodes: data never becomes markup
  }
  return e;
}
function setStatus(msg, isError) { const s = $("#status"); s.textContent = msg || ""; s.className = isError ? "error" : ""; }
function fmt(x) { return x === null || x === undefined ? "–" : (Math.round(x * 1000) / 1000).toString(); }
function color(name) {
  if (!state.colors.has(name)) state.colors.set(name, PALETTE[state.colors.size % PALETTE.length]);
  return state.colors.get(name);
}
function abbrev(name) { return name.length <= 10 ? name : name.slice(0, 9) + "…"; }
function choiceLabel(c) { return typeof c === "object" && c ? (c.class_name ? `${c.class_name} (${c.class_id})` : JSON.stringify(c)) : String(c); }

async function api(path, options) {
  options = options || {};
  const headers = Object.assign({}, options.headers || {});
  if (state.token) headers["Authorization"] = "Bearer " + state.token;
  const resp = await fetch(path, Object.assign({}, options, { headers }));
  if (resp.status === 401) { $("#token-form").hidden = false; throw new Error("this server needs an API token (top right)"); }
  if (!resp.ok) {
    let detail = resp.statusText;
    try {
      const body = await resp.json();
      detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
      if (body.choices && body.choices.length) detail += "; choices: " + body.choices.map(choiceLabel).join(", ");
    } catch (e) { /* not JSON */ }
    throw new Error(`${resp.status}: ${detail}`);
  }
  return resp;
}
async function getJSON(path) { return (await api(path)).json(); }
function blobURL(path) {
  // Images go through fetch (not <img src>) so that the bearer token is sent with them.
  if (!state.blobs.has(path)) state.blobs.set(path, api(path).then((r) => r.blob()).then((b) => URL.createObjectURL(b)));
  return state.blobs.get(path);
}
function loadInto(img, path) {
  blobURL(path).then((u) => { img.src = u; }).catch((e) => { img.alt = "failed: " + e.message; img.classList.add("broken"); });
}

function legend(box, names) {
  box.replaceChildren(
    h("span", {}, "failure point (first wrong scale) of:"),
    ...names.map((n) => h("span", { class: "key" }, h("span", { class: "swatch", style: "background:" + color(n) }), n)),
    h("span", { class: "key" }, h("span", { class: "swatch", style: "background:#ccc" }), "greyed = removed by the OOC filter"),
  );
}

function tooltip(s, names) {
  const lines = [`${s.sample_id}`, `scale ${fmt(s.scale)} · ${s.kept ? "kept" : "filtered out"}`];
  if (s.scores) {
    lines.push("filter: " + Object.entries(s.scores).map(([k, v]) => `${k}=${fmt(v)}`).join(" ") + (s.n_pass !== null && s.n_pass !== undefined ? ` (pass ${s.n_pass}/4)` : ""));
  }
  for (const n of names) {
    const p = (s.predictions || {})[n];
    if (p) lines.push(`${n}: ${p.top1_name} (${p.top1}) ${p.correct ? "✓" : "✗"} p_true=${fmt(p.p_true)}`);
  }
  return lines.join("\n");
}

// t: {id, title, subtitle, complete, failure_points, samples: [{sample_id, scale, kept, n_pass, scores, predictions, image | src}]}
function renderTrajectory(t, names, showScores) {
  const fps = t.failure_points || {};
  const row = h("div", { class: "traj" + (t.complete ? "" : " incomplete"), "data-trajectory": t.id },
    h("div", { class: "traj-head" }, h("strong", {}, t.title), h("span", { class: "muted" }, t.subtitle),
      t.complete ? h("span", { class: "tag ok" }, "complete") : h("span", { class: "tag" }, t.incompleteNote || "incomplete: not in the metrics")));
  const cells = h("div", { class: "cells" });
  for (const s of t.samples) {
    const failing = names.filter((n) => fps[n] !== null && fps[n] !== undefined && Math.abs(fps[n] - s.scale) < 1e-6);
    const img = h("img", { class: "sample", alt: s.sample_id, "data-sample": s.sample_id, width: 116, height: 116 });
    if (s.src) img.src = s.src; else loadInto(img, s.image);
    const ring = failing.map((n, i) => `0 0 0 ${3 * (i + 1)}px ${color(n)}`).join(", ");
    const dots = names.filter((n) => (s.predictions || {})[n]).map((n) => {
      const p = s.predictions[n];
      return h("span", { class: "dot " + (p.correct ? "right" : "wrong"), style: "border-color:" + color(n), title: `${n}: ${p.top1_name} ${p.correct ? "✓" : "✗"}` });
    });
    cells.append(h("figure", {
      class: "cell" + (s.kept ? "" : " filtered") + (failing.length ? " fails" : ""),
      "data-scale": s.scale, "data-kept": s.kept ? "1" : "0", "data-failing": failing.join(","), title: tooltip(s, names),
    },
      h("div", { class: "frame", style: ring ? "box-shadow:" + ring : "" }, img),
      h("div", { class: "badges" }, failing.map((n) => h("span", { class: "badge", "data-classifier": n, style: "background:" + color(n), title: `${n} fails first at scale ${fmt(s.scale)}` }, abbrev(n)))),
      h("div", { class: "dots" }, dots),
      h("figcaption", {}, `scale ${fmt(s.scale)}` + (s.kept ? "" : " · filtered")),
      showScores && s.scores ? h("div", { class: "scores" }, `pass ${s.n_pass}/4`) : null));
  }
  row.append(cells);
  return row;
}

// ------------------------------------------------------------------ benchmark browser
async function initBrowse(bench) {
  legend($("#legend"), bench.classifiers);
  const data = await getJSON("api/benchmarks/shifts");
  $("#shift").replaceChildren(...data.shifts.map((s) => h("option", { value: s.shift }, `${s.shift} (${s.n_complete}/${s.n_trajectories} complete)`)));
  $("#shift").addEventListener("change", () => onShift().catch((e) => setStatus(e.message, true)));
  $("#class").addEventListener("change", () => loadTrajectories().catch((e) => setStatus(e.message, true)));
  if (data.shifts.length) await onShift();
  else $("#trajectories").replaceChildren(h("p", { class: "note" }, "no committed shards yet"));
}
async function onShift() {
  const shift = $("#shift").value;
  const data = await getJSON("api/benchmarks/classes?shift=" + encodeURIComponent(shift));
  const keep = $("#class").value;
  $("#class").replaceChildren(h("option", { value: "" }, "all classes"),
    ...data.classes.map((c) => h("option", { value: c.class_id }, `${c.class_name} (${c.class_id})`)));
  if ([...$("#class").options].some((o) => o.value === keep)) $("#class").value = keep;
  await loadTrajectories();
}
async function loadTrajectories() {
  const seq = ++state.seq;
  const shift = $("#shift").value, chosen = $("#class").value;
  let classes = chosen ? [chosen] : [...$("#class").options].map((o) => o.value).filter((v) => v !== "");
  const box = $("#trajectories");
  box.dataset.state = "loading";
  const rows = [];
  if (classes.length > MAX_CLASSES_ALL) {
    rows.push(h("p", { class: "note" }, `showing the first ${MAX_CLASSES_ALL} of ${classes.length} classes; pick a class for the others`));
    classes = classes.slice(0, MAX_CLASSES_ALL);
  }
  for (const c of classes) {
    const data = await getJSON(`api/benchmarks/trajectories?shift=${encodeURIComponent(shift)}&class_id=${encodeURIComponent(c)}`);
    if (seq !== state.seq) return;  // a newer selection won
    for (const t of data.trajectories) {
      rows.push(renderTrajectory({
        id: t.trajectory_id, title: `${data.class_name} (${data.class_id})`, subtitle: `seed ${t.seed} · ${t.trajectory_id}`,
        complete: t.complete, failure_points: t.failure_points, samples: t.samples,
      }, data.classifiers, false));
    }
  }
  box.replaceChildren(...rows);
  box.dataset.shift = shift;
  box.dataset.state = "ready";
}

// ------------------------------------------------------------------ report
async function initReport(bench) {
  if (!bench.report) { $("#summary").replaceChildren(h("p", { class: "note" }, "no report yet (cnsbench aggregate)")); return; }
  const m = await getJSON("api/report");
  const cols = ["accuracy_scale0", "fp_avg", "fp_std", "margin_fp_avg", "n_failed", "n_trajectories"];
  $("#summary").replaceChildren(h("table", {},
    h("tr", {}, h("th", {}, "classifier"), cols.map((c) => h("th", {}, c))),
    (m.summary || []).map((r) => h("tr", {}, h("td", {}, h("span", { class: "swatch", style: "background:" + color(r.classifier) }), " ", r.classifier), cols.map((c) => h("td", {}, fmt(r[c])))))));
  $("#plots").replaceChildren(...bench.report_files.filter((f) => f.endsWith(".png")).map((f) => {
    const img = h("img", { class: "plot", alt: f, "data-file": f });
    loadInto(img, "report/" + encodeURIComponent(f));
    return img;
  }));
}

// ------------------------------------------------------------------ live preview
function initPreview(p) {
  $("#pv-class").replaceChildren(...p.classes.map((c) => h("option", { value: c.class_id }, `${c.class_name} (${c.class_id})`)));
  $("#pv-shift").replaceChildren(...p.shifts.map((s) => h("option", { value: s }, s)));
  $("#pv-seed").value = p.seeds.length ? p.seeds[0] : 0;
  $("#pv-seed").max = p.seed_bounds[1];
  $("#pv-scales").value = p.scales.join(", ");
  $("#pv-bounds").textContent = `scales in [${fmt(p.scale_bounds[0])}, ${fmt(p.scale_bounds[1])}], at most ${p.max_scales} (0 is always added: the filter's reference)`;
  legend($("#preview-legend"), p.classifiers);
  $("#preview-form").addEventListener("submit", (ev) => { ev.preventDefault(); runPreview(p).catch((e) => { setStatus(e.message, true); $("#preview-out").dataset.state = "error"; }); });
}
async function runPreview(p) {
  const out = $("#preview-out");
  const scales = $("#pv-scales").value.split(/[\s,]+/).filter((s) => s !== "").map(Number);
  const body = { class: Number($("#pv-class").value), shift: $("#pv-shift").value, seed: Number($("#pv-seed").value), scales };
  out.dataset.state = "loading";
  out.replaceChildren(h("p", { class: "note" }, "generating…"));
  const r = await (await api("api/preview", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) })).json();
  const samples = r.images.map((e) => ({ sample_id: e.sample_id, scale: e.scale, kept: e.filter.kept, n_pass: e.filter.n_pass,
    scores: { clip_text: e.filter.clip_text, clip_shift_text: e.filter.clip_shift_text, clip_image: e.filter.clip_image, dino_image: e.filter.dino_image },
    predictions: e.predictions, src: e.image }));
  out.replaceChildren(
    renderTrajectory({ id: r.trajectory_id, title: `${r.class_name} (${r.class_id})`, subtitle: `${r.shift} · seed ${r.seed}`,
      complete: r.complete, incompleteNote: "some images filtered out", failure_points: r.failure_points, samples }, r.classifiers, true),
    h("p", { class: "note" }, `generated + filtered in ${r.timing.generate_s} s, classified in ${r.timing.classify_s} s`));
  out.dataset.state = "ready";
  setStatus("");
}

// ------------------------------------------------------------------ start
async function init() {
  setStatus("loading…");
  let info;
  try { info = await getJSON("api/info"); } catch (e) { setStatus(e.message, true); return; }
  state.info = info;
  const name = (info.benchmark && info.benchmark.name) || (info.preview && info.preview.name) || "cnsbench";
  $("#title").textContent = "cnsbench · " + name;
  document.title = "cnsbench · " + name;
  if (info.same_config === false) setStatus("note: --config differs from the build's config; previews may not match the benchmark");
  else setStatus("");
  const work = [];
  if (info.benchmark) {
    $("#browse").hidden = false; $("#report").hidden = false;
    work.push(initBrowse(info.benchmark), initReport(info.benchmark));
  }
  if (info.preview) { $("#preview").hidden = false; initPreview(info.preview); }
  if (!info.benchmark && !info.preview) setStatus("nothing loaded", true);
  try { await Promise.all(work); } catch (e) { setStatus(e.message, true); }
  document.body.dataset.ready = "1";
}
$("#token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.token = $("#token").value.trim();
  sessionStorage.setItem(TOKEN_KEY, state.token);
  state.blobs.clear();
  $("#token-form").hidden = true;
  init();
});
init();
"""

PAGE = (
    '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
    '<meta name="viewport" content="width=device-width, initial-scale=1"><title>cnsbench</title>'
    f"<style>{_STYLE}</style></head><body>"
    '<header><h1 id="title">cnsbench</h1><span id="status"></span>'
    '<form id="token-form" hidden><label for="token">API token</label>'
    '<input id="token" type="password" autocomplete="off"><button type="submit">use</button></form></header>'
    "<main>"
    '<section id="browse" hidden><h2>Benchmark trajectories</h2>'
    '<div class="controls"><label>shift <select id="shift"></select></label>'
    '<label>class <select id="class"><option value="">all classes</option></select></label></div>'
    '<div id="legend"></div><div id="trajectories" data-state="empty"></div></section>'
    '<section id="report" hidden><h2>Report</h2><div id="summary"></div><div id="plots"></div></section>'
    '<section id="preview" hidden><h2>Live preview</h2>'
    '<form id="preview-form" class="controls"><label>class <select id="pv-class"></select></label>'
    '<label>shift <select id="pv-shift"></select></label>'
    '<label>seed <input id="pv-seed" type="number" min="0" step="1" style="width:9em"></label>'
    '<label>scales <input id="pv-scales" type="text" size="28"></label>'
    '<button type="submit" id="pv-run">generate</button></form>'
    '<div class="note" id="pv-bounds"></div><div id="preview-legend"></div>'
    '<div id="preview-out" data-state="empty"></div></section>'
    "</main>"
    f"<script>{_SCRIPT}</script></body></html>"
)

#: The page's policy: its one inline script pinned by hash, nothing from other origins.
PAGE_CSP = (
    "default-src 'none'; "
    f"script-src 'sha256-{base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()}'; "
    "style-src 'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
