"""Image sources for evaluate-only runs: existing images -> trajectory rows.

Role: the front end of ``cnsbench evaluate`` (:mod:`pipeline.evaluate`).  A *source* is a
set of images that already exist; :func:`open_source` indexes one into light *pointer
rows* (:data:`SOURCE_ROW`: a trajectory's coordinates, ids and where each of its images
lives), and :class:`LoadStage` turns pointer rows into the pipeline's trajectory rows
(:data:`pipeline.schema.GENERATED`, or :data:`pipeline.schema.FILTERED` with the filter
columns filled as "not filtered" when the filter is off).  From there the build's own
stages run unchanged.  Only pointers travel through the driver; image bytes are read by
the load actors, so a source of any size streams.

Source kinds (auto-detected by :func:`detect_kind`, or chosen explicitly):

``cns``
    The published CNS-Bench layout: ``annotations_cns.json`` (keys ``info, scales,
    classes, shifts, images``) next to ``{shift}/{NNN_class name}/seed_SSSS_scale_XXXX.jpg``.
    Entries are grouped into trajectories (shift, class, seed) ordered by scale; the label
    is the ImageNet index at the start of the class folder name (the entry's ``class``
    must agree).  If a trajectory lacks its scale-0 image but another shift of the same
    (class, seed) has one, that image is used: in CNS-Bench scale 0 is the same image for
    every shift of a (class, seed).
``webdataset``
    A directory of WebDataset tars, e.g. a ``cnsbench build`` output (``images/*.tar``).
    With committed ``samples`` Parquet shards next to them (a build output), the sample
    coordinates come from those; otherwise from each member's ``.json`` (``class_id`` /
    ``label`` / ``cls`` / ``class``, ``shift`` [default ``none``], ``seed`` [default: index
    within the class], ``scale`` [default 0]).  Images are read by byte range, the tars
    are never unpacked.
``imagenet_c``
    The ImageNet-C release: ``<corruption>/<severity 1..5>/<wnid>/*.JPEG`` (optional
    ``clean/<wnid>/`` as scale 0); corruptions are shifts, severities scales
    (:mod:`pipeline.sources.imagenet_c`).
``folders``
    ``root/<class folder>/<image>``: one image per trajectory, shift ``none``, scale 0,
    seed = index of the image within its class (files sorted by folder, then name; adding
    files therefore renumbers later ones).  Folder -> class id comes from a label map
    (JSON ``{folder name: class id}``), else from a leading integer in the folder name
    (``022_bald eagle``), else from the folder name as a class name of the label space.
``imagenet_e``
    Released ImageNet-E sets, ``root/<set>/<class folder>/<image>`` with an originals set:
    :mod:`pipeline.sources.imagenet_e` (attribute = shift, level = scale, originals = 0).

``imagenet_d``
    The released ImageNet-D layout (:mod:`pipeline.sources.imagenet_d`): nuisance-kind
    folders of class folders, the 113-class label space with its multi-id rule.

Ids follow :mod:`pipeline.plan` (``painting_style/022/seed_0034_scale_1000``), so an
evaluate output has the same layout as a build output and resumes the same way.
Malformed sources raise :class:`SourceError` naming the file and the problem.
"""

from __future__ import annotations

import importlib
import io
import logging
import os
import posixpath
import re
import tarfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

import fsspec
import pyarrow as pa

from pipeline import plan, schema
from pipeline.config import SHIFT_NAME
from pipeline.io.fs import PathEscape, confined_local, safe_relpath
from pipeline.io.safejson import loads as safe_loads
from pipeline.labels import LabelSpace
from pipeline.stages.base import Stage

log = logging.getLogger(__name__)

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
ANNOTATIONS = "annotations_cns.json"
NO_SHIFT = "none"  # shift of images that are not part of a shift trajectory (folders)
IMAGE_EXTENSIONS = {".jpg": "jpg", ".jpeg": "jpg", ".png": "png", ".webp": "webp", ".bmp": "bmp"}

