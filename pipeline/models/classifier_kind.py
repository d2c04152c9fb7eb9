"""What a classifier kind is: its two roles and the class-level hooks the rest of the project asks.

A kind (an entry of ``CLASSIFIERS``) is one class, and everything the project needs to know
about it before loading a model it answers itself, from its config entry alone, as a
:class:`pipeline.families.base.Family` does.  The callers iterate the registry instead of
switching on kind names:

==========================  ===============================================================
hook                        asked by
==========================  ===============================================================
``Spec``                    its options model (:mod:`pipeline.config.classifiers`; a kind
                            with options of its own has a subclass there)
``local_files(spec)``       the asset check, the weights digest, ``./`` paths of a card's
                            entry (:class:`LocalFile`: key, path, folder or file)
``hub_refs(spec)``          ``validate`` and ``cnsbench prefetch`` (:class:`HubRef`)
``problems(spec, where)``   the up-front check: what refuses the entry before loading
``file_problems``           the same, on its files' content (an archive holding pickles)
``cached_weights(spec)``    identity: a pretrained file in the hub cache, hashed as weights
``held_weights(spec)``      identity: weights held by the process, not in a file
``input_transform(spec)``   identity: its own input transform as numbers, or None
``footprint(spec, n)``      cost: its memory (:mod:`pipeline.models.footprint`)
``flops_model(spec)``       cost: the model whose FLOP count is its own, or None (unknown)
==========================  ===============================================================

The two roles are two bases: a :class:`pipeline.models.classifiers.Classifier` ranks
(``predict(images) -> logits`` over ``out_to_label``); an :class:`AskingClassifier`
answers questions drawn from the others' rankings (``answer(...)``, the vlms).  Each
implements only its own method.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol, Sequence

from pipeline.config import ClassifierSpec
from pipeline.labels import LabelSpace

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.models.footprint import ModelSize
    from pipeline.models.precision import ModelPrecision


class LocalFile(NamedTuple):
    """A local path an entry reads: its config key, the path, whether it may be a folder (a
    hub snapshot), and whether it may instead be a hub repository id."""

    key: str
    path: str
    folder: bool = False
    or_hub_id: bool = False


@dataclass(frozen=True)
class HubRef:
    """A hub artefact an entry downloads: the library that fetches it (``timm``, ``open_clip``,
    ``transformers``, ``torch hub``: :func:`pipeline.assets.hub.hub_artefacts`) and its arguments."""

    library: str
    args: tuple[Any, ...]


def local_file_ref(value: str | None) -> bool:
    """open_clip ``pretrained`` / timm checkpoints may be tags; treat path-like values as files."""
    return bool(value) and ("/" in value or value.endswith((".pt", ".pth", ".bin", ".safetensors")))


def is_hub_id(value: str) -> bool:
    """Whether ``value`` is a well-formed hub repository id (``name`` or ``namespace/name``), by
    huggingface_hub's own rule (``validate_repo_id``: letters, digits, ``_ - .``, no ``--`` or
    ``..``, at most 96 characters, not ending in ``.git``)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(value, str) or not value:
        return False
    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return True


def model_ref_problem(value: str, key: str) -> str | None:
    """Why ``value`` (the config's ``key``) names no model: None for an existing local path or a hub id."""
    if isinstance(value, str) and value and os.path.exists(value):
        return None
    if is_hub_id(value):
        return None
    return (
        f"{key}: {value!r} is neither an existing local path nor a hub id (name or org/name: letters, digits, "
        "'_', '-', '.', no '..' or '--'); relative paths are resolved against the config's directory"
    )


class Answered(Protocol):
    """What :meth:`AskingClassifier.answer` returns, per image (:class:`pipeline.models.vlm.VLMOutputs`)."""

    top1: list[int]
    top5: list[list[int]]
    p_true: list[float]
    answers: list[str | None]

    @property
    def excluded(self) -> list[bool]: ...


