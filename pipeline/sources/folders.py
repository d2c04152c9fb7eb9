"""Plain class folders, ``root/<class folder>/<image>``: one image per trajectory, shift ``none``, scale 0."""

from __future__ import annotations

import os
import posixpath
from collections import defaultdict

import fsspec

from pipeline.io.files import as_location, filesystem, is_local
from pipeline.io.safejson import loads as safe_loads
from pipeline.labels import LabelSpace
from pipeline.sources.checks import check_class, inside_source
from pipeline.sources.common import CLASS_FOLDER, IMAGE_EXTENSIONS, NO_SHIFT, Source, SourceError
from pipeline.sources.grouping import ImageRef, dominant_format, group_rows


def _read_label_map(path: str, labels: LabelSpace) -> dict[str, int]:
    if is_local(path) and os.path.isdir(path):
        raise SourceError(f"label map {path}: is a directory, not a JSON file")
    try:
        with fsspec.open(path, "rb") as fh:
            data = safe_loads(fh.read(), f"label map {path}")
    except FileNotFoundError:
        raise SourceError(f"label map not found: {path}") from None
    except ValueError as err:
        raise SourceError(str(err)) from None
    if not isinstance(data, dict):
        raise SourceError(f"label map {path}: must be a JSON object {{folder name: class id}}")
    out = {}
    for folder, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise SourceError(f"label map {path}: class id of folder {folder!r} must be an integer, got {value!r}")
        check_class(value, labels, f"label map {path}: folder {folder!r}")
        out[str(folder)] = value
    return out


def folder_class(folder: str, labels: LabelSpace) -> int | None:
    """The class id a folder name stands for: its leading index (``022_bald eagle``), else the label space's
    name for it; None when it is neither."""
    m = CLASS_FOLDER.fullmatch(folder)
    if m:
        return int(m.group(1))
    try:
        return labels.resolve(folder)
    except ValueError:
        return None


def load_folders(
    location: str, labels: LabelSpace, label_map: str | None = None, follow_symlinks: bool = False
) -> Source:
    """``root/<class folder>/<image>``, one single-image trajectory per file (see the module docstring)."""
    fs, root = filesystem(location)
    if not fs.isdir(root):
        raise SourceError(f"{location}: not a directory (class-folder sources are a folder of class folders)")
    folders = sorted(p for p in fs.ls(root, detail=False) if fs.isdir(p) and not posixpath.basename(p).startswith("."))
    if not folders:
        raise SourceError(f"{location}: no class sub-folders")
    mapping = _read_label_map(label_map, labels) if label_map else None
    files_by_class: dict[int, list[tuple[str, str]]] = defaultdict(list)
    unresolved = []
    for folder in folders:
        name = posixpath.basename(folder.rstrip("/"))
        images = sorted(
            p for p in fs.ls(folder, detail=False) if os.path.splitext(p)[1].lower() in IMAGE_EXTENSIONS
        )
        if not images:
            continue
        for p in [folder, *images]:
            inside_source(p, root, location, f"{location}: folder {name!r}", follow_symlinks)
        if mapping is not None:
            class_id = mapping.get(name)
        else:
            class_id = folder_class(name, labels)
        if class_id is None:
            unresolved.append(name)
            continue
        check_class(class_id, labels, f"{location}: folder {name!r}")
        files_by_class[class_id] += [(name, p) for p in images]
    if unresolved:
        shown = ", ".join(repr(n) for n in unresolved[:10])
        how = f"add them to the label map {label_map}" if label_map else "pass --label-map {folder: class id}"
        raise SourceError(f"{location}: no class id for {len(unresolved)} folder(s) ({shown}); {how}")
    groups: dict[tuple[str, int, int], dict[float, ImageRef]] = {}
    formats = []
    for class_id, files in files_by_class.items():
        for seed, (_, p) in enumerate(sorted(files)):
            fmt = IMAGE_EXTENSIONS[os.path.splitext(p)[1].lower()]
            groups[(NO_SHIFT, class_id, seed)] = {0.0: ImageRef(as_location(fs, p, location), fmt=fmt)}
            formats.append(fmt)
    names = {c: labels.name(c) for c in files_by_class}
    return Source("folders", location, group_rows(groups, names), dominant_format(formats))
