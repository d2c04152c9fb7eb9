"""A directory of WebDataset tars (e.g. a build output's ``images/*.tar``), read by byte range."""

from __future__ import annotations

import json
import posixpath
import tarfile
from collections import defaultdict
from typing import Any

from pipeline.io.files import as_location, filesystem, is_local
from pipeline.io.fs import PathEscape, safe_relpath
from pipeline.io.image_refs import IMAGES_FILE
from pipeline.io.safejson import loads as safe_loads
from pipeline.io.webdataset import tar_members
from pipeline.labels import LabelSpace
from pipeline.sources.checks import check_class, check_shift, finite_number, inside_source
from pipeline.sources.common import IMAGE_EXTENSIONS, NO_SHIFT, Source, SourceError
from pipeline.sources.grouping import ImageRef, dominant_format, group_rows, share_scale0


def _scan_tar(fs: Any, path: str, source: str, read_json: bool) -> dict[str, dict[str, Any]]:
    """key -> {ext: (offset, size)} plus the parsed ``json`` member when ``read_json``.

    Only headers are read (tarfile seeks over the data of a seekable file); JSON members
    are small and read when asked for.
    """
    out: dict[str, dict[str, Any]] = {}
    try:
        with fs.open(path, "rb") as fh, tarfile.open(fileobj=fh, mode="r:") as tar:
            for key, ext, info in tar_members(tar):
                found = out.setdefault(key, {})
                if ext == "json" and read_json:
                    raw = tar.extractfile(info).read()
                    try:
                        found["json"] = safe_loads(raw, f"{source}: member {info.name!r}")
                    except ValueError as err:
                        raise SourceError(str(err)) from None
                else:
                    found[ext.lower()] = (info.offset_data, info.size)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise SourceError(f"malformed WebDataset shard {source}: {err}") from None
    return out


def _image_member(members: dict[str, Any]) -> tuple[str, tuple[int, int]] | None:
    for ext in ("png", "jpg", "jpeg", "webp", "bmp"):
        if ext in members:
            return ext, members[ext]
    return None


def load_webdataset(location: str, labels: LabelSpace, follow_symlinks: bool = False) -> Source:
    """WebDataset tars, with coordinates from committed ``samples`` Parquet or member JSON; an
    evaluation output that refers to a benchmark's images (:mod:`pipeline.io.image_refs`) is
    the images its sample rows name, with its own keep decisions."""
    fs, root = filesystem(location)
    if fs.exists(posixpath.join(root, IMAGES_FILE)):
        return _referred(location, labels, follow_symlinks)
    tars = tar_paths(fs, root)
    for tar in tars:
        inside_source(tar, root, location, f"{location}: shard", follow_symlinks)
    if not tars:
        raise SourceError(f"{location}: no WebDataset shards (*.tar) in {location} or its images/ folder")
    samples = None
    if fs.isdir(posixpath.join(root, "samples")):
        from pipeline.io.tables import load_samples
        from pipeline.io.store import OutputStore

        samples = load_samples(OutputStore(location))
        if samples.empty:
            samples = None  # a build output without committed shards: fall back to member JSON
    if samples is not None:
        return _webdataset_from_samples(fs, location, root, samples, labels, follow_symlinks)
    return _webdataset_from_json(fs, location, tars, labels)


def _referred(location: str, labels: LabelSpace, follow_symlinks: bool) -> Source:
    """The images an evaluation output's sample rows name, in the benchmark it refers to."""
    from dataclasses import replace

    from pipeline.io.image_refs import referenced, own_files
    from pipeline.io.store import OutputStore
    from pipeline.io.tables import load_samples

    store = OutputStore(location)
    bench = referenced(store)
    samples = load_samples(store)
    if samples.empty:
        raise SourceError(f"{location}: an evaluation output without committed shards holds no images to read")
    if own_files(store) & set(samples["shard"].astype(str)):
        raise SourceError(f"{location}: holds image shards of its own beside those of {bench.uri}; read one of them")
    bfs, broot = filesystem(bench.uri)
    found = _webdataset_from_samples(bfs, bench.uri, broot, samples, labels, follow_symlinks)
    return replace(found, location=location)


