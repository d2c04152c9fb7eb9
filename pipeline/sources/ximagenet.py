"""The released XIMAGENET-12 layout as an evaluate source (``cnsbench evaluate --source-kind ximagenet``).

Layout: ``root/<scenario folder>/<class folder>/<image>``.  The originals are the folder
``image`` (the scripts' ``image``; ``original`` is accepted too), every other folder is a
scenario: the scripts write ``blur_background``, ``blur_object``, ``image_r``, ``image_g``,
``image_b``, ``image_rainbow``, ``segmented_image``, ``transparent_img`` ...; folder names
are normalised (lower case, spaces and dashes to ``_``) and the aliases in
:data:`SCENARIO_ALIASES` map the paper's table names to one scenario name.  Class folders
are ImageNet WordNet ids (``n01689811``) or a leading ImageNet index (``044_alligator
lizard``).

A scenario image belongs to the original with the same image id (``n01689811_17`` in
``n01689811_17.JPEG``, ``n01689811_17_segmented.png``, ...).  Each (scenario, class,
original) is one trajectory of two scales: 0 = the original, 1 = the scenario image; the
seed is the original's index within its class (sorted names).  So the robustness score
(``C(i)`` at scale 1, ``mu`` at scale 0) and the scenario regression run on the release
unchanged.  Scenario images without an original are skipped (counted in the notes).

The release also holds folders that are not scenarios (:data:`MASK_FOLDERS`): the object
masks ``masks/`` and their 0/255 version ``standard_masks/`` (``MaskStandardization.py``),
and ``segmented_image_transparent/`` (``Segmentbackground.py``: the RGB image with the mask
as alpha).  They are never indexed as scenarios; the mask provider ``folder`` reads a build's masks
from them (:func:`mask_folders`: ``standard_masks``, then ``masks``) when
``source.masks.path`` is the release root, or is left out while ``source.path`` is the
release's originals folder; the notes count the originals that have a mask.  The segmented scenario is stored nested,
``segmented_image/segmented_image/<wnid>`` (``segementwithRGB.py``); a scenario folder
whose only sub-folder carries its own name is read one level down.

Class folders renamed ``0`` .. ``11``, as the original training script (``train.py``)
tells its users, say nothing about which class is which: they are refused (SourceError,
exit 2) with the WordNet ids to rename them to.

Evaluation protocol (:data:`PROTOCOL`, ``docs/protocol.md``): the paper's classifiers are
12-way models trained on the originals, fed by Keras ``load_img(fn, target_size=(224,
224))`` (both sides resized, nearest neighbour, no crop) and ``/ 255``.  Here the accuracy
is 12-way by default -- the source's label space ``ximagenet12``: an ImageNet-1k model's
top-1 over the 12 classes' outputs -- and 1000-way when the config sets
``benchmark.labels: imagenet`` itself; every classifier that can state its own transform
gets ``train.py``'s geometry (squashed to its input size, 224 for ImageNet models, nearest,
no crop) with its own normalisation (the ImageNet models carry theirs outside the network,
the paper's Keras models inside); kinds that cannot state theirs keep their own.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections import defaultdict
from typing import Any

from pipeline.labels import XIMAGENET_CLASSES, LabelSpace
from pipeline.config.protocol import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from pipeline.sources.release_protocol import ANY_KIND, MODEL, ReleaseProtocol

ORIGINAL_FOLDERS = ("image", "images", "original", "original_image", "original_images")
SCENARIO_ALIASES = {
    "blur_bg": "blur_background",
    "blurred_background": "blur_background",
    "blur_obj": "blur_object",
    "blur_foreground": "blur_object",
    "blurred_foreground": "blur_object",
    "color_r": "image_r",
    "color_g": "image_g",
    "color_b": "image_b",
    "color_grey": "image_grey",
    "color_gray": "image_grey",
    "image_gray": "image_grey",
    "grey": "image_grey",
    "rainbow": "image_rainbow",
    "color_rainbow": "image_rainbow",
    "seg_img": "segmented_image",
    "segmented": "segmented_image",
    "transparent_img": "transparent_image",
    "transparent": "transparent_image",
    "rand_bg": "random_background",
    "random_background_with_real_environment": "random_background",
    "combine": "random_background",
    "ai_generated_background": "generated_background",
    "ai_generated": "generated_background",
    "bright_changing_bg": "bright_background",
    "bright_changing_fg": "bright_object",
}
# Folders of the release that hold masks, not scenarios (matched after :func:`normalise`).
MASK_FOLDERS = ("masks", "standard_masks", "segmented_image_transparent")
BARE_NUMBER = re.compile(r"\d+")  # matched whole (fullmatch)
IMAGE_ID = re.compile(r"(n\d{8}_\d+)")
_SUFFIXES = ("_segmented", "_transparent", "_blur", "_bright")


KERAS_SIZE = 224  # train.py: target_size = (224, 224, 3)


def keras_input(own: Preprocess | None) -> Preprocess | str:
    """``train.py``'s input -- ``load_img(target_size)``: both sides resized, nearest, no crop, in [0, 1] --
    at the model's input size with the model's normalisation; ``"model"`` where the kind cannot state its own."""
    if own is None:
        return MODEL
    size = own.crop or KERAS_SIZE
    return Preprocess(size, size, "nearest", tuple(own.mean or IMAGENET_MEAN), tuple(own.std or IMAGENET_STD), squash=True)


PROTOCOL = ReleaseProtocol(
    name="ximagenet",
    original="XImageNet-12/XIMAGENET-12 explainable-ai-imagenet-12/train.py",
    preprocess={ANY_KIND: keras_input},
    accuracy="12-way: top-1 over the 12 classes' ImageNet outputs (the paper's 12-class models); "
    "1000-way when the config sets benchmark.labels: imagenet",
    metric="accuracy per scenario; the robustness score over Table 2's eight scenarios",
    notes=("XIMAGENET-12 originals are ImageNet training images: mu of an ImageNet classifier is a training-set accuracy",),
)


def normalise(name: str) -> str:
    return re.sub(r"[\s\-]+", "_", name.strip().lower())


def scenario_name(folder: str) -> str:
    n = normalise(folder)
    return SCENARIO_ALIASES.get(n, n)


def image_key(filename: str) -> str:
    stem = os.path.splitext(os.path.basename(filename))[0]
    m = IMAGE_ID.search(stem)
    if m:
        return m.group(1)
    for suffix in _SUFFIXES:
        if stem.endswith(suffix):
            return stem[: -len(suffix)]
    return stem


def class_of_folder(folder: str, labels: LabelSpace) -> int | None:
    """ImageNet index of a class folder: one of the 12 wnids or ``NNN_name`` (a bare number is no class)."""
    if folder in XIMAGENET_CLASSES:
        return XIMAGENET_CLASSES[folder][0]
    m = re.fullmatch(r"(\d+)[_\- ].*", folder)
    if m and 0 <= int(m.group(1)) < len(labels):
        return int(m.group(1))
    return None


def bare_number_message(location: str, scenario: str, folder: str) -> str:
    wnids = ", ".join(f"{w} ({name})" for w, (_, name) in sorted(XIMAGENET_CLASSES.items()))
    return (
        f"{location}: class folder {folder!r} in {scenario!r} is a bare number: the original training script "
        "renames the 12 class folders 0..11, which does not say which class is which (read as ImageNet indices "
        f"they would be ImageNet classes 0..11). Rename each class folder to its WordNet id: {wnids}"
    )


def is_mask_folder(name: str) -> bool:
    return normalise(name) in MASK_FOLDERS


def mask_folders(fs: Any, root: str) -> list[str]:
    """The release's mask folders, in the order masks are looked up: ``standard_masks`` (0/255), then ``masks``."""
    by_name = {normalise(posixpath.basename(p.rstrip("/"))): p for p in fs.ls(root, detail=False) if fs.isdir(p)}
    return [by_name[n] for n in ("standard_masks", "masks") if n in by_name]



