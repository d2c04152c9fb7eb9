"""A model's answers on a fixed probe batch of the benchmark's own images: what no digest sees.

The object digest (:mod:`pipeline.models.identity`) covers what a model held in memory holds.
Its answers can also depend on state outside the object: a module-level global its forward
reads, an extension object hashed by its class only, a file it opens on each call.  So when
such a model (kind ``module``) makes predictions in an output, its logits on a few of the
output's committed images are recorded with them, and every later use of its name there runs
the object given then on the same images: one that answers differently is refused
(:class:`AnswersChanged`, naming both models, the images and by how much), never given the
old numbers.

* The probe batch: at most :data:`PROBE_IMAGES` committed samples, the first image (lowest
  scale) of every k-th trajectory in ``sample_id`` order (spread over classes and shifts),
  each preprocessed as the classifier preprocesses it (``shifted`` at a scale > 0), run on
  the CPU in float32, one forward of the batch.
* The record: ``probes/<key>.json`` (the samples, their logits rounded to 7 significant
  digits, the model's class and object digest), written through the store (``s3://`` too)
  before the marker ``config.json`` names it under ``probes`` with its SHA-256.  The marker
  is the output's commit point, so a rolled-back addition drops its record with it.
* The tolerance: image i passes when ``max_j |new_ij - ref_ij| <= ATOL + RTOL * max_j |ref_ij|``
  (the image's largest logit sets the scale, so logits near zero are not held to nothing).
  Record and check both run on the CPU in float32, so only library and thread-count
  differences (about 1e-6 relative) and an extension's own TF32/reduced-precision kernels
  (about 1e-3) need to pass; a flipped input, another ensemble or a doubled global moves the
  logits by tens of percent.
* Outputs recorded before probes existed have no record: the check is skipped for them (the
  digest check still runs), and nothing is recorded for predictions already made.

Configured classifiers (weight files, hub ids) get no probe: their digest covers the files
they load, and probing one would load it in the driver (many GB for a VLM) on every use.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

import numpy as np

from pipeline.assets.weights import WeightsChanged
from pipeline.io.store import OutputStore

PROBE_IMAGES = 8
RTOL = 1e-2
ATOL = 1e-5
PROBE_DIR = "probes"
KEY = "probes"  # the marker's key: classifier name -> {"file", "sha256"}


class AnswersChanged(WeightsChanged):
    """A model held in memory answers the probe images otherwise than the model that made its
    predictions in an output under the same name."""


def probed(spec: Any) -> bool:
    """Whether ``spec`` is a model held in memory here (the kind that gets a probe)."""
    return spec.kind == "module" and spec.held is not None


def recorded(marker: dict[str, Any] | None) -> dict[str, dict[str, str]]:
    """The probe records an output's marker names (empty for outputs made before probes)."""
    found = (marker or {}).get(KEY)
    if not isinstance(found, dict):
        return {}
    return {str(k): v for k, v in found.items() if isinstance(v, dict) and isinstance(v.get("file"), str)}