# One row per trajectory; ``paths[i]`` holds the image at ``scales[i]``, read whole when
# ``offsets[i] < 0``, else ``sizes[i]`` bytes from ``offsets[i]`` (a member of a tar).
SOURCE_ROW = pa.schema(
    [
        ("trajectory_id", pa.string()),
        ("unit_id", pa.string()),
        ("class_id", pa.int64()),
        ("class_name", pa.string()),
        ("seed", pa.int64()),
        ("shift", pa.string()),
        ("scales", pa.list_(pa.float64())),
        ("sample_ids", pa.list_(pa.string())),
        ("paths", pa.list_(pa.string())),
        ("offsets", pa.list_(pa.int64())),
        ("sizes", pa.list_(pa.int64())),
    ]
)


class SourceError(ValueError):
    """A source that cannot be evaluated; the message names the file and the problem."""


@dataclass(frozen=True)
class _Image:
    path: str
    offset: int = -1
    size: int = -1
    fmt: str = ""  # from the file extension; the loader checks the bytes


@dataclass
class Source:
    """An indexed source: pointer rows sorted by trajectory id, plus what describes them."""

    kind: str
    location: str
    rows: list[dict[str, Any]]
    image_format: str  # the most common of 'png' / 'jpg' (what the output stores unchanged)
    notes: list[str] = field(default_factory=list)
    analyses: list[str] = field(default_factory=list)  # analyses the layout calls for (added to the report)
    labels: str | None = None  # label space the class ids index (set by layouts with their own, e.g. imagenet_d)

    @property
    def scales(self) -> list[float]:
        return sorted({float(s) for r in self.rows for s in r["scales"]})

    @property
    def classes(self) -> list[int]:
        return sorted({int(r["class_id"]) for r in self.rows})

    @property
    def seeds(self) -> list[int]:
        return sorted({int(r["seed"]) for r in self.rows})

    @property
    def shifts(self) -> list[str]:
        return sorted({str(r["shift"]) for r in self.rows})

    @property
    def n_images(self) -> int:
        return sum(len(r["paths"]) for r in self.rows)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "location": self.location,
            "trajectories": len(self.rows),
            "images": self.n_images,
            "classes": len(self.classes),
            "shifts": self.shifts,
            "scales": self.scales,
            "image_format": self.image_format,
            "notes": self.notes,
        }


# --------------------------------------------------------------------------- helpers
def _fs(location: str) -> tuple[Any, str]:
    return fsspec.core.url_to_fs(location)


def _is_local(location: str) -> bool:
    return "://" not in location or location.startswith("file://")


def _inside_source(path: str, root: str, location: str, what: str, follow_symlinks: bool) -> None:
    """SourceError when a listed local ``path`` resolves outside the source ``root`` (a symlink)."""
    if follow_symlinks or not _is_local(location):
        return
    try:
        confined_local(root, path, what)
    except PathEscape:
        raise SourceError(
            f"{what}: {path} is a symbolic link leading outside the source {location} "
            "(pass --follow-symlinks / source.follow_symlinks: true to allow it)"
        ) from None


def _finite_number(value: Any) -> bool:
    import math

    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _url(fs: Any, path: str, like: str) -> str:
    """A path returned by ``fs`` as a location of the same kind as ``like`` (URL or local path)."""
    return fs.unstrip_protocol(path) if "://" in like else path


def _group_rows(
    groups: dict[tuple[str, int, int], dict[float, _Image]], class_names: dict[int, str]
) -> list[dict[str, Any]]:
    rows = []
    for (shift, class_id, seed), by_scale in groups.items():
        scales = sorted(by_scale)
        images = [by_scale[s] for s in scales]
        rows.append(
            {
                "trajectory_id": plan.trajectory_id(shift, class_id, seed),
                "unit_id": plan.unit_id(class_id, seed),
                "class_id": class_id,
                "class_name": class_names[class_id],
                "seed": seed,
                "shift": shift,
                "scales": scales,
                "sample_ids": [plan.sample_id(shift, class_id, seed, s) for s in scales],
                "paths": [im.path for im in images],
                "offsets": [im.offset for im in images],
                "sizes": [im.size for im in images],
            }
        )
    return sorted(rows, key=lambda r: r["trajectory_id"])


