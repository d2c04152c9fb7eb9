"""A vlm classifier's ``protocol`` entry: its defaults filled in and checked when the config is parsed.

The protocols themselves (how a question is asked and an answer scored) are
:mod:`pipeline.models.vqa_protocols`, registered in ``pipeline.registry.VQA_PROTOCOLS``; each
protocol class's ``defaults`` are the keys its entry takes.  Looking a kind up in the registry
imports no model library.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from pipeline.errors import CnsbenchError
from pipeline.registry import VQA_PROTOCOLS

# Distractor sources, explicit (``distractors``): the release's questions, a classifier's ranking, random.
DISTRACTOR_FILE = "questions"  # ``distractors: questions``: the released questions/*.csv only
RANDOM = "random"  # ``distractors: random``: drawn from the label space, seeded by the sample id
CLASSIFIER = "classifier:"  # ``distractors: classifier:NAME``: that classifier's ranking
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")  # a classifier name (ClassifierSpec.name)


class ProtocolError(CnsbenchError):
    """A protocol entry that cannot be used; the message names the key."""


def _check(cond: bool, where: str, message: str) -> None:
    if not cond:
        raise ProtocolError(f"{where}: {message}")


def resolve_protocol(raw: dict[str, Any] | None, where: str = "protocol") -> dict[str, Any]:
    """A ``protocol`` entry with its defaults filled in (the prompt text included), checked.

    Raises :class:`ProtocolError` naming the key: an unknown kind or key, a choice protocol
    without a distractor source, a prompt without ``{options}``, a bad k or temperature.
    """
    _check(isinstance(raw, dict) and "kind" in raw, where,
           f"a vlm classifier needs a protocol with a kind ({', '.join(VQA_PROTOCOLS.keys())})")
    assert isinstance(raw, dict)
    kind = raw["kind"]
    try:
        cls = VQA_PROTOCOLS.get(kind)
    except KeyError as err:
        raise ProtocolError(f"{where}.kind: {err.args[0]}") from None
    unknown = sorted(set(raw) - set(cls.defaults) - {"kind"})
    _check(not unknown, where, f"unknown keys {unknown} for protocol {kind}; allowed: {sorted(cls.defaults)}")
    params = {"kind": kind, **cls.defaults, **{k: v for k, v in raw.items() if k != "kind"}}
    if "distractors" in cls.defaults:
        params["distractors"] = explicit_distractors(params["distractors"], kind, f"{where}.distractors")
    if "{options}" in cls.defaults["prompt"]:
        _check("{options}" in str(params["prompt"]), f"{where}.prompt", "must contain '{options}'")
    if "order" in params:
        _check(params["order"] in ("original", "shuffled"), f"{where}.order", "must be 'original' or 'shuffled'")
    if "k" in params:
        _check(isinstance(params["k"], int) and params["k"] >= 2, f"{where}.k", f"must be an integer >= 2, got {params['k']!r}")
    t = params["temperature"]
    _check(isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0, f"{where}.temperature",
           f"must be >= 0, got {t!r}")
    k = params["top_k"]
    _check(isinstance(k, int) and not isinstance(k, bool) and k >= 0, f"{where}.top_k",
           f"must be an integer >= 0 (0: no top-k), got {k!r}")
    n = params["max_new_tokens"]
    _check(isinstance(n, int) and n >= 1, f"{where}.max_new_tokens", f"must be an integer >= 1, got {n!r}")
    syn = params["synonyms"]
    _check(syn in ("imagenet_d", "none") or isinstance(syn, dict), f"{where}.synonyms",
           "'imagenet_d', 'none', or a mapping {class name: [other names]}")
    return params


def explicit_distractors(value: Any, kind: str, where: str = "protocol.distractors") -> str:
    """A ``distractors`` value in its explicit form: ``questions`` (two_choice only),
    ``classifier:NAME`` or ``random``.  A bare classifier name becomes ``classifier:NAME`` and
    ``labels`` becomes ``random``; anything else is a ProtocolError naming ``where``."""
    choices = (f"{DISTRACTOR_FILE!r} (the release's questions/*.csv), " if kind == "two_choice" else "") + (
        f"'{CLASSIFIER}NAME' (a ranking classifier of the pool, e.g. a CLIP zero-shot one) or {RANDOM!r}"
    )
    _check(isinstance(value, str) and bool(value), where, f"protocol {kind} needs a distractor source: {choices}")
    if value == DISTRACTOR_FILE:
        _check(kind == "two_choice", where, f"{DISTRACTOR_FILE!r} is two_choice's only; {kind} takes {choices}")
        return value
    if value in (RANDOM, "labels"):
        return RANDOM
    name = value[len(CLASSIFIER):] if value.startswith(CLASSIFIER) else value
    _check(bool(_NAME.fullmatch(name)), where, f"{value!r} names no classifier; use {choices}")
    return CLASSIFIER + name


def distractor_classifier(params: dict[str, Any]) -> str | None:
    """The pool classifier whose ranking the protocol draws distractors from (None: file or random)."""
    d = params.get("distractors")
    if d in (None, DISTRACTOR_FILE, RANDOM, "labels"):
        return None
    d = str(d)
    return d[len(CLASSIFIER):] if d.startswith(CLASSIFIER) else d


def asks(kind: str) -> bool:
    """Whether classifiers of ``kind`` answer questions (their class's role,
    ``pipeline.models.classifier_kind.AskingClassifier``: ``asks``), looked up in the registry
    (which imports the kind's module); False for a kind the registry does not know or cannot
    load (the asset check names it)."""
    from pipeline.registry import CLASSIFIERS

    try:
        return bool(CLASSIFIERS.get(kind).asks)
    except (KeyError, ImportError):
        return False


def protocol_of(entry: Any) -> dict[str, Any] | None:
    """The VQA protocol of a classifier entry; None where its options model has none (a ranking
    kind's).  Read from the options alone, no kind's class loaded."""
    return entry.protocol if "protocol" in type(entry).model_fields else None


def check_distractor_sources(classifiers: Sequence[Any], describe: Callable[[int, Any], str] | None = None) -> None:
    """Every vlm classifier's distractor classifier is a non-vlm classifier of the pool.

    Run when the config is parsed, so it reads the entries' options models (:func:`protocol_of`)
    rather than the kinds' classes, whose lookup would import torch."""
    specs = {c.name: c for c in classifiers}
    kinds = {c.name: c.kind for c in classifiers}
    for i, c in enumerate(classifiers):
        if not protocol_of(c):
            continue
        src = distractor_classifier(c.protocol)
        if src is None:
            continue
        where = describe(i, c) if describe else f"classifiers[{i}] ({c.name})"
        if src not in kinds:
            raise ProtocolError(
                f"{where}.protocol.distractors: {src!r} is not a classifier of the pool ({', '.join(kinds)}); "
                f"the sources are {DISTRACTOR_FILE!r}, '{CLASSIFIER}NAME' and {RANDOM!r}"
            )
        if protocol_of(specs[src]) is not None:
            raise ProtocolError(f"{where}.protocol.distractors: {src!r} is a vlm; the distractors need a ranking classifier")


def questions_in_a_build(classifiers: Sequence[Any]) -> list[str]:
    """A build's problems with ``distractors: questions``: the released questions/*.csv exist
    only in an ImageNet-D release, never beside the images a build makes or reads (``seed``,
    ``folders``, ``webdataset``), so no image could be asked.  ``cnsbench evaluate`` on a release
    checks the same against the files it finds (:mod:`pipeline.sources.imagenet_d_questions`)."""
    return [
        f"classifiers[{i}] ({c.name}).protocol.distractors: {DISTRACTOR_FILE!r} needs a released ImageNet-D's "
        f"questions/*.csv, which a build has not (no image could be asked); set '{CLASSIFIER}NAME' or {RANDOM!r}, "
        "or evaluate the release with cnsbench evaluate"
        for i, c in enumerate(classifiers)
        if asks(c.kind) and (protocol_of(c) or {}).get("distractors") == DISTRACTOR_FILE
    ]
