"""``cnsbench card``: one model over every benchmark of a suite -> ``card.json`` and ``card.html``.

For each benchmark of the suite, in order: its output is made to hold the model
(:func:`pipeline.card.outputs.prepare`: built or evaluated when missing, the model added
to committed shards otherwise), then the family's headline metrics are computed for the
model (:mod:`pipeline.card.headline`) and kept in ``DIR/benchmarks/<name>.json`` with the
key they were computed for (the model's identity, the output's config hash and the
digest of its images).  ``card.json`` and ``card.html`` are written last from those files.

Running the same card again reuses every kept entry whose key still holds and touches no
model: outputs that hold the model are only read (manifests, config, report), and kept
entries are not recomputed.  A card stopped part way resumes at the first benchmark
without a kept entry; its outputs resume as builds and evaluations do.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Callable

from pipeline import __version__
from pipeline.card.headline import Tables, headline
from pipeline.card.model import identity
from pipeline.card.outputs import Prepared, prepare
from pipeline.card.suite import ALEXNET, Suite
from pipeline.config import BuildConfig, ClassifierSpec, resolved_dict
from pipeline.io.safejson import dumps as strict_dumps
from pipeline.io.store import OutputStore

CARD_VERSION = 1
MARKER = "card.json"
Echo = Callable[[str], None]


class NotACardFolder(ValueError):
    """The card's folder holds something else than an earlier card."""


def images_digest(store: OutputStore) -> str:
    """SHA-256 of an output's committed images and sample tables (their manifest digests),
    whatever classifiers were added to it since."""
    lines = []
    for manifest in store.manifests():
        for rel, info in sorted(manifest.files.items()):
            if rel.startswith(("images/", "samples/")):
                lines.append(f"{rel}\0{info.get('sha256')}")
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()


def benchmark_hash(cfg: BuildConfig) -> str:
    """SHA-256 of what defines a benchmark's images and metrics: the output's config
    without its classifiers, resources and location."""
    data = resolved_dict(cfg)
    for key in ("classifiers", "resources"):
        data.pop(key, None)
    data.get("output", {}).pop("path", None)
    analyses = []
    for a in data.get("aggregate", {}).get("analyses", []):
        if isinstance(a, dict):  # the release protocol's entry names every classifier's inputs
            a = {k: v for k, v in a.items() if k not in ("classifiers", "overridden")}
        analyses.append(a)
    if "aggregate" in data:
        data["aggregate"]["analyses"] = analyses
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def claim_card_folder(store: OutputStore) -> None:
    """A card goes into a new or empty folder, or one holding an earlier card."""
    if not store.exists(""):
        return
    names = [n for n in store.top_level() if not n.startswith(".")]
    if names and MARKER not in names and "benchmarks" not in names:
        raise NotACardFolder(
            f"{store.uri} is not empty and holds no card ({', '.join(sorted(names)[:5])}); "
            "give a new or empty folder, or one of an earlier card"
        )


def _kept(store: OutputStore, name: str) -> dict[str, Any] | None:
    rel = f"benchmarks/{name}.json"
    if not store.exists(rel):
        return None
    try:
        return json.loads(store.read_bytes(rel))
    except ValueError:
        return None


def entry_key(p: Prepared, model: dict[str, Any], suite: Suite, images: str) -> dict[str, Any]:
    return {
        "card": CARD_VERSION,
        "suite": suite.hash,
        "baseline": suite.baseline if p.benchmark.family == "corruptions" else None,
        "model": {"entry": p.model.model_dump(mode="json"), "weights_sha256": model["weights_sha256"]},
        "config_hash": p.config_hash,
        "images": images,
    }


