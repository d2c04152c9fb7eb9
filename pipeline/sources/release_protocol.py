"""Released benchmarks evaluated as their authors did: one :class:`ReleaseProtocol` per layout.

How a layout declares its protocol
----------------------------------
The layout's module (``pipeline/sources/<layout>.py``, listed in
:data:`pipeline.sources.detect.RELEASED_LAYOUTS`) defines a module-level ``PROTOCOL``::

    from pipeline.sources.release_protocol import ReleaseProtocol, TORCHVISION_EVAL

    PROTOCOL = ReleaseProtocol(
        name="imagenet_c",
        original="hendrycks/robustness ImageNet-C/test.py",
        preprocess={"timm": TORCHVISION_EVAL, "*": "model"},  # per classifier kind
        templates=None,                      # zero-shot prompts, e.g. ("A photo of a {c}",)
        accuracy="top-1 over ImageNet-1k",   # the label space the accuracy is taken over
        metric="mCE over the 15 corruptions, normalised by AlexNet",
    )

``preprocess`` maps a classifier kind (``timm``, ``open_clip_zeroshot``, ``torch_hub``,
``torchscript``, ...; ``"*"`` for every other kind) to the input transform: a
:class:`pipeline.config.protocol.Preprocess` (used as is; ``shifted_crop_only`` feeds images at a
scale > 0 without the resize) or ``"model"`` (the model's own transform, written into
the config as explicit numbers where the kind can state them,
:meth:`pipeline.models.classifiers.Classifier.own_preprocess`), or a function of that own
transform (None where the kind cannot state it) returning either, for a protocol that
keeps part of the model's own (XIMAGENET-12: the original's geometry, the model's
normalisation).  ``templates`` apply to
the zero-shot kinds (:data:`ZERO_SHOT_KINDS`).  ``accuracy`` and ``metric`` are what the
report says; the mechanics behind them stay with the layout (its ``Source.labels`` and
``Source.analyses``).  A layout without ``PROTOCOL`` is evaluated with the config as given.

What applying does (:func:`apply`, called by :func:`pipeline.evaluate.effective_config`)
--------------------------------------------------------------------------------------
Every classifier entry whose ``preprocess`` (or, zero-shot, ``templates``) the config
does not set gets the protocol's; ``config.json`` then records each classifier's resolved
transform.  An entry that sets a different one keeps it, with a warning that its numbers
are not comparable with the published ones.  The protocol's name, the overrides and the
per-classifier inputs go into ``aggregate.analyses`` as the ``release_protocol`` entry, whose
analysis names them in the report (``report/release_protocol.json`` and a section of
``index.html``).

This module imports no torch (config code imports it); resolving ``"model"`` imports the
classifier's library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from pipeline.config.protocol import IMAGENET_MEAN, IMAGENET_STD, Preprocess

ANALYSIS = "release_protocol"
ANY_KIND = "*"
MODEL = "model"
ZERO_SHOT_KINDS = ("open_clip_zeroshot",)
VLM_KIND = "vlm"
# What a vlm entry's recorded inputs are (report/release_protocol.csv, config.json's analysis entry).
VLM_INPUTS = ("prompt_template", "dtype", "vision_dtype", "image_aspect_ratio", "protocol")

# torchvision's eval transform of the ImageNet classifiers (``Resize(256)`` bilinear, its
# default, ``CenterCrop(224)``, ImageNet mean/std): hendrycks' test.py, and
# ``weights.transforms()`` of torchvision's IMAGENET1K_V1 weights (vgg19_bn, vit_b_16).
TORCHVISION_EVAL = Preprocess(256, 224, "bilinear", IMAGENET_MEAN, IMAGENET_STD)


@dataclass(frozen=True)
class ReleaseProtocol:
    """How the authors of a released benchmark evaluated classifiers on it (see the module doc)."""

    name: str
    original: str  # the original evaluation code, "repository path"
    preprocess: Mapping[str, Preprocess | str | Callable[[Preprocess | None], Preprocess | str]]
    accuracy: str
    metric: str
    templates: tuple[str, ...] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    # vlm entries: keys of the entry the protocol fills when unset (``prompt_template``, ``dtype``),
    # and the resolved ``protocol`` parameters the original used (a differing one is an override).
    vlm: Mapping[str, Any] = field(default_factory=dict)
    vlm_protocol: Mapping[str, Any] = field(default_factory=dict)

    def preprocess_for(self, kind: str) -> Preprocess | str | Callable[[Preprocess | None], Preprocess | str] | None:
        """The protocol's transform of a classifier kind (None: the protocol leaves it to the config)."""
        return self.preprocess.get(kind, self.preprocess.get(ANY_KIND))


def _as_dict(choice: Preprocess | str | None) -> dict[str, Any] | str | None:
    return choice.as_dict() if isinstance(choice, Preprocess) else choice


def _same(a: Any, b: Any) -> bool:
    """Two preprocess choices (names or transform dicts) that feed the same input."""
    from pipeline.config.protocol import preprocess_of

    if isinstance(a, dict) and isinstance(b, dict):
        return preprocess_of(a, TORCHVISION_EVAL) == preprocess_of(b, TORCHVISION_EVAL)
    return a == b


