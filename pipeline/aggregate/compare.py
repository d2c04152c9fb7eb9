"""``cnsbench compare OUT_A OUT_B [...] --output DIR``: one report over several outputs.

Role: put the classifiers of several outputs side by side, e.g. a new model evaluated
(``cnsbench evaluate``) on the images of a build against the classifiers of the build
itself.  The outputs must hold the same benchmark:

* the same sample ids (the same (shift, class, seed, scale) coordinates),
* the same scale grid per shift, and
* the same images: the decoded pixels of ``--image-check`` samples (spread over the
  benchmark by a fixed seed; 0 checks every image) are equal in every output.

Anything else is refused (:class:`NotComparable`, exit code 2) with what differs.  The
report goes only into a new or empty folder or an earlier comparison (its marker
``compare.json``); a build output or any other non-empty folder is refused (exit 2)
before anything is read or written (:func:`pipeline.io.ownership.claim_compare_output`).

The comparison is then one report, made by the same analyses as a build's report: the
samples of the first output, an image kept only when every output's filter kept it (so
every classifier is measured on the same trajectories), and the predictions of all
outputs, each classifier named ``<label>.<classifier>`` (labels: ``--labels`` or the
outputs' folder names).  The bootstrap intervals and the pairwise comparison then compare
classifiers across outputs with paired resamples.
"""

from __future__ import annotations

import html
import io
import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from pipeline.config import BuildConfig
from pipeline.errors import CnsbenchError
from pipeline.io.store import OutputStore


class NotComparable(CnsbenchError):
    """The outputs do not hold the same benchmark (images, sample ids or scales)."""


@dataclass
class Loaded:
    label: str
    store: OutputStore
    config: BuildConfig
    config_hash: str
    samples: pd.DataFrame
    predictions: pd.DataFrame


def labels_for(outputs: Sequence[str], labels: Sequence[str] | None) -> list[str]:
    """``labels`` checked, or unique names from the outputs' last path parts."""
    if labels:
        if len(labels) != len(outputs):
            raise CnsbenchError(f"--labels: {len(labels)} labels for {len(outputs)} outputs")
        bad = [lab for lab in labels if not re.fullmatch(r"[A-Za-z0-9_\-]+", lab)]
        if bad:
            raise CnsbenchError(f"--labels: {bad[0]!r} is not a label (letters, digits, '_' and '-' only)")
        if len(set(labels)) != len(labels):
            raise CnsbenchError(f"--labels: labels must differ, got {list(labels)}")
        return list(labels)
    out: list[str] = []
    for uri in outputs:
        base = re.sub(r"[^A-Za-z0-9_\-]+", "_", uri.rstrip("/").rsplit("/", 1)[-1]) or "output"
        name, i = base, 2
        while name in out:
            name, i = f"{base}_{i}", i + 1
        out.append(name)
    return out


def load(uri: str, label: str) -> Loaded:
    from pipeline.aggregate.run import load_output_config
    from pipeline.io.tables import load_predictions, load_samples
    from pipeline.config import config_hash

    store = OutputStore(uri)
    cfg = load_output_config(store)
    return Loaded(label, store, cfg, config_hash(cfg), load_samples(store),
                  load_predictions(store, [c.name for c in cfg.classifiers]))


def _scale_grid(cfg: BuildConfig) -> dict[str, tuple[int, ...]]:
    return {shift: tuple(round(s * 1000) for s in g.scales) for g in cfg.family_groups() for shift in g.shifts}


def check_comparable(outputs: list[Loaded], image_check: int = 64, seed: int = 0) -> list[str]:
    """Raise :class:`NotComparable` naming the difference; returns what was checked (for the page)."""
    first = outputs[0]
    ids0 = set(first.samples["sample_id"])
    if not ids0:
        raise NotComparable(f"{first.store.uri} has no committed samples")
    grid0 = _scale_grid(first.config)
    for other in outputs[1:]:
        ids = set(other.samples["sample_id"])
        if ids != ids0:
            only_a, only_b = sorted(ids0 - ids), sorted(ids - ids0)
            detail = []
            if only_a:
                detail.append(f"{len(only_a)} only in {first.store.uri} (e.g. {only_a[0]})")
            if only_b:
                detail.append(f"{len(only_b)} only in {other.store.uri} (e.g. {only_b[0]})")
            raise NotComparable(
                f"{first.store.uri} and {other.store.uri} hold different images: sample ids differ, "
                + "; ".join(detail)
            )
        grid = _scale_grid(other.config)
        for shift in sorted(set(grid0) | set(grid)):
            if grid0.get(shift) != grid.get(shift):
                fmt = lambda g: "none" if g is None else ", ".join(f"{m / 1000:g}" for m in g)  # noqa: E731
                raise NotComparable(
                    f"{first.store.uri} and {other.store.uri} have different scales for shift {shift!r}: "
                    f"[{fmt(grid0.get(shift))}] vs [{fmt(grid.get(shift))}]"
                )
    checked = [f"the same {len(ids0)} sample ids in all {len(outputs)} outputs", "the same scales per shift"]
    ids = sorted(ids0)
    if image_check and image_check < len(ids):
        rng = np.random.default_rng(seed)
        ids = sorted(ids[i] for i in rng.choice(len(ids), size=image_check, replace=False))
    pixels0 = _pixels(first, ids)
    for other in outputs[1:]:
        pixels = _pixels(other, ids)
        for sid in ids:
            if not np.array_equal(pixels0[sid], pixels[sid]):
                raise NotComparable(
                    f"{first.store.uri} and {other.store.uri} hold different images: {sid} differs "
                    "(same sample ids, other pixels: another generator, source or seed)"
                )
    checked.append(f"the same pixels in {len(ids)} {'sampled ' if len(ids) < len(ids0) else ''}images")
    return checked


