"""Preprocessing saved inside a model archive, for the kinds that load a whole program.

A TorchScript file (``torch.jit.save``) and a ``torch.export`` program (``.pt2``,
``torch.export.save``) are zip archives that can carry extra files; both classifier kinds
that load them (``torchscript``, ``exported``) read their input transform from a
``preprocess.json`` saved beside the program in ``<archive>/extra/``::

    {"input_size": [3, 224, 224], "mean": [...], "std": [...], "interpolation": "bilinear"}

The model is fed ``Resize((H, W))`` (both sides, the aspect ratio not kept), scaled to
[0, 1], normalised with ``mean``/``std``; an entry's ``model_kwargs`` (the same four keys)
override the saved values, and ``input_size`` must come from one of them.  The archive is
read as a zip, so the transform is known without loading the program (a card states it);
it is read as torch reads it, one copy per member name (:mod:`pipeline.io.zip_archive`).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Callable

from pipeline.errors import CnsbenchError
from pipeline.io import regular, zip_archive

PREPROCESS_FILE = "preprocess.json"
KEYS = frozenset({"input_size", "mean", "std", "interpolation"})
DEFAULTS: dict[str, Any] = {"mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0], "interpolation": "bilinear"}
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
MAX_ARCHIVE_BYTES = 1 << 36  # a program archive is read whole (its members are checked in memory)


def saved_preprocess(members: zip_archive.Members, path: str) -> str:
    """The text of ``<archive>/extra/preprocess.json`` among checked ``members`` ("" when none)."""
    try:
        return members.files.get(f"extra/{PREPROCESS_FILE}", b"").decode("utf-8")
    except UnicodeDecodeError as err:
        raise CnsbenchError(f"{path}: extra/{PREPROCESS_FILE} is not UTF-8 text ({err})") from None


def archive_preprocess(path: str) -> str:
    """The text of ``<archive>/extra/preprocess.json`` in the zip at ``path`` ("" when it has
    none), read as the loader reads it (:mod:`pipeline.io.zip_archive`: one copy per name)."""
    try:
        data = regular.read_bounded(path, MAX_ARCHIVE_BYTES, "model archive")
    except OSError as err:
        raise CnsbenchError(f"{path}: not a readable model archive ({err})") from None
    return saved_preprocess(zip_archive.read_members(data, path), path)


def check_types(cfg: dict[str, Any], origin: dict[str, str]) -> None:
    """ValueError naming the key and where it came from unless each preprocessing value has its type."""

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    checks = {
        "input_size": ("a list [C, H, W] of 3 positive integers", lambda v: isinstance(v, list) and len(v) == 3
                       and all(isinstance(x, int) and not isinstance(x, bool) and 0 < x <= 8192 for x in v)),
        "mean": ("a list of numbers, one per channel", lambda v: isinstance(v, list) and all(map(number, v))),
        "std": ("a list of non-zero numbers, one per channel",
                lambda v: isinstance(v, list) and all(number(x) and x != 0 for x in v)),
        "interpolation": ("a string", lambda v: isinstance(v, str)),
    }
    for key, (what, ok) in checks.items():
        if not ok(cfg[key]):
            raise CnsbenchError(f"{origin.get(key, key)}: {key} must be {what}, got {cfg[key]!r}"[:400])


def resolve(saved: str, model_kwargs: dict[str, Any], where: str, path: str, kind: str) -> dict[str, Any]:
    """The effective preprocessing: defaults, then the saved ``preprocess.json`` text, then
    ``model_kwargs``; checked, with each bad value named by where it came from."""
    unknown = sorted(set(model_kwargs) - KEYS)
    if unknown:
        raise CnsbenchError(f"{where}.model_kwargs: unknown keys {unknown} for kind {kind}; allowed: {sorted(KEYS)}")
    cfg: dict[str, Any] = dict(DEFAULTS)
    in_file = f"{PREPROCESS_FILE} of {path}"
    origin: dict[str, str] = {}
    if saved:
        try:
            data = json.loads(saved)
        except json.JSONDecodeError as err:
            raise CnsbenchError(f"{where}: {PREPROCESS_FILE} in {path} is not JSON: {err}") from None
        if not isinstance(data, dict):
            raise CnsbenchError(f"{where}: {in_file} must be a JSON object, got {type(data).__name__}")
        cfg.update(data)
        origin.update({k: f"{where}: {k} in {in_file}" for k in data})
    cfg.update(model_kwargs)
    origin.update({k: f"{where}.model_kwargs.{k}" for k in model_kwargs})
    if "input_size" not in cfg:
        raise CnsbenchError(
            f"{where}: no input_size; set model_kwargs.input_size (e.g. [3, 224, 224]) or save the model "
            f"with a {PREPROCESS_FILE} extra file"
        )
    check_types(cfg, origin)
    size = list(cfg["input_size"])
    if len(cfg["mean"]) != size[0] or len(cfg["std"]) != size[0]:
        raise CnsbenchError(
            f"{where}: input_size must be [C, H, W] and mean/std have C entries, got "
            f"input_size={cfg['input_size']}, mean={cfg['mean']}, std={cfg['std']}"
        )
    if cfg["interpolation"] not in INTERPOLATIONS:
        raise CnsbenchError(f"{where}: interpolation must be one of {sorted(INTERPOLATIONS)}, got {cfg['interpolation']!r}")
    return {k: cfg[k] for k in ("input_size", "mean", "std", "interpolation")}


def transform(cfg: dict[str, Any]) -> Callable[[Any], Any]:
    """PIL image -> the model's input tensor for a resolved preprocessing ``cfg``
    (grey for one channel, RGB otherwise)."""
    from torchvision import transforms

    modes = {"bilinear": transforms.InterpolationMode.BILINEAR, "bicubic": transforms.InterpolationMode.BICUBIC,
             "nearest": transforms.InterpolationMode.NEAREST}
    channels, height, width = cfg["input_size"]
    compose = transforms.Compose([
        transforms.Resize((height, width), interpolation=modes[cfg["interpolation"]], antialias=True),
        transforms.ToTensor(),
        transforms.Normalize(cfg["mean"], cfg["std"]),
    ])
    mode = "L" if channels == 1 else "RGB"
    return lambda image: compose(image.convert(mode))


def archive_transform(spec: Any, kind: str) -> dict[str, Any] | None:
    """The input transform an archive entry (``torchscript``, ``exported``) stores, as numbers; None
    where its file is not here or states none."""
    if not (spec.checkpoint and os.path.isfile(spec.checkpoint)):
        return None
    try:
        saved = archive_preprocess(spec.checkpoint)
        cfg = resolve(saved, spec.model_kwargs, f"classifiers[{spec.name}]", spec.checkpoint, kind)
    except ValueError:
        return None
    return {"resize_to": cfg["input_size"], "interpolation": cfg["interpolation"], "mean": cfg["mean"], "std": cfg["std"]}