def probe_samples(store: OutputStore, n: int = PROBE_IMAGES) -> list[dict[str, Any]]:
    """The probe batch's sample rows (sample_id, shard, key, scale); empty without committed images."""
    from pipeline.io.tables import load_samples

    samples = load_samples(store, ["sample_id", "trajectory_id", "shard", "key", "scale"])
    if samples.empty:
        return []
    first = samples.sort_values("sample_id", kind="stable").drop_duplicates("trajectory_id")
    step = max(1, len(first) // n)
    rows = first.iloc[::step].head(n)
    return [{"sample_id": str(r.sample_id), "shard": str(r.shard), "key": str(r.key), "scale": float(r.scale)}
            for r in rows.itertuples(index=False)]


def logits(spec: Any, store: OutputStore, rows: list[dict[str, Any]], labels: Any) -> np.ndarray:
    """``spec``'s logits [N, K] on the images of ``rows``, as its classifier computes them (CPU, float32)."""
    from pipeline.registry import CLASSIFIERS
    from pipeline.stages.base import decode_image
    from pipeline.stages.reclassify import referenced_images

    data = referenced_images(store, rows)  # by member key, from the tars the rows name (the benchmark's too)
    missing = [r["sample_id"] for r in rows if r["key"] not in data]
    if missing:
        raise AnswersChanged(f"{store.uri}: the probe image of {missing[0]!r} is no longer in the output "
                             "(its shard was removed or quarantined): the model cannot be compared; pass another name")
    images = [decode_image(data[r["key"]]) for r in rows]
    clf = CLASSIFIERS.get(spec.kind)(spec, "cpu", labels)
    return clf.predict(images, [r["scale"] > 0 for r in rows]).numpy().astype(np.float32)


def _rel(name: str) -> str:
    return f"{PROBE_DIR}/{hashlib.sha256(name.encode()).hexdigest()[:16]}.json"


def measure(store: OutputStore, spec: Any, labels: Any, digest: str | None) -> tuple[str, bytes] | None:
    """Run ``spec`` on the probe batch: its record's path and content (None when the output has
    no committed image yet)."""
    rows = probe_samples(store)
    if not rows:
        return None
    out = logits(spec, store, rows, labels)
    doc = {"classifier": spec.name, "model": spec.model, "digest": digest, "device": "cpu", "dtype": "float32",
           "tolerance": {"rtol": RTOL, "atol": ATOL}, "samples": rows,
           "logits": [[float(f"{v:.7g}") for v in row] for row in out.tolist()]}
    return _rel(spec.name), json.dumps(doc).encode()


def write(store: OutputStore, rel: str, data: bytes) -> dict[str, str]:
    """Write a record (:func:`measure`); the marker's entry for it."""
    return {"file": rel, "sha256": store.write_bytes(rel, data)["sha256"]}


def record(store: OutputStore, spec: Any, labels: Any, digest: str | None) -> dict[str, str] | None:
    """:func:`measure` and :func:`write`: the marker's entry (None without committed images)."""
    found = measure(store, spec, labels, digest)
    return write(store, *found) if found else None


def _read(store: OutputStore, name: str, ref: dict[str, str]) -> dict[str, Any]:
    where = store.url(ref["file"])
    try:
        data = store.read_bytes(ref["file"])
    except FileNotFoundError:
        raise AnswersChanged(f"{store.uri}: the probe record of classifier {name!r} ({where}) is missing: the "
                             "model that made its predictions cannot be compared; pass another name") from None
    if hashlib.sha256(data).hexdigest() != ref.get("sha256"):
        raise AnswersChanged(f"{where}: the probe record of classifier {name!r} does not match the SHA-256 the "
                             "output's config.json records (changed or damaged); pass another name")
    return json.loads(data)


def differences(ref: np.ndarray, now: np.ndarray) -> list[tuple[int, float, float]]:
    """(image index, max |difference|, tolerance) of each image outside the tolerance."""
    diff = np.abs(now.astype(np.float64) - ref).max(axis=1)
    tol = ATOL + RTOL * np.abs(ref).max(axis=1)
    return [(int(i), float(diff[i]), float(tol[i])) for i in np.nonzero(~(diff <= tol))[0]]


def check(store: OutputStore, marker: dict[str, Any] | None, spec: Any, labels: Any, digest: str | None,
          hint: str) -> None:
    """Refuse (:class:`AnswersChanged`) ``spec`` when its name has a probe record in ``store``
    and it answers the probe images otherwise; nothing to do without a record."""
    ref = recorded(marker).get(spec.name)
    if ref is None:
        return
    doc = _read(store, spec.name, ref)
    rows = doc["samples"]
    before = np.asarray(doc["logits"], dtype=np.float64)
    now = logits(spec, store, rows, labels)
    if now.shape == before.shape:
        bad = differences(before, now)
        if not bad:
            return
        shown = "; ".join(f"{rows[i]['sample_id']}: max |Δlogit| {d:.4g} > {t:.3g}" for i, d, t in bad[:3])
        how = (f"its logits differ on {len(bad)} of {len(rows)} probe images beyond the tolerance "
               f"(|Δ| <= {ATOL:g} + {RTOL:g}·max|logit| per image): {shown}{' …' if len(bad) > 3 else ''}")
    else:
        how = f"it returns logits of shape {tuple(now.shape)} on the probe images, the recorded model {tuple(before.shape)}"
    old = doc.get("digest") or "unknown"
    same = " (the same object digest: state outside the object changed, e.g. a global its forward reads)" \
        if digest and digest == old else ""
    raise AnswersChanged(f"{store.uri}: classifier {spec.name!r} answers differently from the model that made its "
                         f"predictions: recorded {doc.get('model')} (object digest {old[:12]}…), given {spec.model} "
                         f"(object digest {(digest or 'unknown')[:12]}…){same}; {how}; {hint}"[:1500])


def check_output(uri: str, marker: dict[str, Any] | None, spec: Any, digest: str | None, hint: str) -> None:
    """:func:`check` of a model held in memory against the output ``uri`` (its label space
    from the marker's config), before anything is written there."""
    if marker is None or not probed(spec) or spec.name not in recorded(marker):
        return
    from pipeline.config import parse_config

    store = OutputStore(uri)
    labels = parse_config(marker["config"], source=store.url("config.json")).benchmark.label_space
    check(store, marker, spec, labels, digest, hint)


def check_run(store: OutputStore, cfg: Any, digests: dict[str, str | None],
              hint: str) -> tuple[dict[str, tuple[str, bytes]], list]:
    """A run's models held in memory, before it writes: each against its record (refused with
    ``hint``); those that run (``digests``) without one are probed on the committed images
    now, or (none committed yet) once the run has committed its first shard (:class:`Pending`).
    Returns the records to write (path and content, by name) and the entries still to probe."""
    from pipeline.assets.weights import weights_digest
    from pipeline.io.ownership import read_marker

    marker, labels = read_marker(store), cfg.benchmark.label_space
    found, pending = {}, []
    for spec in (c for c in cfg.classifiers if probed(c)):
        digest = digests[spec.name] if spec.name in digests else weights_digest(spec)
        check(store, marker, spec, labels, digest, hint)
        if spec.name in digests and spec.name not in recorded(marker):
            measured = measure(store, spec, labels, digest)
            found.update({spec.name: measured} if measured else {})
            pending += [] if measured else [spec]
    return found, pending


class Pending:
    """Held models of a run on a new output, probed once it has committed images: on its first
    shard (no prediction of theirs stays without a record), and again at the end over all its
    shards' images (the run's object made all their predictions)."""

    def __init__(self, store: OutputStore, cfg: Any, specs: list, digests: dict[str, str | None],
                 ensure_held: Callable[[], None]) -> None:
        self.store, self.labels, self.digests, self.ensure_held = store, cfg.benchmark.label_space, digests, ensure_held
        self.specs, self.done = list(specs), False

    @property
    def waiting(self) -> bool:
        return bool(self.specs) and not self.done

    def _record(self) -> None:
        refs = {}
        for spec in self.specs:
            ref = record(self.store, spec, self.labels, self.digests.get(spec.name))
            if ref is None:
                return  # nothing committed yet
            refs[spec.name] = ref
        self.done = True
        self.ensure_held()
        add_to_marker(self.store, refs)

    def after(self, handler: Callable[[dict], None] | None) -> Callable[[dict], None]:
        """``handler`` for each committed shard's row, then the first probe."""
        def shard_done(row: dict) -> None:
            if handler is not None:
                handler(row)
            if not self.done:
                self._record()
        return shard_done

    def at_end(self) -> None:
        if self.specs:
            self._record()


def add_to_marker(store: OutputStore, refs: dict[str, dict[str, str]]) -> None:
    """Name ``refs`` in the output's marker (after their files are written)."""
    from pipeline.io.ownership import MARKER, read_marker
    from pipeline.io.safejson import dumps

    marker = read_marker(store)
    if marker is None or not refs:
        return
    marker[KEY] = {**recorded(marker), **refs}
    store.write_text(MARKER, dumps(marker, indent=1))
