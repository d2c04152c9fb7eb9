"""Which layout a directory holds (:func:`detect_kind`) and indexing it with that layout's loader (:func:`open_source`)."""

from __future__ import annotations

import importlib
import posixpath
from typing import TYPE_CHECKING

from pipeline.io.files import filesystem
from pipeline.io.image_refs import IMAGES_FILE
from pipeline.labels import LabelSpace
from pipeline.sources.checks import leave_out_unencodable
from pipeline.sources.cns import load_cns
from pipeline.sources.common import ANNOTATIONS, Source, SourceError
from pipeline.sources.folders import load_folders
from pipeline.sources.webdataset import load_webdataset, tar_paths

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.sources.release_protocol import ReleaseProtocol

# Released benchmark layouts, each in its own module: (kind, module, detector, loader, brings
# its own label space).  ``detect_kind`` tries them in this order after the CNS and WebDataset
# layouts and before plain class folders; ``open_source`` calls the loader as
# ``loader(location)`` when the layout brings its own label space, else ``loader(location, labels)``.
RELEASED_LAYOUTS = (
    ("imagenet_d", "pipeline.sources.imagenet_d", "looks_like", "load_imagenet_d", True),
    ("imagenet_c", "pipeline.sources.imagenet_c", "looks_like", "load_imagenet_c", False),
    ("imagenet_e", "pipeline.sources.imagenet_e", "looks_like", "load_imagenet_e", False),
    ("ximagenet", "pipeline.sources.ximagenet", "is_ximagenet", "load_ximagenet", False),
)
RELEASED = {layout[0]: layout for layout in RELEASED_LAYOUTS}
SOURCE_KINDS = ("cns", "webdataset", *RELEASED, "folders")


def detect_kind(location: str) -> str:
    """The source kind of what ``location`` contains: ``cns``, ``webdataset``, a released layout
    (:data:`RELEASED_LAYOUTS`) or ``folders`` (SourceError when none fits)."""
    fs, root = filesystem(location)
    if not fs.exists(root):
        raise SourceError(f"source not found: {location}")
    if fs.isfile(root):
        if root.endswith(".json"):
            return "cns"
        if root.endswith(".tar"):
            raise SourceError(f"{location}: pass the directory holding the tars, not a single tar")
        raise SourceError(f"{location}: a source is a directory (or an {ANNOTATIONS} file)")
    if fs.exists(posixpath.join(root, ANNOTATIONS)):
        return "cns"
    if tar_paths(fs, root) or fs.exists(posixpath.join(root, IMAGES_FILE)):  # an evaluation output refers to its images
        return "webdataset"
    for kind, module, detect, _load, _labels in RELEASED_LAYOUTS:
        if getattr(importlib.import_module(module), detect)(fs, root):
            return kind
    if any(fs.isdir(p) for p in fs.ls(root, detail=False)):
        return "folders"
    raise SourceError(
        f"cannot tell what kind of source {location} is: expected {ANNOTATIONS} (published CNS-Bench layout), "
        "images/*.tar or *.tar (WebDataset), or one sub-folder per class; pass --source-kind"
    )


def open_source(
    location: str,
    labels: LabelSpace,
    kind: str | None = None,
    label_map: str | None = None,
    follow_symlinks: bool = False,
) -> Source:
    """Index the images at ``location`` (kind auto-detected unless given).

    ``labels`` is the benchmark's label space (class ids must index into it; the folders
    kind also resolves folder names with it).  ``label_map`` is the folders kind's JSON
    ``{folder name: class id}``.  Every image path stays inside ``location``; symlinks
    leading out of it are refused unless ``follow_symlinks``.
    """
    kind = kind or detect_kind(location)
    if kind not in SOURCE_KINDS:
        raise SourceError(f"unknown source kind {kind!r}; choose one of {', '.join(SOURCE_KINDS)}")
    if label_map and kind != "folders":
        raise SourceError(f"--label-map applies to class-folder sources only, but {location} is a {kind} source")
    if kind == "cns":
        src = load_cns(location, labels, follow_symlinks)
    elif kind == "webdataset":
        src = load_webdataset(location, labels, follow_symlinks)
    elif kind in RELEASED:
        _kind, module, _detect, load, own_labels = RELEASED[kind]
        loader = getattr(importlib.import_module(module), load)
        src = loader(location) if own_labels else loader(location, labels)
    else:
        src = load_folders(location, labels, label_map, follow_symlinks)
    leave_out_unencodable(src)  # a file name that is not UTF-8: noted, the rest evaluated
    if not src.rows:
        raise SourceError(f"{location}: no images found in this {kind} source")
    return src


def protocol_of(kind: str) -> ReleaseProtocol | None:
    """The ``PROTOCOL`` a released layout's module declares (None for other source kinds)."""
    if kind not in RELEASED:
        return None
    return getattr(importlib.import_module(RELEASED[kind][1]), "PROTOCOL", None)
