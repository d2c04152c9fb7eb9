"""Classifier kind ``module``: a model held in memory (a ``torch.nn.Module``, or any callable from a
float batch ``[N, C, H, W]`` to logits ``[N, K]``), as ``pipeline.evaluate`` and ``pipeline.card``
take it from a Python session.

The entry names no file: the object travels with it (:attr:`pipeline.config.ClassifierSpec.held`;
to Ray's actors by ``ray.put``, :func:`pipeline.executors.ray_data.held_by_reference`).  Its
``model`` is the object's class's qualified name; its ``preprocess`` is ``cns`` or an explicit
transform (a module states no transform of its own).  Its identity on outputs and cards is
that name, a SHA-256 over the object (its weights, plain attributes, modules held outside
``_modules``, hooks and held functions: :func:`state_digest`), the transform as numbers, and
its logits on a probe batch of the output's images (:mod:`pipeline.stages.probe`): the same
name with another model is refused by an output's weights and probe checks, naming both.  What it returns is checked on
every batch: a tensor of ``[N, K]`` finite logits, ``K`` the same on every batch.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import torch

from pipeline.config import ClassifierSpec
from pipeline.errors import CnsbenchError
from pipeline.labels import LabelSpace
from pipeline.models.classifiers import Classifier


def qualified_name(model: Any) -> str:
    """``module.QualName`` of the object's class (a function: its own)."""
    target = model if callable(model) and not isinstance(model, torch.nn.Module) and hasattr(model, "__qualname__") \
        else type(model)
    return f"{target.__module__}.{target.__qualname__}"


def state_digest(model: Any) -> str:
    """SHA-256 identifying a model held in memory: for a module, its whole object graph
    (:func:`pipeline.models.identity.object_digest`: weights, plain attributes, modules held
    outside ``_modules``, hooks and held functions); a callable that is no module: its pickled
    form (cloudpickle, by value, closures included)."""
    if isinstance(model, torch.nn.Module):
        from pipeline.models.identity import object_digest

        return object_digest(model)
    import cloudpickle

    return hashlib.sha256(cloudpickle.dumps(model)).hexdigest()


NOT_HELD = ("kind module evaluates a model held in memory (pipeline.evaluate, pipeline.card); "
            "a config file cannot name one")
NO_TRANSFORM = ("a module states no transform of its own; give 'cns' or an explicit one "
                "(resize, crop, interpolation, mean, std)")


def materialized_problem(model: Any) -> str | None:
    """What stops the module from running here: parameters or buffers on the ``meta`` device."""
    from pipeline.models.identity import meta_tensors

    meta = meta_tensors(model)
    if not meta:
        return None
    return (f"{len(meta)} parameter(s) or buffer(s) are on the 'meta' device, which holds no numbers "
            f"({', '.join(meta[:5])}{' …' if len(meta) > 5 else ''}); load the weights first "
            "(e.g. module.to_empty(device='cpu') then load_state_dict)")


def held_model(spec: ClassifierSpec, where: str) -> Any:
    """The entry's object (fetched from Ray's object store where it travelled by reference)."""
    held = spec.held
    if held is None:
        raise CnsbenchError(f"{where}: {NOT_HELD}")
    if type(held).__name__ == "ObjectRef":
        import ray

        held = ray.get(held)
    return held


class ModuleClassifier(Classifier):
    """A model held in memory (see the module doc)."""

    def __init__(self, spec: ClassifierSpec, device: str, labels: LabelSpace | None = None) -> None:
        super().__init__(spec, device, labels)
        if self._input_transform is None:
            raise CnsbenchError(f"{self.where}.preprocess: {NO_TRANSFORM}")
        model = held_model(spec, self.where)
        problem = materialized_problem(model)
        if problem:
            raise CnsbenchError(f"{self.where}: {problem}")
        if isinstance(model, torch.nn.Module):
            # A copy on the stage's device: the caller's module stays where it is, in its mode
            # (one that cannot be copied, holding a lock or a handle, is used as it is).
            try:
                model = copy.deepcopy(model)
            except Exception:  # noqa: BLE001 - copying runs the object's own code
                pass
            model = model.to(device).eval()
        self.model = model
        self._n_out: int | None = None
        with torch.inference_mode():
            from PIL import Image

            probe = self._forward(self.inputs([Image.new("RGB", (8, 8))] * 2).to(device))
        self._map_outputs(int(probe.shape[1]))

    def _map_outputs(self, n_out: int) -> None:
        """As every kind maps them, but a ``label_map`` must map every output: a model in memory
        can drop the outputs it does not mean (an unmapped output's predictions would silently
        count as wrong)."""
        unmapped = sorted(set(range(n_out)) - set(self._label_map)) if self._label_map is not None else []
        if unmapped:
            raise CnsbenchError(f"{self.where}.label_map: maps {n_out - len(unmapped)} of the model's {n_out} outputs; "
                             f"outputs {unmapped[:10]}{' …' if len(unmapped) > 10 else ''} are unmapped: map every "
                             "output to a class id, or return only the logits of the classes the map names")
        super()._map_outputs(n_out)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """The model's logits of a batch, refused naming what was wrong (it raised, returned no
        tensor, another shape or number of logits, NaN or infinity)."""
        try:
            out = self.model(x)
        except Exception as err:  # noqa: BLE001 - the user's code
            raise CnsbenchError(f"{self.where}: the model raised on a batch of shape {tuple(x.shape)}: "
                             f"{type(err).__name__}: {err}"[:600]) from None
        if not isinstance(out, torch.Tensor):
            raise CnsbenchError(f"{self.where}: the model returned a {type(out).__name__}, not a logits tensor [N, K]")
        if out.ndim != 2 or out.shape[0] != x.shape[0]:
            raise CnsbenchError(f"{self.where}: the model returned shape {tuple(out.shape)} for a batch of "
                             f"{x.shape[0]}; expected logits [{x.shape[0]}, K]")
        if self._n_out is not None and out.shape[1] != self._n_out:
            raise CnsbenchError(f"{self.where}: the model returned {out.shape[1]} logits per image, "
                             f"then {self._n_out} on an earlier batch")
        if not torch.isfinite(out).all():
            raise CnsbenchError(f"{self.where}: the model returned NaN or infinite logits")
        self._n_out = int(out.shape[1])
        return out

    @classmethod
    def problems(cls, spec: ClassifierSpec, where: str) -> list[str]:
        if spec.held is None:
            return [f"{where}: {NOT_HELD}"]
        if spec.preprocess in (None, "model"):
            return [f"{where}.preprocess: {NO_TRANSFORM}"]
        return []

    @classmethod
    def held_weights(cls, spec: ClassifierSpec) -> list[dict[str, Any]]:
        """Its object's digest (None where the entry holds no object here, as read from an output)."""
        held = spec.held
        digest = state_digest(held) if held is not None and type(held).__name__ != "ObjectRef" else None
        return [{"key": "state_dict", "ref": spec.model, "sha256": digest}]

    @classmethod
    def input_transform(cls, spec: ClassifierSpec) -> dict[str, Any] | None:
        from pipeline.config.protocol import CNS_CLASSIFIER, preprocess_of

        p = preprocess_of(spec.preprocess, CNS_CLASSIFIER)
        return p.as_dict() if p is not None else None

    @classmethod
    def flops_model(cls, spec: ClassifierSpec) -> None:
        """Unknown: the module's code is not a model the FLOP table or timm knows."""
        return None