def class_dirs(fs: Any, folder: str) -> list[str]:
    """The class folders of a scenario folder, one level down when it nests a folder of its own name."""
    subs = sorted(p for p in fs.ls(folder, detail=False) if fs.isdir(p))
    own = normalise(posixpath.basename(folder.rstrip("/")))
    if len(subs) == 1 and normalise(posixpath.basename(subs[0].rstrip("/"))) == own:
        return sorted(p for p in fs.ls(subs[0], detail=False) if fs.isdir(p))
    return subs


def is_ximagenet(fs: Any, root: str) -> bool:
    """A root with an originals folder of class folders (wnids or ``NNN_name``) and at least one other folder."""
    try:
        subs = [p for p in fs.ls(root, detail=False) if fs.isdir(p)]
    except FileNotFoundError:
        return False
    names = {normalise(posixpath.basename(p.rstrip("/"))): p for p in subs}
    originals = [names[n] for n in ORIGINAL_FOLDERS if n in names]
    if not originals or len(names) < 2:
        return False
    inner = [posixpath.basename(p.rstrip("/")) for p in fs.ls(originals[0], detail=False) if fs.isdir(p)]
    # Bare numbers count too, so that a tree renamed for train.py is refused by the loader, not read as classes.
    return any(n in XIMAGENET_CLASSES or re.match(r"\d+(?:[_\- ]|\Z)", n) for n in inner)


