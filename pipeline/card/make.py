"""``cnsbench card``: one model over every benchmark of a suite -> ``card.json`` and ``card.html``.

For each benchmark of the suite, in order: an output holding the model is found or made
(:func:`pipeline.card.outputs.prepare`: a build entry's output built, or the model added to
its committed shards; a release evaluated once; a benchmark the suite names as an output
only read, the model scored on its images into the card's own ``DIR/outputs/<name>``, which
refers to them), then the family's headline metrics are computed for the
model (:mod:`pipeline.card.headline`) and kept in ``DIR/benchmarks/<name>.json`` with the
key they were computed for (the model's identity, the output's config hash and the
digest of its images).  ``card.json`` and ``card.html`` are written last from those files.

The folder is claimed first (:func:`claim_card_folder`): a new or empty folder, or an
earlier card's of the same model (its marker ``cnsbench-card.json``, written before
anything else); another model's card only with ``force``.  Every file read back from it
(kept entries, the earlier ``card.json``) is read strictly (:mod:`pipeline.card.schema`)
and a damaged one is refused naming it.

Running the same card again reuses every kept entry whose key still holds and touches no
model: outputs that hold the model are only read (manifests, config, report), and kept
entries are not recomputed.  A card stopped part way resumes at the first benchmark
without a kept entry; its outputs resume as builds and evaluations do.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any, Callable

from pipeline import __version__
from pipeline.aggregate.page import zero_width
from pipeline.card.exports import EXPORTS, accuracy_rows, card_exports
from pipeline.card.headline import Tables, failure_point_block, headline, interval_design
from pipeline.card.model import identity
from pipeline.card.outputs import Prepared, prepare
from pipeline.card.schema import (
    CARD_MARKER,
    CARD_VERSION,
    TMP,
    CardError,
    card_marker,
    check_card,
    check_kept,
    read_card,
    read_card_marker,
    read_json,
)
from pipeline.card.suite import ALEXNET, Suite, benchmark_hash
from pipeline.config import BuildConfig, ClassifierSpec
from pipeline.errors import CnsbenchError
from pipeline.io.safejson import dumps as strict_dumps
from pipeline.io.store import OutputStore

MARKER = "card.json"
OWN = "outputs"  # the card's own evaluation outputs of the benchmarks it only reads: OWN/<benchmark>
Echo = Callable[[str], None]


class NotACardFolder(CnsbenchError):
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


def claim_card_folder(store: OutputStore, model: str, force: bool = False) -> str | None:
    """A card goes into a new or empty folder, or one holding a card's marker
    (:data:`~pipeline.card.schema.CARD_MARKER`, content-checked), or a checked ``card.json``
    of a card made before markers existed.  A folder holding another model's card is
    refused unless ``force`` (then that card's files are removed).  Returns the model the
    folder's marker names (None for a new folder, or a card made before markers); nothing
    is written here: :func:`make_card` writes the marker first."""
    if store.local and os.path.lexists(store.root) and not os.path.isdir(store.root):
        raise NotACardFolder(f"--output {store.uri} is not a folder")
    if not store.exists(""):
        return None
    names = [n for n in store.top_level() if not TMP.fullmatch(n)]
    if not names:
        return None
    marked = CARD_MARKER in names
    if marked:
        holder = read_card_marker(store)["model"]
    elif MARKER in names:  # a card made before the marker: ours when it is a card
        holder = read_card(store, MARKER)["model"]["name"]
    else:
        raise NotACardFolder(
            f"--output {store.uri} is not empty and holds no card (no {CARD_MARKER}); found: "
            f"{', '.join(sorted(names)[:8])}{', ...' if len(names) > 8 else ''}. "
            "Give a new or empty folder, or one of an earlier card; nothing was changed."
        )
    if holder == model:
        return holder if marked else None
    if not force:
        raise NotACardFolder(
            f"--output {store.uri} holds the card of another model, {holder!r} (this card is of {model!r}); "
            "give another --output, or pass --force to replace that card; nothing was changed."
        )
    for rel in [MARKER, "card.html", *EXPORTS, *(f"benchmarks/{n}" for n in store.top_level("benchmarks") if n.endswith(".json"))]:
        if store.exists(rel):
            store.remove(rel)
    return holder


def _kept(store: OutputStore, name: str) -> dict[str, Any] | None:
    """The kept entry of a benchmark (None when there is none); a damaged one is refused
    naming its file (:class:`~pipeline.card.schema.CardError`)."""
    rel = f"benchmarks/{name}.json"
    if not (store.exists(rel) or (store.local and os.path.lexists(store.path(rel)))):
        return None
    try:
        return check_kept(read_json(store, rel, "kept card entry"), store.url(rel))
    except CardError as err:
        raise CardError(f"{err}; remove the file to compute the entry again") from None


def entry_key(p: Prepared, model: dict[str, Any], suite: Suite, images: str) -> dict[str, Any]:
    return {
        "card": CARD_VERSION,
        "suite": suite.hash,
        "baseline": suite.baseline if p.benchmark.family == "corruptions" else None,
        "model": {"entry": p.model.model_dump(mode="json"), "weights_sha256": model["weights_sha256"]},
        "config_hash": p.config_hash,
        "images": images,
        "refined": refined_digest(OutputStore(p.uri), p.model.name),
    }


def refined_digest(store: OutputStore, model: str) -> str | None:
    """SHA-256 of the model's refined failure points on an output (None when never refined):
    a kept entry is computed again once they change."""
    from pipeline.analyses.refined import read_refined

    table = read_refined(store)
    if table is None or model not in set(table["classifier"]):
        return None
    return hashlib.sha256(table[table["classifier"] == model].to_csv(index=False).encode()).hexdigest()


def refine_entry(p: Prepared, rounds: int, *, runner: str, report: bool, echo: Echo) -> None:
    """``--refine R``: refine the model's failure points on a CNS build entry's output (the
    images it needs are made by the build's generator); other entries keep their grid points."""
    from pipeline.aggregate.run import evaluated_source
    from pipeline.io.image_refs import referenced
    from pipeline.refine import refine

    store = OutputStore(p.uri)
    released = evaluated_source(store) is not None and referenced(store) is None
    if p.benchmark.family != "cns" or released:
        echo(f"[cnsbench] card: {p.benchmark.name}: --refine applies to CNS builds; grid failure points kept")
        return
    held = {p.model.name: p.model.held} if p.model.held is not None else None
    refine(p.uri, p.model.name, rounds=rounds, runner=runner, aggregate=report, echo=echo, models=held)


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
    fp = failure_point_block(h.details)
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
        "ci": interval_design(tables) if p.benchmark.family == "cns" else {"level": spec.level, "resamples": spec.resamples, "seed": spec.seed},
        "left_out_shards": sorted(left_out),
        "details": h.to_json()["details"],
        "accuracy": accuracy_rows(p.config, samples, predictions, p.model.name),  # unaggregated.csv
        **({"failure_point": fp} if fp is not None else {}),
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
    force: bool = False,
    refine: int | None = None,
) -> dict[str, Any]:
    """Make (or resume, or confirm) the card of ``model`` over ``suite`` in ``dest``; returns card.json's content.

    ``report``: aggregate an output's report again after adding the model to it (as a
    build that adds a classifier does).  ``force``: replace another model's card in ``dest``
    (:func:`claim_card_folder`).  ``refine``: bisect the model's failure points for that many
    rounds on each CNS build entry (:func:`refine_entry`), so its entry carries them."""
    from pipeline.io.ownership import OwnershipError
    from pipeline.output_run import IncompatibleOutput
    from pipeline.card.page import card_html

    store = OutputStore(dest)
    if claim_card_folder(store, model.name, force) != model.name:
        store.write_text(CARD_MARKER, strict_dumps(card_marker(model.name), indent=1) + "\n")
    ident = identity(model)
    entries = []
    for b in suite.benchmarks:
        start = time.perf_counter()
        try:
            p = prepare(b, model, baseline=suite.baseline, runner=runner, echo=echo, ready=ready, report=report,
                        own=store.url(f"{OWN}/{b.name}"), refine=bool(refine))
        except IncompatibleOutput as err:
            raise IncompatibleOutput(_card_hint(b.where, str(err))) from None
        except OwnershipError as err:  # the benchmark's output is not ours: `--output` is the card's folder here
            text = str(err)
            text = "its output " + text.removeprefix("--output ") if text.startswith("--output ") else text
            raise OwnershipError(_card_hint(b.where, text, "Choose a new or empty directory")) from None
        if refine:
            refine_entry(p, refine, runner=runner, report=report, echo=echo)
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
             f"[{_show(entry['ci_low'])}, {_show(entry['ci_high'])}]"
             f"{' (zero width: every resample agreed)' if zero_width(entry['ci_low'], entry['ci_high']) else ''} "
             f"({p.work}, {time.perf_counter() - start:.1f} s)")
    card = {
        "card": CARD_VERSION,
        "model": ident,
        "suite": suite.describe(),
        "benchmarks": [{k: v for k, v in e.items() if k != "key"} for e in entries],
        "cnsbench": __version__,
    }
    check_card(card, f"the card of {model.name}")  # what the leaderboard will read back
    previous = _read_card(store)
    if previous is None or {k: v for k, v in previous.items() if k != "created"} != card:
        card["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        store.write_text(MARKER, strict_dumps(card, indent=1) + "\n")
        store.write_text("card.html", card_html(card))
    else:
        card = previous
    exports = card_exports(card)
    for name in EXPORTS:  # views of card.json in the community's formats; one it no longer makes goes
        if name in exports:
            store.write_text(name, exports[name])
        elif store.exists(name):
            store.remove(name)
    return card


def _read_card(store: OutputStore) -> dict[str, Any] | None:
    """The card written before (None without one or its page); a damaged one is refused naming it."""
    if not store.exists(MARKER) or not store.exists("card.html"):
        return None
    try:
        return read_card(store, MARKER)
    except CardError as err:
        raise CardError(f"{err}; remove it to make the card again") from None


def _card_hint(where: str, message: str, build_hint: str = "\nPass --new-version") -> str:
    """A build's refusal of an output, with the ways out that ``card`` has (not ``build``'s
    ``--new-version``): the message up to ``build_hint``, the build's own advice."""
    detail = message.split(build_hint, 1)[0].rstrip(". ")
    return (f"{where}: {detail}\nGive this suite entry an `output` of its own (or run the card with "
            "--outputs DIR, a new folder for all of the suite's outputs), or move what is there away; "
            "nothing was changed.")


def _show(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"