class BaseClassifier(abc.ABC):
    """The contract of a classifier kind (see the module doc); ``CLASSIFIERS`` refuses any other class."""

    Spec: ClassVar[type[ClassifierSpec]] = ClassifierSpec
    # True: the kind answers questions drawn from the other classifiers' rankings, and runs after them.
    asks: ClassVar[bool] = False
    spec: ClassifierSpec
    device: str

    @abc.abstractmethod
    def __init__(self, spec: ClassifierSpec, device: str, labels: LabelSpace | None = None) -> None: ...

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    @abc.abstractmethod
    def out_to_label(self) -> list[int]:
        """Class id of each output index (-1 where an output maps to no class)."""

    @abc.abstractmethod
    def set_precision(self, precision: "ModelPrecision") -> None:
        """Run in the stage's ``precision`` (``resources.classify``), or keep the kind's own dtypes."""

    # ------------------------------------------------------------------ what it reads and downloads
    @classmethod
    def local_files(cls, spec: ClassifierSpec) -> list[LocalFile]:
        """The local paths the entry names: its options model's ``file_keys`` that are set."""
        out = []
        for key in type(spec).file_keys:
            value = getattr(spec, key, None)
            if isinstance(value, str) and value:
                folder = key in type(spec).folder_keys
                out.append(LocalFile(key, value, folder=folder, or_hub_id=folder))
        return out

    @classmethod
    def hub_refs(cls, spec: ClassifierSpec) -> list[HubRef]:
        """The hub artefacts the entry downloads on first use (none by default)."""
        return []

    @classmethod
    def problems(cls, spec: ClassifierSpec, where: str) -> list[str]:
        """What refuses the entry before anything loads (a name its library does not know), one line each."""
        return []

    @classmethod
    def file_problems(cls, spec: ClassifierSpec, where: str) -> list[str]:
        """What refuses the content of the entry's readable files (checked after they are found regular)."""
        return []

    # ------------------------------------------------------------------ identity
    @classmethod
    def cached_weights(cls, spec: ClassifierSpec) -> tuple[str | None, str | None]:
        """(file in the local hub cache, hub reference) of pretrained weights the kind downloads;
        (None, None) where it downloads none."""
        return None, None

    @classmethod
    def held_weights(cls, spec: ClassifierSpec) -> list[dict[str, Any]]:
        """Weights the entry names by digest rather than by file (``{"key", "ref", "sha256"}``)."""
        return []

    @classmethod
    def input_transform(cls, spec: ClassifierSpec) -> dict[str, Any] | None:
        """Its own input transform as numbers (:meth:`own_preprocess` as a dict), None where unknown."""
        p = cls.own_preprocess(spec)
        return p.as_dict() if p is not None else None

    @classmethod
    def own_preprocess(cls, spec: ClassifierSpec) -> Any:
        """The model's own eval transform as a :class:`pipeline.config.protocol.Preprocess`, read from its
        configuration without loading weights; None where the kind cannot state it as one."""
        return None

    # ------------------------------------------------------------------ cost
    @classmethod
    def footprint(cls, spec: ClassifierSpec, images: int) -> "ModelSize":
        """The model's size at ``images`` per forward, from its config alone (no weights read)."""
        raise LookupError(f"no size estimate for classifier kind {spec.kind!r}")

    @classmethod
    def flops_model(cls, spec: ClassifierSpec) -> tuple[str, dict[str, Any]] | None:
        """(model, model_kwargs) whose FLOPs per image are this entry's (looked up in
        ``pipeline/data/model_flops.json``, else counted from its timm twin); None: unknown."""
        return spec.model, dict(spec.model_kwargs)


class AskingClassifier(BaseClassifier):
    """Base of the kinds that answer questions (``asks``): ``answer(...)`` per image, no logits."""

    asks: ClassVar[bool] = True

    @abc.abstractmethod
    def answer(
        self, images: Sequence[Any], truth: Sequence[int], sample_ids: Sequence[str],
        params: Sequence[str | None], rankings: dict[str, list[list[int]]],
    ) -> Answered:
        """Ask every image a question and score the answer; ``rankings``: the ranking classifiers' top-5."""