def _pixels(out: Loaded, ids: list[str]) -> dict[str, np.ndarray]:
    from PIL import Image

    from pipeline.aggregate.images import ImageReader

    data = ImageReader(out.store, out.samples).many(ids)
    return {sid: np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for sid, b in data.items()}


def merged_tables(outputs: list[Loaded]) -> tuple[BuildConfig, pd.DataFrame, pd.DataFrame]:
    """(config, samples, predictions) of the comparison (see the module docstring)."""
    first = outputs[0]
    samples = first.samples.copy()
    kept = pd.Series(True, index=samples["sample_id"].to_numpy())
    for out in outputs:
        k = out.samples.set_index("sample_id")["kept"].astype("boolean").fillna(False).astype(bool)
        kept &= k.reindex(kept.index).fillna(False).astype(bool)
    samples["kept"] = kept.to_numpy()
    preds, specs = [], []
    for out in outputs:
        p = out.predictions.copy()
        p["classifier"] = out.label + "." + p["classifier"].astype(str)
        preds.append(p)
        specs += [c.model_copy(update={"name": f"{out.label}.{c.name}"}) for c in out.config.classifiers]
    cfg = first.config.model_copy(update={"classifiers": specs})
    return cfg, samples, pd.concat(preds, ignore_index=True)


def compare_outputs(
    outputs: Sequence[str],
    dest: str,
    *,
    labels: Sequence[str] | None = None,
    image_check: int = 64,
    echo: Callable[[str], None] = print,
) -> str:
    """Check the outputs, write the comparison report into ``dest``; returns its index URL."""
    from pipeline.aggregate.images import ImageReader
    from pipeline.aggregate.run import render_report
    from pipeline.plan.analyses import analysis_plan
    from pipeline.runtime.progress import Progress

    from pipeline.io.ownership import claim_compare_output, write_compare_marker

    if len(outputs) < 2:
        raise CnsbenchError("compare needs at least two outputs")
    names = labels_for(outputs, labels)
    store = OutputStore(dest)
    progress = Progress("compare", 0, unit="steps", echo=None if echo is print else echo)
    loaded = []
    for uri, label in zip(outputs, names):
        loaded.append(load(uri, label))
    checked = check_comparable(loaded, image_check=image_check)
    # Only outputs that compare get a folder: a new or empty one, or an earlier comparison.
    claim_compare_output(store)
    cfg, samples, predictions = merged_tables(loaded)
    progress.total = len(outputs) + 1 + len(analysis_plan(cfg))
    progress.update(done=len(outputs) + 1)
    title = f"{cfg.benchmark.name}: comparison of {', '.join(names)}"
    write_compare_marker(store, [o.store.uri for o in loaded], names)
    url = render_report(
        store, "", cfg, samples, predictions, title, None, ImageReader(loaded[0].store, loaded[0].samples),
        lead=[("Outputs compared", _outputs_section(loaded, checked))], progress=progress,
    )
    progress.close()
    return url


def _outputs_section(outputs: list[Loaded], checked: list[str]) -> str:
    from pipeline.aggregate.page import ci_table

    e = html.escape
    table = pd.DataFrame(
        [
            (o.label, o.store.uri, o.config_hash[:12], ", ".join(c.name for c in o.config.classifiers),
             int(o.samples["kept"].astype("boolean").fillna(False).sum()))
            for o in outputs
        ],
        columns=["label", "output", "config hash", "classifiers", "samples kept"],
    )
    return (
        ci_table(table)
        + "<p>Comparable: " + e("; ".join(checked)) + ". Classifiers are named <code>label.classifier</code>; an image "
        "counts as kept only when every output kept it, so all classifiers are measured on the same trajectories.</p>"
    )