def _dominant_format(formats: Iterable[str]) -> str:
    counts = Counter(f for f in formats if f in ("png", "jpg"))
    return counts.most_common(1)[0][0] if counts else "png"


def _share_scale0(groups: dict[tuple[str, int, int], dict[float, _Image]]) -> int:
    """Give trajectories without a scale-0 image the one of another shift of their (class, seed).

    CNS-Bench generates scale 0 without the slider, so it is the same image for every
    shift; a dataset that stores it once per (class, seed) still yields complete
    trajectories.  Returns how many trajectories borrowed their reference.
    """
    zero: dict[tuple[int, int], _Image] = {}
    for (shift, class_id, seed), by_scale in sorted(groups.items()):
        if 0.0 in by_scale:
            zero.setdefault((class_id, seed), by_scale[0.0])
    n = 0
    for (shift, class_id, seed), by_scale in groups.items():
        if 0.0 not in by_scale and (class_id, seed) in zero:
            by_scale[0.0] = zero[(class_id, seed)]
            n += 1
    return n


def _check_class(class_id: int, labels: LabelSpace, where: str) -> None:
    if not 0 <= class_id < len(labels):
        raise SourceError(f"{where}: class id {class_id} is outside the label space {labels.key!r} (0..{len(labels) - 1})")


def _check_shift(shift: str, where: str) -> None:
    if not SHIFT_NAME.match(shift):
        raise SourceError(f"{where}: shift {shift!r} must match {SHIFT_NAME.pattern}")


def _check_files_exist(rows: list[dict[str, Any]], source: str) -> None:
    """Fail before any worker starts when local image files are missing (lists a few)."""
    missing = [p for r in rows for p in r["paths"] if _is_local(p) and not os.path.isfile(p)]
    if missing:
        shown = "\n  ".join(sorted(set(missing))[:5])
        raise SourceError(f"{source}: {len(set(missing))} image file(s) listed but not found, e.g.\n  {shown}")


# --------------------------------------------------------------------------- detection
def detect_kind(location: str) -> str:
    """The source kind of what ``location`` contains: ``cns``, ``webdataset``, a released layout
    (:data:`RELEASED_LAYOUTS`) or ``folders`` (SourceError when none fits)."""
    fs, root = _fs(location)
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
    if _tar_paths(fs, root):
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


def _tar_paths(fs: Any, root: str) -> list[str]:
    for base in (posixpath.join(root, "images"), root):
        if fs.isdir(base):
            tars = sorted(
                p
                for p in fs.ls(base, detail=False)
                if p.endswith(".tar") and not posixpath.basename(p).startswith(".tmp-")
            )
            if tars:
                return tars
    return []


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
    if not src.rows:
        raise SourceError(f"{location}: no images found in this {kind} source")
    return src


# --------------------------------------------------------------------------- cns
_CLASS_FOLDER = re.compile(r"^(\d+)(?:[_\- ](.*))?$")


