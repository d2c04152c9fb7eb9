"""The published CNS-Bench layout: ``annotations_cns.json`` next to ``{shift}/{NNN_class name}/seed_SSSS_scale_XXXX.jpg``."""

from __future__ import annotations

import os
import posixpath
from collections import defaultdict

from pipeline.io.files import as_location, filesystem
from pipeline.io.fs import PathEscape, safe_relpath
from pipeline.io.safejson import loads as safe_loads
from pipeline.labels import LabelSpace
from pipeline.sources.checks import check_class, check_files_exist, check_shift, finite_number
from pipeline.sources.common import ANNOTATIONS, CLASS_FOLDER, IMAGE_EXTENSIONS, Source, SourceError
from pipeline.sources.grouping import ImageRef, dominant_format, group_rows, share_scale0


def load_cns(location: str, labels: LabelSpace, follow_symlinks: bool = False) -> Source:
    """The published CNS-Bench layout (see the module docstring)."""
    fs, path = filesystem(location)
    ann_path = path if fs.isfile(path) else posixpath.join(path, ANNOTATIONS)
    ann = as_location(fs, ann_path, location)
    root_dir = posixpath.dirname(ann_path)
    root = as_location(fs, root_dir, location)
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
        if not isinstance(data["scales"], list) or not all(finite_number(s) for s in data["scales"]):
            raise SourceError(f"{ann}: key 'scales' must be a list of numbers, got {data['scales']!r}")
        declared = {round(float(s) * 1000) for s in data["scales"]}

    groups: dict[tuple[str, int, int], dict[float, ImageRef]] = defaultdict(dict)
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
        if not finite_number(entry["scale"]):
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
        m = CLASS_FOLDER.fullmatch(parts[-2])
        if not m:
            raise SourceError(f"{where}: class folder {parts[-2]!r} must start with the ImageNet class index")
        class_id = int(m.group(1))
        if class_id != entry["class"]:
            raise SourceError(f"{where}: class folder {parts[-2]!r} says class {class_id}, the entry says {entry['class']}")
        check_class(class_id, labels, where)
        check_shift(shift, where)
        if seed < 0:
            raise SourceError(f"{where}: seed must be >= 0, got {seed}")
        if declared is not None and round(scale * 1000) not in declared:
            raise SourceError(f"{where}: scale {scale} is not among the declared scales {data['scales']}")
        scale = round(scale * 1000) / 1000  # the resolution of the ids (plan.scale_tag)
        group = groups[(shift, class_id, seed)]
        if scale in group:
            raise SourceError(f"{where}: a second image for ({shift}, class {class_id}, seed {seed}, scale {scale})")
        ext = IMAGE_EXTENSIONS.get(os.path.splitext(rel)[1].lower(), "")
        group[scale] = ImageRef(full, fmt=ext)
        names.setdefault(class_id, (m.group(2) or "").strip() or labels.name(class_id))

    notes = []
    borrowed = share_scale0(groups)
    if borrowed:
        notes.append(f"{borrowed} trajectories use the scale-0 image of another shift of their (class, seed)")
    rows = group_rows(groups, names)
    check_files_exist(rows, ann)
    fmt = dominant_format(im.fmt for g in groups.values() for im in g.values())
    return Source("cns", root, rows, fmt, notes)
