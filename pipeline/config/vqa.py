"""A vlm classifier's ``protocol`` entry: its defaults filled in and checked when the config is parsed.

The protocols themselves (how a question is asked and an answer scored) are
:mod:`pipeline.models.vqa_protocols`, registered in ``pipeline.registry.VQA_PROTOCOLS``; each
protocol class's ``defaults`` are the keys its entry takes.  Looking a kind up in the registry
imports no model library.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pipeline.registry import VQA_PROTOCOLS

DISTRACTOR_FILE = "questions"  # ``distractors: questions``: the released questions/*.csv only


class ProtocolError(ValueError):
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
        d = params["distractors"]
        _check(isinstance(d, str) and bool(d), f"{where}.distractors",
               f"protocol {kind} needs a distractor source: a classifier of the pool (e.g. a CLIP zero-shot one)"
               f"{', ' + repr(DISTRACTOR_FILE) + ' (the release questions/*.csv)' if kind == 'two_choice' else ''}"
               f"{', or ' + repr('labels') + ' (at random from the label space)' if kind == 'multiple_choice' else ''}")
        _check(not (kind == "two_choice" and d == "labels"), f"{where}.distractors",
               "two_choice takes the distractor from a classifier's ranking or the release's questions, not 'labels'")
    if "{options}" in cls.defaults["prompt"]:
        _check("{options}" in str(params["prompt"]), f"{where}.prompt", "must contain '{options}'")
    if "order" in params:
        _check(params["order"] in ("original", "shuffled"), f"{where}.order", "must be 'original' or 'shuffled'")
    if "k" in params:
        _check(isinstance(params["k"], int) and params["k"] >= 2, f"{where}.k", f"must be an integer >= 2, got {params['k']!r}")
    t = params["temperature"]
    _check(isinstance(t, (int, float)) and t >= 0, f"{where}.temperature", f"must be >= 0, got {t!r}")
    n = params["max_new_tokens"]
    _check(isinstance(n, int) and n >= 1, f"{where}.max_new_tokens", f"must be an integer >= 1, got {n!r}")
    syn = params["synonyms"]
    _check(syn in ("imagenet_d", "none") or isinstance(syn, dict), f"{where}.synonyms",
           "'imagenet_d', 'none', or a mapping {class name: [other names]}")
    return params


def distractor_classifier(params: dict[str, Any]) -> str | None:
    """The pool classifier whose ranking the protocol draws distractors from (None: file or labels)."""
    d = params.get("distractors")
    return None if d in (None, DISTRACTOR_FILE, "labels") else str(d)


def check_distractor_sources(classifiers: Sequence[Any], describe: Callable[[int, Any], str] | None = None) -> None:
    """Every vlm classifier's distractor classifier is a non-vlm classifier of the pool."""
    kinds = {c.name: c.kind for c in classifiers}
    for i, c in enumerate(classifiers):
        if c.kind != "vlm" or not c.protocol:
            continue
        src = distractor_classifier(c.protocol)
        if src is None:
            continue
        where = describe(i, c) if describe else f"classifiers[{i}] ({c.name})"
        if src not in kinds:
            raise ProtocolError(
                f"{where}.protocol.distractors: {src!r} is not a classifier of the pool ({', '.join(kinds)}) "
                f"nor {DISTRACTOR_FILE!r} / 'labels'"
            )
        if kinds[src] == "vlm":
            raise ProtocolError(f"{where}.protocol.distractors: {src!r} is a vlm; the distractors need a ranking classifier")
