"""The ImageNet-C release layout as an evaluate source: corruptions as shifts, severities as scales.

Layout (as released, e.g. ``imagenet-c/``)::

    <corruption>/<severity 1..5>/<wnid>/<image>.JPEG
    clean/<wnid>/<image>.JPEG        optional: the uncorrupted images (scale 0)

``<corruption>`` is one of the 19 corruption names of :mod:`pipeline.families.corruption.params`,
the WordNet id maps to the ImageNet class index (:func:`pipeline.labels.imagenet.wnid_index`).
The same validation image appears under every corruption and severity with the same
file name, so a trajectory is (corruption, class, image): its seed is the index of the
file name among the sorted names of that class, its scales the severities present.

ImageNet-C ships no clean images.  With a ``clean/`` folder beside the corruptions, its
image of the same name is every trajectory's scale 0 and the report has accuracy drops,
failure points and relative mCE; without it the trajectories start at severity 1 and the
report has the corruption errors and mCE (``corruption_error``), which need no clean
images.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from collections import defaultdict

from pipeline.labels import LabelSpace
from pipeline.sources.release_protocol import ANY_KIND, MODEL, TORCHVISION_EVAL, ReleaseProtocol

CLEAN = "clean"

# hendrycks/robustness ImageNet-C/test.py: clean images Resize(256) / CenterCrop(224), the
# corrupted ones (stored at 224 px by make_imagenet_c.py) CenterCrop(224) only, ImageNet
# mean/std.  The original evaluates torchvision ImageNet CNNs only; other kinds (CLIP,
# TorchScript) keep their own transform.
_TEST_PY = dataclasses.replace(TORCHVISION_EVAL, shifted_crop_only=True)
PROTOCOL = ReleaseProtocol(
    name="imagenet_c",
    original="hendrycks/robustness ImageNet-C/test.py",
    preprocess={"timm": _TEST_PY, "torch_hub": _TEST_PY, ANY_KIND: MODEL},
    accuracy="top-1 over the 1000 ImageNet classes (the WordNet id folder)",
    metric="CE per corruption: errors summed over severities 1-5 over AlexNet's; mCE and relative mCE: "
    "means over the 15 benchmark corruptions (a partial grid gets no AlexNet-normalised mCE)",
)


def _corruptions() -> tuple[str, ...]:
    from pipeline.families.corruption.params import ALL

    return ALL


def looks_like(fs, root: str) -> bool:
    """True when ``root`` has a corruption-named folder holding severity folders 1..5."""
    names = set(_corruptions())
    for p in fs.ls(root, detail=False):
        name = posixpath.basename(p.rstrip("/"))
        if name in names and fs.isdir(p):
            subs = {posixpath.basename(q.rstrip("/")) for q in fs.ls(p, detail=False) if fs.isdir(q)}
            if subs and subs <= {"1", "2", "3", "4", "5"}:
                return True
    return False


def load_imagenet_c(location: str, labels: LabelSpace):
    """Index an ImageNet-C layout into pointer rows (see the module docstring)."""
    from pipeline.io.files import as_location, filesystem
    from pipeline.labels.imagenet import wnid_index
    from pipeline.sources.common import IMAGE_EXTENSIONS, Source, SourceError
    from pipeline.sources.grouping import ImageRef, dominant_format, group_rows

    if len(labels) != 1000:
        raise SourceError(
            f"{location}: an ImageNet-C layout is labelled with ImageNet WordNet ids, but the config's label "
            f"space {labels.key!r} has {len(labels)} classes; use benchmark.labels: imagenet"
        )
    fs, root = filesystem(location)
    known = set(_corruptions())
    files: dict[tuple[str, float, int], dict[str, str]] = defaultdict(dict)  # (shift, scale, class) -> stem -> path
    notes, formats, unknown_wnids, other = [], [], set(), []

    def scan_class_folders(folder: str, shift: str, scale: float) -> None:
        for wdir in sorted(fs.ls(folder, detail=False)):
            if not fs.isdir(wdir):
                continue
            wnid = posixpath.basename(wdir.rstrip("/"))
            class_id = wnid_index(wnid)
            if class_id is None:
                unknown_wnids.add(wnid)
                continue
            for f in sorted(fs.ls(wdir, detail=False)):
                stem, ext = os.path.splitext(posixpath.basename(f))
                if ext.lower() in IMAGE_EXTENSIONS:
                    files[(shift, scale, class_id)][stem] = as_location(fs, f, location)
                    formats.append(IMAGE_EXTENSIONS[ext.lower()])

    for top in sorted(fs.ls(root, detail=False)):
        name = posixpath.basename(top.rstrip("/"))
        if not fs.isdir(top) or name.startswith("."):
            continue
        if name == CLEAN:
            scan_class_folders(top, CLEAN, 0.0)
            continue
        if name not in known:
            other.append(name)
            continue
        for sdir in sorted(fs.ls(top, detail=False)):
            sev = posixpath.basename(sdir.rstrip("/"))
            if not fs.isdir(sdir):
                continue
            if sev not in {"1", "2", "3", "4", "5"}:
                raise SourceError(f"{location}/{name}/{sev}: severity folders must be named 1..5")
            scan_class_folders(sdir, name, float(sev))
    if unknown_wnids:
        shown = ", ".join(sorted(unknown_wnids)[:5])
        raise SourceError(f"{location}: {len(unknown_wnids)} class folder(s) are not ImageNet-1k WordNet ids (e.g. {shown})")
    if other:
        notes.append(f"folders ignored (not a corruption name): {', '.join(other)}")
    # Seeds: index of the file name among all names of its class.
    stems: dict[int, set[str]] = defaultdict(set)
    for (shift, _, class_id), by_stem in files.items():
        stems[class_id] |= set(by_stem)
    seed_of = {c: {s: i for i, s in enumerate(sorted(v))} for c, v in stems.items()}
    clean = {(c, stem): p for (shift, _, c), by in files.items() if shift == CLEAN for stem, p in by.items()}
    groups: dict[tuple[str, int, int], dict[float, ImageRef]] = defaultdict(dict)
    for (shift, scale, class_id), by_stem in files.items():
        if shift == CLEAN:
            continue
        for stem, path in by_stem.items():
            seed = seed_of[class_id][stem]
            groups[(shift, class_id, seed)][scale] = ImageRef(path)
            if (class_id, stem) in clean:
                groups[(shift, class_id, seed)][0.0] = ImageRef(clean[(class_id, stem)])
    if not clean:
        notes.append(
            "no clean/ folder: trajectories start at severity 1 (corruption errors and mCE only; "
            "put the clean images at clean/<wnid>/ for accuracy drops and relative mCE)"
        )
    names = {c: labels.name(c) for c in {k[1] for k in groups}}
    src = Source("imagenet_c", location, group_rows(groups, names), dominant_format(formats), notes)
    src.analyses = ["corruption_error"]
    return src