def compute_entry(p: Prepared, suite: Suite, echo: Echo) -> dict[str, Any]:
    """The card entry of one prepared benchmark, from its output's committed tables."""
    from pipeline.aggregate.images import ImageReader
    from pipeline.aggregate.run import load_sound_tables

    store = OutputStore(p.uri)
    who = [p.model.name]
    if p.benchmark.family == "corruptions" and suite.baseline not in (None, ALEXNET):
        who.append(suite.baseline)
    samples, predictions, left_out = load_sound_tables(store, who)
    for shard, reason in sorted(left_out.items()):
        echo(f"[cnsbench] card: {p.benchmark.name}: left damaged shard {shard} out ({reason})")
    tables = Tables(p.config, samples, predictions, p.model.name, suite.baseline if p.benchmark.family == "corruptions" else None,
                    ImageReader(store, samples))
    h = headline(p.benchmark.family, tables)
    spec = tables.spec
    return {
        "benchmark": p.benchmark.name,
        "family": p.benchmark.family,
        "metric": h.metric,
        "value": h.value,
        "ci_low": h.ci_low,
        "ci_high": h.ci_high,
        "higher_is_better": h.higher_is_better,
        "description": h.description,
        "protocol": p.protocol["name"],
        "protocol_detail": p.protocol,
        "config_hash": p.config_hash,
        "output": p.uri,
        "preprocess": p.model.model_dump(mode="json").get("preprocess") or "model",
        "n_units": h.n_units,
        "ci": {"level": spec.level, "resamples": spec.resamples, "seed": spec.seed},
        "left_out_shards": sorted(left_out),
        "details": h.to_json()["details"],
    }


def make_card(
    model: ClassifierSpec,
    suite: Suite,
    dest: str,
    *,
    runner: str = "ray",
    echo: Echo = print,
    ready: Callable[[BuildConfig], None] = lambda cfg: None,
    report: bool = True,
) -> dict[str, Any]:
    """Make (or resume, or confirm) the card of ``model`` over ``suite`` in ``dest``; returns card.json's content.

    ``report``: aggregate an output's report again after adding the model to it (as a
    build that adds a classifier does)."""
    from pipeline.card.page import card_html

    store = OutputStore(dest)
    claim_card_folder(store)
    ident = identity(model)
    entries = []
    for b in suite.benchmarks:
        start = time.perf_counter()
        p = prepare(b, model, baseline=suite.baseline, runner=runner, echo=echo, ready=ready, report=report)
        out_store = OutputStore(p.uri)
        key = entry_key(p, ident, suite, images_digest(out_store))
        kept = _kept(store, b.name)
        if kept is not None and kept.get("key") == key:
            entries.append(kept)
            echo(f"[cnsbench] card: {b.name}: up to date ({kept['metric']} {_show(kept['value'])})")
            continue
        entry = compute_entry(p, suite, echo)
        entry["benchmark_hash"] = benchmark_hash(p.config)
        entry["images_digest"] = key["images"]
        entry["key"] = key
        store.write_text(f"benchmarks/{b.name}.json", strict_dumps(entry, indent=1) + "\n")
        entries.append(entry)
        echo(f"[cnsbench] card: {b.name}: {entry['metric']} {_show(entry['value'])} "
             f"[{_show(entry['ci_low'])}, {_show(entry['ci_high'])}] ({p.work}, {time.perf_counter() - start:.1f} s)")
    card = {
        "card": CARD_VERSION,
        "model": ident,
        "suite": suite.describe(),
        "benchmarks": [{k: v for k, v in e.items() if k != "key"} for e in entries],
        "cnsbench": __version__,
    }
    previous = _read_card(store)
    if previous is None or {k: v for k, v in previous.items() if k != "created"} != card:
        card["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        store.write_text(MARKER, strict_dumps(card, indent=1) + "\n")
        store.write_text("card.html", card_html(card))
    else:
        card = previous
    return card


def _read_card(store: OutputStore) -> dict[str, Any] | None:
    if not store.exists(MARKER) or not store.exists("card.html"):
        return None
    try:
        return json.loads(store.read_bytes(MARKER))
    except ValueError:
        return None


def _show(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"
