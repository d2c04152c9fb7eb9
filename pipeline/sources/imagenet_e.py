"""Released ImageNet-E images as an ``evaluate`` source (kind ``imagenet_e``).

Layout read: one folder per edited set, each holding ImageNet class folders of images,
next to the unedited originals::

    ROOT/<set>/<class folder>/<image>      e.g. ROOT/bg-20/n01440764/ILSVRC2012_val_00000293.png
    ROOT/levels.json                       optional: {"<set>": {"attribute": ..., "level": ...}}

The public editing code (``alibaba/easyrobust``, ``benchmarks/imagenet-e``) does not fix
the names of the released set folders, so a set's (attribute, level) is read from its
name with the vocabulary of the paper's result table, case-insensitive and with ``_``,
``-`` or nothing as separators, and ``levels.json`` overrides or adds any name:

==============================================  ==============================================
set folder name                                 attribute, level (the ``object_edit`` scale)
==============================================  ==============================================
``ori``, ``original``, ``clean``                unedited (level 0 of every attribute)
``bg20``, ``bg+20``, ``background_20``          ``background_complexity``, lambda / 20
``bg-20``, ``bg_-20``                           ``background_simplicity``, -lambda / 20
``bg20-adv``, ``bg_20_adv``                     ``background_complexity_adv``, lambda / 20
``size0.05``, ``size_0.1``, ``rate-0.08``       ``size``, (0.15 - rate) / 0.1  (0.1 -> 0.5, 0.08 -> 0.7, 0.05 -> 1)
``full``, ``size_full``                         ``size_full``, 1
``rp``, ``random_position``, ``position``       ``random_position`` (no level)
``rd``, ``ro``, ``random_direction``, ``rotate``  ``random_direction`` (no level)
==============================================  ==============================================

Evaluation protocol (:data:`PROTOCOL`, ``docs/protocol.md``): easyrobust evaluates every
model with ``Resize(int(224 / 0.875))`` bicubic, ``CenterCrop(224)``, ImageNet mean/std,
top-1 over the 1000 classes; a 224 px classifier gets that transform, a model of another
input size (the world's 32 px digits) its own.

Levels are the ``object_edit`` family's default mapping (:func:`pipeline.families.object_edit.level_of`),
so a released set and a build with default options share their level axis.  The random
position and random direction sets have no physical level (each image got its own random
box position or angle): they are release-only shifts
(:data:`pipeline.families.object_edit.NO_LEVEL`) whose trajectory
is (original, released image) at scales 0 and 1, where 1 marks "the set", not a level; the
``attributes`` analysis reports them apart from the level curves.  A folder whose name is
not in this table needs an entry in ``levels.json`` (``"level": null`` for a set without a
level, whose attribute must then be named ``random_<something>``); otherwise the source is
refused, naming the folder.  Class
folders are WordNet ids (``n01440764``, ImageNet-1k order from timm's synset list), a
leading class index (``022_bald eagle``) or a class name.  The images of one source
image carry the same file stem in every set; the stem's index within its class (over
all sets, sorted) is the seed, so (attribute, class, seed) is a trajectory whose level
0 is the original.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections import defaultdict
from typing import Any

from pipeline.labels import LabelSpace
from pipeline.config.protocol import CNS_CLASSIFIER, Preprocess
from pipeline.sources.release_protocol import ANY_KIND, MODEL, ReleaseProtocol


def easyrobust_input(own: Preprocess | None) -> Preprocess | str:
    """easyrobust's evaluation transform (``Resize(256)`` bicubic, ``CenterCrop(224)``, ImageNet mean/std)
    for a 224 px model; a model of another input size, or one that cannot state its own, keeps its own."""
    return CNS_CLASSIFIER if own is not None and own.crop == CNS_CLASSIFIER.crop else MODEL


PROTOCOL = ReleaseProtocol(
    name="imagenet_e",
    original="alibaba/easyrobust benchmarks/benchmark.py",
    preprocess={ANY_KIND: easyrobust_input},
    accuracy="top-1 over the 1000 ImageNet classes",
    metric="top-1 accuracy per attribute and level, its drop against the originals; the random position / "
    "direction sets apart from the levels",
)

LEVELS_FILE = "levels.json"
ORIGINAL = ("ori", "original", "originals", "clean", "imagenet", "val")
_NUM = r"(\d+(?:\.\d+)?)"
_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(rf"(?:bg|background)(?:complexity)?(?:lambda)?{_NUM}adv"), "bg_adv"),
    (re.compile(rf"(?:bg|background)(?:complexity)?(?:lambda)?{_NUM}"), "bg"),
    (re.compile(rf"(?:size|rate|objectrate|pixelrate){_NUM}"), "size"),
    (re.compile(r"(?:size)?full"), "full"),
    (re.compile(r"(?:rp|randomposition|position|randompos)"), "random_position"),
    (re.compile(r"(?:rd|ro|randomdirection|randomrotation|rotate|rotation|direction)"), "random_direction"),
]

_WNID = re.compile(r"n\d{8}")  # matched whole (fullmatch)


def parse_set(name: str) -> tuple[str, float | None] | None:
    """(attribute, level) of a set folder name, ``("none", 0.0)`` for the originals, None if unknown.

    A set without a physical level (:data:`NO_LEVEL`) has level None.

    Separators (``_``, ``-``, spaces) are ignored, except that a ``-`` right before the
    number is a minus sign: ``bg-20`` and ``bg_-20`` are lambda = -20, ``bg_20`` is +20.
    """
    from pipeline.families.object_edit import ObjectEditOptions, level_of

    raw = name.lower().strip()
    key = re.sub(r"[\s_\-+]+", "", raw).replace("λ", "")
    if key in ORIGINAL:
        return ("none", 0.0)
    signed = re.search(r"[+-]?\d+(?:\.\d+)?", raw.replace("_", " "))
    opts = ObjectEditOptions()
    for pattern, kind in _RULES:
        if not pattern.fullmatch(key):
            continue
        value = float(signed.group(0)) if signed else 0.0
        if kind in ("bg", "bg_adv"):
            if value == 0:
                return ("none", 0.0)
            if kind == "bg_adv":
                return ("background_complexity_adv", abs(value) / opts.background.max_lambda)
            attribute = "background_complexity" if value > 0 else "background_simplicity"
            return (attribute, level_of(attribute, value, opts))
        if kind == "size":
            level = level_of("size", abs(value), opts)
            return ("size", level) if level > 0 else None
        if kind == "full":
            return ("size_full", 1.0)
        return (kind, None)
    return None


def _read_levels(fs: Any, root: str, where: str) -> dict[str, tuple[str, float | None]]:
    path = posixpath.join(root, LEVELS_FILE)
    if not fs.exists(path):
        return {}
    from pipeline.sources.common import SourceError

    try:
        data = json.loads(fs.cat_file(path).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise SourceError(f"{where}/{LEVELS_FILE}: not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise SourceError(f"{where}/{LEVELS_FILE}: must be an object {{set folder: {{attribute, level}}}}")
    out = {}
    for folder, entry in data.items():
        level = entry.get("level", False) if isinstance(entry, dict) else False
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("attribute"), str)
            or isinstance(level, bool)
            or not (level is None or isinstance(level, (int, float)))
        ):
            raise SourceError(
                f"{where}/{LEVELS_FILE}: entry {folder!r} must be {{\"attribute\": str, \"level\": number or null "
                f"(a set without a level)}}, got {entry!r}"
            )
        out[str(folder)] = (entry["attribute"], None if level is None else float(level))
    return out


def _class_of(folder: str, labels: LabelSpace) -> int | None:
    from pipeline.labels.imagenet import wnid_index
    from pipeline.sources.folders import folder_class

    if _WNID.fullmatch(folder):
        return wnid_index(folder)
    return folder_class(folder, labels)


def looks_like(fs: Any, root: str) -> bool:
    """True when ``root`` holds an originals set and at least one recognised edited set (or levels.json)."""
    if fs.exists(posixpath.join(root, LEVELS_FILE)):
        return True
    names = [posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False) if fs.isdir(p)]
    parsed = [parse_set(n) for n in names]
    return any(p == ("none", 0.0) for p in parsed) and any(p and p[0] != "none" for p in parsed)


def load_imagenet_e(location: str, labels: LabelSpace):
    """The released ImageNet-E layout (see the module docstring) as pointer rows."""
    from pipeline.config import SHIFT_NAME
    from pipeline.families.object_edit import NO_LEVEL, without_level
    from pipeline.io.files import as_location, filesystem
    from pipeline.sources.checks import check_class
    from pipeline.sources.common import IMAGE_EXTENSIONS, Source, SourceError
    from pipeline.sources.grouping import ImageRef, dominant_format, group_rows, share_scale0

    fs, root = filesystem(location)
    overrides = _read_levels(fs, root, location)
    sets = sorted(p for p in fs.ls(root, detail=False) if fs.isdir(p) and not posixpath.basename(p).startswith("."))
    found: dict[str, tuple[str, float]] = {}
    no_level: set[str] = set()
    unknown = []
    for path in sets:
        name = posixpath.basename(path.rstrip("/"))
        parsed = overrides.get(name) or parse_set(name)
        if parsed is None:
            unknown.append(name)
            continue
        attribute, level = parsed
        if attribute != "none" and not SHIFT_NAME.fullmatch(attribute):
            raise SourceError(f"{location}: set {name!r}: attribute {attribute!r} must match {SHIFT_NAME.pattern}")
        if level is None:  # a release-only set: scale 1 marks the set, not a level
            if not without_level(attribute):
                raise SourceError(
                    f"{location}: set {name!r}: a set without a level needs an attribute named random_<something> "
                    f"(as {', '.join(NO_LEVEL)}), got {attribute!r}"
                )
            no_level.add(attribute)
            level = 1.0
        if attribute != "none" and level <= 0:
            raise SourceError(f"{location}: set {name!r}: level must be > 0 (level 0 is the originals), got {level}")
        found[path] = (attribute, round(level, 3))
    if unknown:
        shown = ", ".join(repr(n) for n in unknown[:10])
        raise SourceError(
            f"{location}: cannot tell the attribute and level of set folder(s) {shown}; "
            f"name them as in docs/imagenet_e.md or add {LEVELS_FILE} {{\"<set>\": {{\"attribute\": ..., \"level\": ...}}}}"
        )
    originals = [p for p, (a, _) in found.items() if a == "none"]
    if not originals:
        raise SourceError(f"{location}: no set of unedited originals (a folder named 'ori' or 'original')")
    if len(originals) > 1:
        raise SourceError(f"{location}: several sets of originals: {[posixpath.basename(p) for p in originals]}")

    files: dict[str, list[tuple[int, str, str]]] = {}  # set path -> (class, stem, file)
    stems: dict[int, set[str]] = defaultdict(set)
    unresolved = set()
    for path in found:
        rows = []
        for cdir in sorted(p for p in fs.ls(path, detail=False) if fs.isdir(p)):
            cname = posixpath.basename(cdir.rstrip("/"))
            class_id = _class_of(cname, labels)
            if class_id is None:
                unresolved.add(cname)
                continue
            check_class(class_id, labels, f"{location}: class folder {cname!r}")
            for f in sorted(fs.ls(cdir, detail=False)):
                stem, ext = os.path.splitext(posixpath.basename(f))
                if ext.lower() in IMAGE_EXTENSIONS:
                    rows.append((class_id, stem, f))
                    stems[class_id].add(stem)
        files[path] = rows
    if unresolved:
        shown = ", ".join(repr(n) for n in sorted(unresolved)[:10])
        raise SourceError(f"{location}: class folder(s) {shown} are neither WordNet ids, 'NNN_name' nor class names")
    seed_of = {(c, s): i for c, ss in stems.items() for i, s in enumerate(sorted(ss))}

    groups: dict[tuple[str, int, int], dict[float, Any]] = defaultdict(dict)
    originals_by_unit: dict[tuple[int, int], Any] = {}
    formats = []
    for path, (attribute, level) in found.items():
        for class_id, stem, f in files[path]:
            fmt = IMAGE_EXTENSIONS[os.path.splitext(f)[1].lower()]
            image = ImageRef(as_location(fs, f, location), fmt=fmt)
            formats.append(fmt)
            seed = seed_of[(class_id, stem)]
            if attribute == "none":
                originals_by_unit[(class_id, seed)] = image
                continue
            group = groups[(attribute, class_id, seed)]
            if level in group:
                raise SourceError(f"{location}: two images of {stem!r} at {attribute} level {level} (class {class_id})")
            group[level] = image
    # The original of each source image is level 0 of every attribute trajectory.
    for (attribute, class_id, seed), group in groups.items():
        if (class_id, seed) in originals_by_unit:
            group[0.0] = originals_by_unit[(class_id, seed)]
    share_scale0(groups)
    lonely = sum(1 for g in groups.values() if 0.0 not in g)
    def shown(attribute: str, level: float) -> str:
        return f"{attribute} (no level)" if attribute in no_level else f"{attribute}@{level:g}"

    notes = [f"sets: {', '.join(f'{posixpath.basename(p)}={shown(a, lv)}' for p, (a, lv) in sorted(found.items()))}"]
    if lonely:
        notes.append(f"{lonely} edited image(s) have no original in the originals set (no level 0)")
    names = {c: labels.name(c) for c in stems}
    rows = group_rows(dict(groups), names)
    return Source("imagenet_e", location, rows, dominant_format(formats), notes, analyses=["attributes"])