def load_cns(location: str, labels: LabelSpace, follow_symlinks: bool = False) -> Source:
    """The published CNS-Bench layout (see the module docstring)."""
    fs, path = _fs(location)
    ann_path = path if fs.isfile(path) else posixpath.join(path, ANNOTATIONS)
    ann = _url(fs, ann_path, location)
    root_dir = posixpath.dirname(ann_path)
    root = _url(fs, root_dir, location)
    if not fs.exists(ann_path):
        raise SourceError(f"{ann}: not found")
    with fs.open(ann_path, "rb") as fh:
        text = fh.read()
    try:
        data = safe_loads(text, ann)  # bounded nesting, no NaN/Infinity
    except ValueError as err:
        raise SourceError(str(err)) from None
    if not isinstance(data, dict):
        raise SourceError(f"{ann}: the top level must be an object with keys info, scales, classes, shifts, images")
    images = data.get("images")
    if not isinstance(images, list):
        raise SourceError(f"{ann}: key 'images' must be a list of image entries, got {type(images).__name__}")
    declared: set[int] | None = None
    if "scales" in data:
        if not isinstance(data["scales"], list) or not all(_finite_number(s) for s in data["scales"]):
            raise SourceError(f"{ann}: key 'scales' must be a list of numbers, got {data['scales']!r}")
        declared = {round(float(s) * 1000) for s in data["scales"]}

    groups: dict[tuple[str, int, int], dict[float, _Image]] = defaultdict(dict)
    names: dict[int, str] = {}
    types = {"image": str, "seed": int, "scale": (int, float), "shift": str, "class": int}
    for i, entry in enumerate(images):
        where = f"{ann}: images[{i}]"
        if not isinstance(entry, dict):
            raise SourceError(f"{where} must be an object, got {type(entry).__name__}")
        for key, typ in types.items():
            if key not in entry:
                raise SourceError(f"{where} lacks key {key!r} (has {sorted(entry)})")
            if isinstance(entry[key], bool) or not isinstance(entry[key], typ):
                raise SourceError(f"{where}: {key!r} has the wrong type: {entry[key]!r}")
        rel, shift, seed = entry["image"], entry["shift"], entry["seed"]
        if not _finite_number(entry["scale"]):
            raise SourceError(f"{where}: 'scale' must be a finite number, got {entry['scale']!r}")
        scale = float(entry["scale"])
        try:  # the image must lie inside the source: no absolute paths, no '..' above it
            full = safe_relpath(root, rel, what=f"{where}: 'image'", follow_symlinks=follow_symlinks)
        except PathEscape as err:
            raise SourceError(str(err)) from None
        rel = posixpath.normpath(rel)
        parts = rel.split("/")
        if len(parts) < 3:
            raise SourceError(f"{where}: image path {rel!r} must look like '<shift>/<NNN_class name>/<file>'")
        if parts[0] != shift:
            raise SourceError(f"{where}: image {rel!r} lies in folder {parts[0]!r} but its shift is {shift!r}")
        m = _CLASS_FOLDER.match(parts[-2])
        if not m:
            raise SourceError(f"{where}: class folder {parts[-2]!r} must start with the ImageNet class index")
        class_id = int(m.group(1))
        if class_id != entry["class"]:
            raise SourceError(f"{where}: class folder {parts[-2]!r} says class {class_id}, the entry says {entry['class']}")
        _check_class(class_id, labels, where)
        _check_shift(shift, where)
        if seed < 0:
            raise SourceError(f"{where}: seed must be >= 0, got {seed}")
        if declared is not None and round(scale * 1000) not in declared:
            raise SourceError(f"{where}: scale {scale} is not among the declared scales {data['scales']}")
        scale = round(scale * 1000) / 1000  # the resolution of the ids (plan.scale_tag)
        group = groups[(shift, class_id, seed)]
        if scale in group:
            raise SourceError(f"{where}: a second image for ({shift}, class {class_id}, seed {seed}, scale {scale})")
        ext = IMAGE_EXTENSIONS.get(os.path.splitext(rel)[1].lower(), "")
        group[scale] = _Image(full, fmt=ext)
        names.setdefault(class_id, (m.group(2) or "").strip() or labels.name(class_id))

    notes = []
    borrowed = _share_scale0(groups)
    if borrowed:
        notes.append(f"{borrowed} trajectories use the scale-0 image of another shift of their (class, seed)")
    rows = _group_rows(groups, names)
    _check_files_exist(rows, ann)
    fmt = _dominant_format(im.fmt for g in groups.values() for im in g.values())
    return Source("cns", root, rows, fmt, notes)