def _webdataset_from_samples(
    fs: Any, location: str, root: str, samples: Any, labels: LabelSpace, follow_symlinks: bool = False
) -> Source:
    groups: dict[tuple[str, int, int], dict[float, ImageRef]] = defaultdict(dict)
    names: dict[int, str] = {}
    formats = []
    for shard_rel, part in samples.groupby("shard", sort=True):
        try:  # the samples table names its shard; it must be a file of this source
            safe_relpath(root if is_local(location) else location, shard_rel, f"{location}: samples 'shard'", follow_symlinks)
        except PathEscape as err:
            raise SourceError(str(err)) from None
        tar_path = posixpath.join(root, posixpath.normpath(str(shard_rel)))
        tar_url = as_location(fs, tar_path, location)
        index = _scan_tar(fs, tar_path, tar_url, read_json=False)
        for row in part.itertuples(index=False):
            where = f"{tar_url}: sample {row.sample_id}"
            found = _image_member(index.get(str(row.key), {}))
            if found is None:
                raise SourceError(f"{where}: no image member {row.key!r}.png/.jpg in the shard")
            ext, (offset, size) = found
            class_id, seed, shift = int(row.class_id), int(row.seed), str(row.shift)
            check_class(class_id, labels, where)
            check_shift(shift, where)
            scale = round(float(row.scale) * 1000) / 1000
            group = groups[(shift, class_id, seed)]
            if scale in group:
                raise SourceError(f"{where}: a second image for ({shift}, class {class_id}, seed {seed}, scale {scale})")
            group[scale] = ImageRef(tar_url, offset, size, IMAGE_EXTENSIONS.get("." + ext, ext))
            name = row.class_name
            names.setdefault(class_id, name if isinstance(name, str) and name else labels.name(class_id))
            formats.append(IMAGE_EXTENSIONS.get("." + ext, ext))
    rows = group_rows(groups, names)
    if "kept" in samples.columns:  # a build output: its own filter's decisions travel with its images
        decided = _filter_decisions(samples)
        for row in rows:
            row["source_filter"] = json.dumps([decided.get(sid) for sid in row["sample_ids"]])
    return Source("webdataset", location, rows, dominant_format(formats))


def _filter_decisions(samples: Any) -> dict[str, dict[str, Any]]:
    """Per sample id, what the build's filter decided (``kept``, ``n_pass``, its scores and
    realisation measures): ``cnsbench evaluate`` of a build without ``--filter`` keeps the
    images the build kept, so its numbers are the build report's."""
    from pipeline.plan.schema import REALISATION_COLUMNS, SCORE_COLUMNS

    columns = [c for c in (*SCORE_COLUMNS, *REALISATION_COLUMNS) if c in samples.columns]
    out = {}
    for rec in samples[["sample_id", "kept", *(["n_pass"] if "n_pass" in samples.columns else []), *columns]].to_dict("records"):
        out[str(rec["sample_id"])] = {
            "kept": bool(rec["kept"]),
            "n_pass": int(rec.get("n_pass", 0) or 0),
            **{c: (None if rec[c] is None or rec[c] != rec[c] else float(rec[c])) for c in columns},
        }
    return out


def _json_label(meta: dict[str, Any]) -> Any:
    for key in ("class_id", "label", "cls", "class"):
        if key in meta:
            return meta[key]
    return None


def _webdataset_from_json(fs: Any, location: str, tars: list[str], labels: LabelSpace) -> Source:
    groups: dict[tuple[str, int, int], dict[float, ImageRef]] = defaultdict(dict)
    names: dict[int, str] = {}
    formats = []
    next_seed: dict[int, int] = defaultdict(int)  # per-class running index for members without a seed
    for tar_path in tars:
        tar_url = as_location(fs, tar_path, location)
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
            if not finite_number(scale):
                raise SourceError(f"{where}.json: 'scale' must be a finite number, got {scale!r}")
            seed = meta.get("seed")
            if seed is None:
                seed = next_seed[label]
                next_seed[label] += 1
            if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
                raise SourceError(f"{where}.json: 'seed' must be an integer >= 0, got {seed!r}")
            check_class(label, labels, where)
            check_shift(shift, where)
            scale = round(float(scale) * 1000) / 1000
            group = groups[(shift, label, seed)]
            if scale in group:
                raise SourceError(f"{where}: a second image for ({shift}, class {label}, seed {seed}, scale {scale})")
            ext, (offset, size) = found
            fmt = IMAGE_EXTENSIONS.get("." + ext, ext)
            group[scale] = ImageRef(tar_url, offset, size, fmt)
            formats.append(fmt)
            name = meta.get("class_name")
            names.setdefault(label, name if isinstance(name, str) and name else labels.name(label))
    notes = []
    borrowed = share_scale0(groups)
    if borrowed:
        notes.append(f"{borrowed} trajectories use the scale-0 image of another shift of their (class, seed)")
    return Source("webdataset", location, group_rows(groups, names), dominant_format(formats), notes)


def tar_paths(fs: Any, root: str) -> list[str]:
    """The WebDataset shards (``*.tar``) in ``root``/images or ``root``, sorted; temporary files left out."""
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
