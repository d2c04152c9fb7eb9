"""The identity of a model held in memory: everything of the object that can change its outputs.

A ``state_dict`` holds only registered parameters and buffers.  A model's answers also
depend on its plain attributes (a test-time-augmentation flag, a temperature), on modules it
keeps outside ``_modules`` (members in a Python list), on hooks and on the functions it holds.
:func:`object_digest` hashes the whole object graph reachable from the model, in a canonical
order: each object's class, each attribute by name, tensors by dtype, shape and bytes, and
functions by their code and the values they close over.  The same object hashes the same in
every process; a changed flag, list member or weight changes the digest.

What cannot be read (an object without ``__dict__`` that is no container, such as a lock or a
file handle) counts by its class only; ``training`` is left out (a module is evaluated in
eval mode whatever its flag says).
"""

from __future__ import annotations

import enum
import hashlib
import types
from typing import Any

import torch

from pipeline.errors import CnsbenchError

MAX_DEPTH = 64
_SKIPPED = frozenset({"training"})  # evaluation puts every module in eval mode


class NotMaterialized(CnsbenchError):
    """A tensor of the model has no data here (on the ``meta`` device): it cannot be run or hashed."""


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def _tensor(h: Any, t: torch.Tensor, where: str) -> None:
    if t.is_meta:
        raise NotMaterialized(f"{where} is on the 'meta' device (shape {tuple(t.shape)}): it holds no numbers; "
                              "load the weights (e.g. module.to_empty(device='cpu') and load_state_dict) first")
    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    t = t.cpu().contiguous()
    h.update(f"tensor\0{t.dtype}\0{tuple(t.shape)}\0".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


class _Walk:
    """One canonical pass over an object graph (shared objects and cycles are named by their
    first position)."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.seen: dict[int, int] = {}
        self.keep: list[Any] = []  # keeps walked objects alive: ids stay unique during the walk

    def put(self, *parts: str) -> None:
        self.h.update(("\0".join(parts) + "\1").encode())

    def walk(self, obj: Any, where: str, depth: int = 0) -> None:
        if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
            self.put(type(obj).__name__, repr(obj))
            return
        if isinstance(obj, enum.Enum):
            self.put("enum", _qualname(type(obj)), repr(obj.value))
            return
        if depth > MAX_DEPTH:
            self.put("deep", _qualname(type(obj)))
            return
        if id(obj) in self.seen:
            self.put("ref", str(self.seen[id(obj)]))
            return
        self.seen[id(obj)] = len(self.seen)
        self.keep.append(obj)
        if isinstance(obj, torch.Tensor):
            _tensor(self.h, obj, where)
        elif type(obj).__module__ == "numpy" and hasattr(obj, "tobytes"):
            self.put("numpy", str(getattr(obj, "dtype", "")), str(getattr(obj, "shape", "")))
            self.h.update(obj.tobytes())
        elif isinstance(obj, (list, tuple)):
            self.put(type(obj).__name__, str(len(obj)))
            for i, item in enumerate(obj):
                self.walk(item, f"{where}[{i}]", depth + 1)
        elif isinstance(obj, (set, frozenset)):
            self.put(type(obj).__name__, *sorted(repr(x) for x in obj))
        elif isinstance(obj, dict):
            self.put(type(obj).__name__, str(len(obj)))
            for key in sorted(obj, key=repr):
                self.put("key", repr(key))
                self.walk(obj[key], f"{where}[{key!r}]", depth + 1)
        elif isinstance(obj, (types.FunctionType, types.LambdaType)):
            self._function(obj, where, depth)
        elif isinstance(obj, types.MethodType):
            self.put("method", obj.__func__.__qualname__)
            self._function(obj.__func__, where, depth)
            self.walk(obj.__self__, f"{where}.__self__", depth + 1)
        elif isinstance(obj, (type, types.ModuleType, types.BuiltinFunctionType)):
            self.put("named", _qualname(obj) if not isinstance(obj, types.ModuleType) else obj.__name__)
        else:
            self._object(obj, where, depth)

    def _function(self, fn: Any, where: str, depth: int) -> None:
        code = fn.__code__
        self.put("function", _qualname(fn), repr([c for c in code.co_consts if not isinstance(c, types.CodeType)]))
        self.h.update(code.co_code)
        for i, cell in enumerate(fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            self.walk(value, f"{where}.<closure {i}>", depth + 1)
        if fn.__defaults__:
            self.walk(fn.__defaults__, f"{where}.__defaults__", depth + 1)

    def _object(self, obj: Any, where: str, depth: int) -> None:
        self.put("object", _qualname(type(obj)))
        attrs = getattr(obj, "__dict__", None)
        if isinstance(attrs, dict):
            for key in sorted(attrs):
                if key in _SKIPPED and isinstance(obj, torch.nn.Module):
                    continue
                self.put("attr", key)
                self.walk(attrs[key], f"{where}.{key}", depth + 1)
        for slot in getattr(type(obj), "__slots__", ()) if not isinstance(attrs, dict) else ():
            if isinstance(slot, str) and hasattr(obj, slot):
                self.put("slot", slot)
                self.walk(getattr(obj, slot), f"{where}.{slot}", depth + 1)


def object_digest(model: Any, where: str = "model") -> str:
    """SHA-256 over the object graph of ``model`` (see the module doc).  Raises
    :class:`NotMaterialized` naming a tensor on the ``meta`` device."""
    walk = _Walk()
    walk.walk(model, where)
    return walk.h.hexdigest()


def meta_tensors(model: Any) -> list[str]:
    """Names of a module's parameters and buffers on the ``meta`` device (no numbers)."""
    if not isinstance(model, torch.nn.Module):
        return []
    named = [*model.named_parameters(), *model.named_buffers()]
    return [name for name, t in named if t.is_meta]