# --------------------------------------------------------------------------- webdataset
def _scan_tar(fs: Any, path: str, source: str, read_json: bool) -> dict[str, dict[str, Any]]:
    """key -> {ext: (offset, size)} plus the parsed ``json`` member when ``read_json``.

    Only headers are read (tarfile seeks over the data of a seekable file); JSON members
    are small and read when asked for.
    """
    out: dict[str, dict[str, Any]] = {}
    try:
        with fs.open(path, "rb") as fh, tarfile.open(fileobj=fh, mode="r:") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                head, _, tail = info.name.rpartition("/")
                stem, _, ext = tail.partition(".")
                key = f"{head}/{stem}" if head else stem
                members = out.setdefault(key, {})
                if ext == "json" and read_json:
                    raw = tar.extractfile(info).read()
                    try:
                        members["json"] = safe_loads(raw, f"{source}: member {info.name!r}")
                    except ValueError as err:
                        raise SourceError(str(err)) from None
                else:
                    members[ext.lower()] = (info.offset_data, info.size)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise SourceError(f"malformed WebDataset shard {source}: {err}") from None
    return out


def _image_member(members: dict[str, Any]) -> tuple[str, tuple[int, int]] | None:
    for ext in ("png", "jpg", "jpeg", "webp", "bmp"):
        if ext in members:
            return ext, members[ext]
    return None


def load_webdataset(location: str, labels: LabelSpace, follow_symlinks: bool = False) -> Source:
    """WebDataset tars, with coordinates from committed ``samples`` Parquet or member JSON."""
    fs, root = _fs(location)
    tars = _tar_paths(fs, root)
    for tar in tars:
        _inside_source(tar, root, location, f"{location}: shard", follow_symlinks)
    if not tars:
        raise SourceError(f"{location}: no WebDataset shards (*.tar) in {location} or its images/ folder")
    samples = None
    if fs.isdir(posixpath.join(root, "samples")):
        from pipeline.aggregate.run import load_samples
        from pipeline.io.store import OutputStore

        samples = load_samples(OutputStore(location))
        if samples.empty:
            samples = None  # a build output without committed shards: fall back to member JSON
    if samples is not None:
        return _webdataset_from_samples(fs, location, root, samples, labels, follow_symlinks)
    return _webdataset_from_json(fs, location, tars, labels)


def _webdataset_from_samples(
    fs: Any, location: str, root: str, samples: Any, labels: LabelSpace, follow_symlinks: bool = False
) -> Source:
    groups: dict[tuple[str, int, int], dict[float, _Image]] = defaultdict(dict)
    names: dict[int, str] = {}
    formats = []
    for shard_rel, part in samples.groupby("shard", sort=True):
        try:  # the samples table names its shard; it must be a file of this source
            safe_relpath(root if _is_local(location) else location, shard_rel, f"{location}: samples 'shard'", follow_symlinks)
        except PathEscape as err:
            raise SourceError(str(err)) from None
        tar_path = posixpath.join(root, posixpath.normpath(str(shard_rel)))
        tar_url = _url(fs, tar_path, location)
        index = _scan_tar(fs, tar_path, tar_url, read_json=False)
        for row in part.itertuples(index=False):
            where = f"{tar_url}: sample {row.sample_id}"
            found = _image_member(index.get(str(row.key), {}))
            if found is None:
                raise SourceError(f"{where}: no image member {row.key!r}.png/.jpg in the shard")
            ext, (offset, size) = found
            class_id, seed, shift = int(row.class_id), int(row.seed), str(row.shift)
            _check_class(class_id, labels, where)
            _check_shift(shift, where)
            scale = round(float(row.scale) * 1000) / 1000
            group = groups[(shift, class_id, seed)]
            if scale in group:
                raise SourceError(f"{where}: a second image for ({shift}, class {class_id}, seed {seed}, scale {scale})")
            group[scale] = _Image(tar_url, offset, size, IMAGE_EXTENSIONS.get("." + ext, ext))
            name = row.class_name
            names.setdefault(class_id, name if isinstance(name, str) and name else labels.name(class_id))
            formats.append(IMAGE_EXTENSIONS.get("." + ext, ext))
    return Source("webdataset", location, _group_rows(groups, names), _dominant_format(formats))


def _json_label(meta: dict[str, Any]) -> Any:
    for key in ("class_id", "label", "cls", "class"):
        if key in meta:
            return meta[key]
    return None