def load_ximagenet(location: str, labels: LabelSpace):
    """Index a released XIMAGENET-12 tree into pointer rows (see the module docstring)."""
    from pipeline.io.files import as_location, filesystem
    from pipeline.sources.checks import check_class, check_shift
    from pipeline.sources.common import IMAGE_EXTENSIONS, Source, SourceError
    from pipeline.sources.grouping import ImageRef, dominant_format, group_rows

    fs, root = filesystem(location)
    subs = sorted(p for p in fs.ls(root, detail=False) if fs.isdir(p) and not posixpath.basename(p).startswith("."))
    by_name = {normalise(posixpath.basename(p.rstrip("/"))): p for p in subs}
    orig_name = next((n for n in ORIGINAL_FOLDERS if n in by_name), None)
    if orig_name is None:
        raise SourceError(f"{location}: no originals folder (one of {', '.join(ORIGINAL_FOLDERS)})")

    def images_of(folder: str) -> dict[int, dict[str, str]]:
        out: dict[int, dict[str, str]] = defaultdict(dict)
        for cdir in class_dirs(fs, folder):
            cname = posixpath.basename(cdir.rstrip("/"))
            if BARE_NUMBER.fullmatch(cname):
                raise SourceError(bare_number_message(location, posixpath.basename(folder.rstrip("/")), cname))
            cid = class_of_folder(cname, labels)
            if cid is None:
                raise SourceError(
                    f"{location}: class folder {cname!r} in {posixpath.basename(folder)!r} is neither one of the 12 "
                    f"XIMAGENET-12 WordNet ids ({', '.join(sorted(XIMAGENET_CLASSES))}) nor an ImageNet index"
                )
            check_class(cid, labels, f"{location}: folder {cname!r}")
            for p in sorted(fs.ls(cdir, detail=False)):
                if os.path.splitext(p)[1].lower() in IMAGE_EXTENSIONS:
                    out[cid].setdefault(image_key(p), p)
        return out

    originals = images_of(by_name[orig_name])
    seeds = {cid: {key: i for i, key in enumerate(sorted(files))} for cid, files in originals.items()}
    groups: dict[tuple[str, int, int], dict[float, Any]] = {}
    formats, unmatched, scenarios = [], 0, []
    for name, folder in sorted(by_name.items()):
        if name == orig_name or is_mask_folder(name):
            continue
        scenario = scenario_name(name)
        check_shift(scenario, f"{location}: scenario folder {posixpath.basename(folder)!r}")
        scenarios.append(scenario)
        for cid, files in images_of(folder).items():
            for key, path in files.items():
                if key not in seeds.get(cid, {}):
                    unmatched += 1
                    continue
                opath = originals[cid][key]
                fmt = IMAGE_EXTENSIONS[os.path.splitext(path)[1].lower()]
                ofmt = IMAGE_EXTENSIONS[os.path.splitext(opath)[1].lower()]
                groups[(scenario, cid, seeds[cid][key])] = {
                    0.0: ImageRef(as_location(fs, opath, location), fmt=ofmt),
                    1.0: ImageRef(as_location(fs, path, location), fmt=fmt),
                }
                formats += [fmt, ofmt]
    if len(set(scenarios)) != len(scenarios):
        raise SourceError(f"{location}: two scenario folders map to the same scenario name: {sorted(scenarios)}")
    names = {cid: labels.name(cid) for (_, cid, _) in groups}
    notes = [f"{unmatched} scenario image(s) without an original of the same id were skipped"] if unmatched else []
    notes += _mask_notes(fs, root, originals)
    twelve = labels.key in ("imagenet", "ximagenet12")  # the 12-way accuracy needs ImageNet-1k ids
    return Source("ximagenet", location, group_rows(groups, names), dominant_format(formats), notes,
                  analyses=["robustness_score", "scenario_regression"],
                  labels="ximagenet12" if twelve else None, labels_unless_set=twelve)


def _mask_notes(fs: Any, root: str, originals: dict[int, dict[str, str]]) -> list[str]:
    """What the release's mask folders hold (never scenarios): how many originals have a mask."""
    skipped = sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False)
                     if fs.isdir(p) and is_mask_folder(posixpath.basename(p.rstrip("/"))))
    folders = mask_folders(fs, root)
    if not folders:
        return []
    have = set()
    for folder in folders:
        for cdir in class_dirs(fs, folder):
            have |= {image_key(p) for p in fs.ls(cdir, detail=False) if p.lower().endswith(".png")}
    total = sum(len(files) for files in originals.values())
    with_mask = sum(1 for files in originals.values() for key in files if key in have)
    read = ", then ".join(f"{posixpath.basename(f.rstrip('/'))}/" for f in folders)
    note = (
        f"mask folders {', '.join(skipped)} are not scenarios; masks are read from {read} ({with_mask} of {total} "
        f"originals have one; any non-zero value is object): a build reads them with source.masks {{kind: folder, "
        f"path: {root}}}, or with no path when source.path is the originals folder"
    )
    return [note]
