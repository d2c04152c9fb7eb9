"""What a ``torch.export`` archive (``.pt2``) may hold before it is loaded: tensors only.

``torch.export.load`` trusts its file: a weight or constant whose payload config says
``use_pickle: true`` goes through ``torch.load(..., weights_only=False)``, opaque constants
through ``pickle.loads``, custom objects through TorchScript's unpickler, sample inputs
fall back to ``weights_only=False`` when the safe load fails, and AOTInductor shared
libraries under ``data/aotinductor/`` are loaded into the process.  Any of them runs code
of the file's author on ``load``.

:func:`check_archive` reads the archive's listing and its JSON configs (never a pickle)
and refuses, naming the file and the entry, anything but this layout::

    <name>/archive_format, archive_version, byteorder, .data/version, .data/serialization_id
    <name>/models/<model>.json                     the program (JSON)
    <name>/data/weights/model_weights_config.json  every entry use_pickle: false
    <name>/data/weights/weight_<i>                 raw tensor bytes
    <name>/data/constants/model_constants_config.json   every entry a tensor_ payload, use_pickle: false
    <name>/data/constants/tensor_<i>               raw tensor bytes
    <name>/data/sample_inputs/<model>.pt           loads with weights_only=True
    <name>/extra/<file>                            text (preprocess.json)

An archive that zip readers could read two ways (a member twice, a second spelling of a
name, bytes before the first member: :mod:`pipeline.io.zip_archive`) is refused first.
The caller loads the very members that were checked (:func:`load_checked` rebuilds the
archive from them), so neither a swapped file nor a second copy of a member is loaded.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

from pipeline.io import zip_archive

ROOT_FILES = {"archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id"}
WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
ALLOWED = (
    re.compile(r"models/[A-Za-z0-9_.\-]+\.json"),
    re.compile(r"data/weights/weight_\d+"),
    re.compile(r"data/constants/tensor_\d+"),
    re.compile(r"data/sample_inputs/[A-Za-z0-9_.\-]+\.pt"),
    re.compile(r"extra/[A-Za-z0-9_.\-]+"),
)
MAX_CONFIG_BYTES = 64 * 1024 * 1024  # a payload config lists one entry per tensor


UnsafeArchive = zip_archive.UnsafeArchive  # a model archive refused before anything is loaded


def _payload_config(body: bytes, name: str, path: str) -> dict[str, Any]:
    if len(body) > MAX_CONFIG_BYTES:
        raise UnsafeArchive(f"{path}: {name}: {len(body)} bytes; refused")
    try:
        config = json.loads(body).get("config")
    except (ValueError, AttributeError) as err:
        raise UnsafeArchive(f"{path}: {name} is not a payload config: {err}") from None
    if not isinstance(config, dict):
        raise UnsafeArchive(f"{path}: {name}: 'config' is not a mapping")
    return config


def _check_payloads(body: bytes, name: str, path: str, prefix: str) -> None:
    for fqn, meta in _payload_config(body, name, path).items():
        if not isinstance(meta, dict):
            raise UnsafeArchive(f"{path}: {name}: entry {fqn!r} is not a mapping")
        payload = str(meta.get("path_name", ""))
        if meta.get("use_pickle") is not False:
            raise UnsafeArchive(
                f"{path}: {name}: {fqn!r} is stored pickled (use_pickle: {meta.get('use_pickle')!r}); "
                "loading it would run code from the file; only raw tensors are accepted"
            )
        if not re.fullmatch(rf"{prefix}_\d+", payload):
            raise UnsafeArchive(f"{path}: {name}: {fqn!r} is a {payload.split('_')[0] or 'unnamed'!r} payload "
                                f"({payload!r}), not a tensor; only raw tensors are accepted")


def _check_sample_inputs(body: bytes, name: str, path: str) -> None:
    import torch

    try:
        torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)
    except Exception as err:  # torch would retry this one with weights_only=False
        raise UnsafeArchive(f"{path}: {name} does not load as tensors only (weights_only=True): "
                            f"{str(err).splitlines()[0][:200]}") from None


def check_archive(data: bytes, path: str) -> zip_archive.Members:
    """The members of the archive ``data`` (the bytes of ``path``), or :class:`UnsafeArchive`
    naming ``path`` and the member, when it holds anything but the layout of the module doc
    or could be read two ways (:func:`pipeline.io.zip_archive.read_members`)."""
    archive = zip_archive.read_members(data, path)
    members = archive.files
    if not any(r.startswith("models/") for r in members):
        raise UnsafeArchive(f"{path}: holds no exported program (no models/<name>.json); "
                            "write it with torch.export.save")
    if WEIGHTS_CONFIG not in members or CONSTANTS_CONFIG not in members:
        missing = WEIGHTS_CONFIG if WEIGHTS_CONFIG not in members else CONSTANTS_CONFIG
        raise UnsafeArchive(f"{path}: lacks {missing} (an archive of another torch version?); "
                            "export it again with torch.export.save")
    _check_payloads(members[WEIGHTS_CONFIG], f"{archive.top}/{WEIGHTS_CONFIG}", path, "weight")
    _check_payloads(members[CONSTANTS_CONFIG], f"{archive.top}/{CONSTANTS_CONFIG}", path, "tensor")
    for rel in members:
        if rel in ROOT_FILES or rel in (WEIGHTS_CONFIG, CONSTANTS_CONFIG):
            continue
        if not any(p.fullmatch(rel) for p in ALLOWED):
            what = "compiled code (AOTInductor)" if rel.startswith("data/aotinductor/") or rel.endswith(".so") else \
                "a member outside the tensors-only layout"
            raise UnsafeArchive(f"{path}: holds {rel!r}, {what}; refused (docs/safety.md: what a model file may hold)")
    for rel, body in members.items():
        if rel.startswith("data/sample_inputs/"):
            _check_sample_inputs(body, f"{archive.top}/{rel}", path)
    return archive


def load_members(archive: zip_archive.Members):
    """The ``ExportedProgram`` of members that :func:`check_archive` returned, loaded from an
    archive rebuilt of exactly those members."""
    import torch

    return torch.export.load(io.BytesIO(zip_archive.rebuild(archive)))


def load_checked(data: bytes, path: str):
    """The ``ExportedProgram`` in ``data`` (the bytes of ``path``), after :func:`check_archive`."""
    return load_members(check_archive(data, path))