def _webdataset_from_json(fs: Any, location: str, tars: list[str], labels: LabelSpace) -> Source:
    groups: dict[tuple[str, int, int], dict[float, _Image]] = defaultdict(dict)
    names: dict[int, str] = {}
    formats = []
    next_seed: dict[int, int] = defaultdict(int)  # per-class running index for members without a seed
    for tar_path in tars:
        tar_url = _url(fs, tar_path, location)
        for key, members in _scan_tar(fs, tar_path, tar_url, read_json=True).items():
            where = f"{tar_url}: member {key!r}"
            found = _image_member(members)
            if found is None:
                continue  # metadata-only or foreign members carry no image to evaluate
            meta = members.get("json")
            if not isinstance(meta, dict):
                raise SourceError(f"{where}: no {key}.json with the image's class (and shift, seed, scale)")
            label = _json_label(meta)
            if isinstance(label, bool) or not isinstance(label, int):
                raise SourceError(
                    f"{where}.json: needs an integer class under 'class_id', 'label', 'cls' or 'class', got {label!r}"
                )
            shift = meta.get("shift", NO_SHIFT)
            if not isinstance(shift, str):
                raise SourceError(f"{where}.json: 'shift' must be a string, got {shift!r}")
            scale = meta.get("scale", 0.0)
            if not _finite_number(scale):
                raise SourceError(f"{where}.json: 'scale' must be a finite number, got {scale!r}")
            seed = meta.get("seed")
            if seed is None:
                seed = next_seed[label]
                next_seed[label] += 1
            if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
                raise SourceError(f"{where}.json: 'seed' must be an integer >= 0, got {seed!r}")
            _check_class(label, labels, where)
            _check_shift(shift, where)
            scale = round(float(scale) * 1000) / 1000
            group = groups[(shift, label, seed)]
            if scale in group:
                raise SourceError(f"{where}: a second image for ({shift}, class {label}, seed {seed}, scale {scale})")
            ext, (offset, size) = found
            fmt = IMAGE_EXTENSIONS.get("." + ext, ext)
            group[scale] = _Image(tar_url, offset, size, fmt)
            formats.append(fmt)
            name = meta.get("class_name")
            names.setdefault(label, name if isinstance(name, str) and name else labels.name(label))
    notes = []
    borrowed = _share_scale0(groups)
    if borrowed:
        notes.append(f"{borrowed} trajectories use the scale-0 image of another shift of their (class, seed)")
    return Source("webdataset", location, _group_rows(groups, names), _dominant_format(formats), notes)


# --------------------------------------------------------------------------- folders
def _read_label_map(path: str, labels: LabelSpace) -> dict[str, int]:
    if _is_local(path) and os.path.isdir(path):
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
        _check_class(value, labels, f"label map {path}: folder {folder!r}")
        out[str(folder)] = value
    return out


def _folder_class(folder: str, labels: LabelSpace) -> int | None:
    m = _CLASS_FOLDER.match(folder)
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
    fs, root = _fs(location)
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
            _inside_source(p, root, location, f"{location}: folder {name!r}", follow_symlinks)
        if mapping is not None:
            class_id = mapping.get(name)
        else:
            class_id = _folder_class(name, labels)
        if class_id is None:
            unresolved.append(name)
            continue
        _check_class(class_id, labels, f"{location}: folder {name!r}")
        files_by_class[class_id] += [(name, p) for p in images]
    if unresolved:
        shown = ", ".join(repr(n) for n in unresolved[:10])
        how = f"add them to the label map {label_map}" if label_map else "pass --label-map {folder: class id}"
        raise SourceError(f"{location}: no class id for {len(unresolved)} folder(s) ({shown}); {how}")
    groups: dict[tuple[str, int, int], dict[float, _Image]] = {}
    formats = []
    for class_id, files in files_by_class.items():
        for seed, (_, p) in enumerate(sorted(files)):
            fmt = IMAGE_EXTENSIONS[os.path.splitext(p)[1].lower()]
            groups[(NO_SHIFT, class_id, seed)] = {0.0: _Image(_url(fs, p, location), fmt=fmt)}
            formats.append(fmt)
    names = {c: labels.name(c) for c in files_by_class}
    return Source("folders", location, _group_rows(groups, names), _dominant_format(formats))