def _own_or_none(entry: dict[str, Any], own: Callable[[dict[str, Any]], Preprocess | None]) -> Preprocess | None:
    try:
        return own(entry)
    except Exception:  # the classifier stage reports a model it cannot load, naming the entry
        return None


def _resolve_model(entry: dict[str, Any], own: Callable[[dict[str, Any]], Preprocess | None]) -> dict[str, Any] | str:
    p = _own_or_none(entry, own)
    return p.as_dict() if p is not None else MODEL


def _own_preprocess(entry: dict[str, Any]) -> Preprocess | None:
    from pipeline.config import ClassifierSpec
    from pipeline.registry import CLASSIFIERS

    spec = ClassifierSpec.model_validate(entry)
    cls = CLASSIFIERS.get(spec.kind)
    own = getattr(cls, "own_preprocess", None)
    return own(spec) if own is not None else None


def _apply_vlm(protocol: ReleaseProtocol, entry: dict[str, Any], given: set[str]) -> list[str]:
    """Fill a vlm entry's unset keys with the protocol's; the overrides, one line each."""
    changed = []
    for key, value in protocol.vlm.items():
        if key not in given:
            entry[key] = value
        elif entry.get(key) != value:
            changed.append(f"{key} {entry.get(key)!r} instead of {value!r}")
    asked = entry.get("protocol") or {}
    wanted = dict(protocol.vlm_protocol)
    if "kind" in wanted and asked.get("kind") != wanted["kind"]:  # another protocol: its keys differ anyway
        return [*changed, f"protocol.kind {asked.get('kind')!r} instead of {wanted['kind']!r}"]
    return changed + [
        f"protocol.{key} {asked.get(key)!r} instead of {value!r}" for key, value in wanted.items() if asked.get(key) != value
    ]


def apply(
    protocol: ReleaseProtocol,
    classifiers: list[dict[str, Any]],
    explicit: Mapping[str, set[str]],
    own: Callable[[dict[str, Any]], Preprocess | None] = _own_preprocess,
) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    """The classifier entries under ``protocol``, its ``release_protocol`` analysis entry, warnings.

    ``classifiers``: resolved entries (``model_dump`` of the config's); ``explicit[name]``:
    the keys the config set for that entry (pydantic's ``model_fields_set``).  ``own``
    states a model's own transform (injectable for tests).
    """
    out, inputs, overridden, warnings = [], {}, {}, []
    for entry in classifiers:
        entry = dict(entry)
        name, kind, given = entry["name"], entry["kind"], explicit.get(entry["name"], set())
        choice = protocol.preprocess_for(kind)
        if callable(choice):  # built on the model's own transform
            choice = choice(_own_or_none(entry, own))
        wanted = _as_dict(choice)
        if wanted == MODEL:
            wanted = _resolve_model(entry, own)
        changed = []
        if wanted is not None:
            if "preprocess" not in given or entry.get("preprocess") is None:
                entry["preprocess"] = wanted
            elif not _same(entry["preprocess"], wanted) and not (
                entry["preprocess"] == MODEL and _same(_resolve_model(entry, own), wanted)
            ):
                changed.append(f"preprocess {entry['preprocess']!r} instead of {wanted!r}")
        if protocol.templates is not None and kind in ZERO_SHOT_KINDS:
            if "templates" not in given:
                entry["templates"] = list(protocol.templates)
            elif list(entry["templates"]) != list(protocol.templates):
                changed.append(f"templates {entry['templates']!r} instead of {list(protocol.templates)!r}")
        if kind == VLM_KIND:
            changed += _apply_vlm(protocol, entry, given)
        if changed:
            overridden[name] = changed
            warnings.append(
                f"classifiers[{name}] overrides the {protocol.name} protocol ({'; '.join(changed)}): "
                "its numbers are not comparable with the published ones"
            )
        inputs[name] = {"preprocess": entry.get("preprocess")}
        if kind in ZERO_SHOT_KINDS:
            inputs[name]["templates"] = entry.get("templates")
        if kind == VLM_KIND:
            inputs[name].update({k: entry.get(k) for k in VLM_INPUTS})
        out.append(entry)
    analysis = {
        "name": ANALYSIS,
        "protocol": protocol.name,
        "original": protocol.original,
        "accuracy": protocol.accuracy,
        "metric": protocol.metric,
        "classifiers": inputs,
        "overridden": overridden,
    }
    return out, analysis, warnings


def apply_to(raw: dict[str, Any], cfg: Any, source: Any, protocol: ReleaseProtocol | None) -> None:
    """Put ``protocol`` (that of ``source``'s layout, :func:`pipeline.sources.detect.protocol_of`)
    into ``raw`` (a resolved config dict being made the effective config of an evaluation); its
    warnings join ``source.notes``.  None: nothing to apply."""
    if protocol is None:
        return
    explicit = {c.name: set(c.model_fields_set) for c in cfg.classifiers}
    raw["classifiers"], entry, warnings = apply(protocol, raw["classifiers"], explicit)
    others = [a for a in raw["aggregate"]["analyses"] if (a if isinstance(a, str) else a.get("name")) != ANALYSIS]
    raw["aggregate"]["analyses"] = [*others, entry]
    said = f"evaluated with the {protocol.name} protocol of {protocol.original} (docs/protocol.md)"
    for line in [said, *protocol.notes, *warnings]:
        if line not in source.notes:
            source.notes.append(line)