# --------------------------------------------------------------------------- load stage
_FORMATS = {"JPEG": "jpg", "PNG": "png"}


class LoadStage(Stage):
    """Pointer rows (:data:`SOURCE_ROW`) -> trajectory rows with encoded image bytes.

    Output: :data:`pipeline.schema.GENERATED` (``unet_evals`` and ``gen_seconds`` 0), or
    with ``fill_filter`` :data:`pipeline.schema.FILTERED` with the filter columns as
    "not filtered" (NaN scores, ``n_pass`` 0, ``kept`` True) so the classify stage follows
    directly.  Images already in ``output.image_format`` pass through byte for byte
    (published JPEGs stay the published JPEGs); others are re-encoded to it.  An image that
    cannot be read or decoded fails its trajectory (``error`` starting ``[load]``), as does
    a trajectory without a scale-0 image when the filter (which needs it) follows.
    """

    name = "load"

    def __init__(
        self,
        config: Any,
        output: str | None = None,
        device: str | None = None,
        threads: int | None = None,
        fill_filter: bool = False,
    ) -> None:
        super().__init__(config, output, device, threads)
        self.fill_filter = fill_filter
        self.output_schema = schema.FILTERED if fill_filter else schema.GENERATED

    def batch_keys(self, rows: list[dict[str, Any]]) -> list[str]:
        # Reading files does not kill workers; no crash bookkeeping (and no `resources.load`).
        return []

    def setup(self) -> None:
        pass  # nothing to load; fsspec caches its filesystem instances itself

    def _read(self, path: str, offset: int, size: int) -> bytes:
        fs, p = _fs(path)
        if offset < 0:
            return fs.cat_file(p)
        data = fs.cat_file(p, start=offset, end=offset + size)
        if len(data) != size:
            raise OSError(f"read {len(data)} of {size} bytes at offset {offset} (truncated shard?)")
        return data

    def _image(self, path: str, offset: int, size: int) -> bytes:
        from PIL import Image

        from pipeline.models.sampler import encode_image

        data = self._read(path, offset, size)
        img = Image.open(io.BytesIO(data))
        img.load()  # decode now: a corrupt file fails here, as its trajectory, not in a model stage
        fmt = self.config.output.image_format
        if _FORMATS.get(img.format or "") == fmt:
            return data
        return encode_image(img.convert("RGB"), fmt, self.config.output.jpeg_quality)

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for r in rows:
            row = {k: r[k] for k in ("trajectory_id", "unit_id", "class_id", "class_name", "seed", "shift")}
            row.update(scales=list(r["scales"]), sample_ids=list(r["sample_ids"]), unet_evals=0.0, gen_seconds=0.0)
            error = None
            images: list[bytes] = []
            if not self.fill_filter and 0.0 not in row["scales"]:
                error = "[load] no scale-0 image for this trajectory; the OOC filter needs it as reference"
            else:
                for path, offset, size in zip(r["paths"], r["offsets"], r["sizes"]):
                    where = path if offset < 0 else f"{path} (bytes {offset}..{offset + size})"
                    try:
                        images.append(self._image(path, offset, size))
                    except Exception as err:  # recorded per trajectory; the run goes on
                        error = f"[load] cannot read image {where}: {type(err).__name__}: {err}"
                        break
            if error:
                log.warning("%s: %s", row["trajectory_id"], error)
                row.update(scales=[], sample_ids=[], images=[], error=error)
            else:
                row.update(images=images, error=None)
            if self.fill_filter:
                n = len(row["images"])
                nan = [float("nan")] * n
                row.update({c: nan for c in (*schema.SCORE_COLUMNS, *schema.REALISATION_COLUMNS)})
                row.update(n_pass=[0] * n, kept=[True] * n)
            out.append(row)
        return out
