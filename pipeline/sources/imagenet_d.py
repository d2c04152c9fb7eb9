"""The released ImageNet-D layout as an evaluate source.

``root/{background,texture,material}/<class folder>/<image>`` (an older revision of the
release: ``root/data/{background,...}``), with an optional ``questions/``
folder of the VQA evaluation (:mod:`pipeline.sources.imagenet_d_questions`).  Class folders are named as in the release
(``banana``, ``binder_closed``, ``t_shirt``) and map to the 113-class label space
``imagenet_d`` (:mod:`pipeline.labels.imagenet_d`), whose classes each stand for a set of
ImageNet ids; an ImageNet classifier is then correct when its top-1 id is any of them
(:meth:`pipeline.labels.LabelSpace.outputs_from_imagenet`), and a CLIP zero-shot
classifier is built over the 113 class names.  The nuisance kind is the shift, each
image a single-image trajectory at scale 0 with seed = its index within (kind, class)
(files sorted by name), so ``report/accuracy.csv`` is the accuracy per nuisance kind.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

from pipeline.labels import imagenet_d
from pipeline.labels import label_space
from pipeline.models.vqa_protocols import DISTRACTOR_FILE, IMAGENET_D_PROMPT, TOP_K
from pipeline.sources.release_protocol import ANY_KIND, MODEL, ReleaseProtocol

LABELS = "imagenet_d"
IGNORED = {"questions"}  # the VQA questions (pipeline.sources.imagenet_d_questions), never indexed as images
DATA = "data"  # an older revision of the release: data/{background,texture,material}

# chenshuang-zhang/imagenet_d: evaluate_imagenet_models.py feeds each torchvision model its
# own weights.transforms() (utils/models.py); evaluate_vlm.py feeds CLIP clip.load's own
# preprocess and builds the zero-shot head from the single prompt "A photo of a {c}";
# LLaVA/llava/serve/eval_imagenet_d.py asks LLaVA-1.5 in its llava_v1 conversation, float16
# weights (load_pretrained_model's default) but the CLIP vision tower in float32 (the builder loads
# it apart and casts it only when device_map is not "auto"), images padded to a square in the
# image processor's mean colour (process_images, image_aspect_ratio "pad"), sampling at temperature 0.2 with transformers'
# default top-k 50, at most 512 new tokens, the distractor from questions/*.csv.
PROTOCOL = ReleaseProtocol(
    name="imagenet_d",
    original="chenshuang-zhang/imagenet_d evaluate_imagenet_models.py, evaluate_vlm.py",
    preprocess={ANY_KIND: MODEL},
    templates=("A photo of a {c}",),
    accuracy="ImageNet models: top-1 over ImageNet-1k, correct when any of the class's ImageNet ids; "
    "zero-shot: top-1 over the 113 class names",
    metric="top-1 accuracy per nuisance kind (background, texture, material)",
    vlm={"prompt_template": "original", "dtype": "float16", "vision_dtype": "float32", "image_aspect_ratio": "pad"},
    vlm_protocol={
        "kind": "two_choice", "distractors": DISTRACTOR_FILE, "prompt": IMAGENET_D_PROMPT, "order": "original",
        "temperature": 0.2, "top_k": TOP_K, "max_new_tokens": 512, "synonyms": "imagenet_d",
    },
)


def _holds_kinds(fs: Any, folder: str) -> bool:
    """True when ``folder`` holds nuisance-kind folders (and no other folder but ``questions``)."""
    dirs = {posixpath.basename(p.rstrip("/")) for p in fs.ls(folder, detail=False) if fs.isdir(p)}
    dirs = {d for d in dirs if not d.startswith(".")}
    return bool(dirs & set(imagenet_d.NUISANCE_KINDS)) and dirs <= set(imagenet_d.NUISANCE_KINDS) | IGNORED


def image_root(fs: Any, root: str) -> str | None:
    """The folder holding the nuisance kinds: ``root``, or ``root/data`` (an older revision of
    the release nests them there, beside nothing else but ``questions``); None if neither."""
    if _holds_kinds(fs, root):
        return root
    nested = posixpath.join(root, DATA)
    dirs = {posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False) if fs.isdir(p)}
    if fs.isdir(nested) and {d for d in dirs if not d.startswith(".")} <= {DATA} | IGNORED and _holds_kinds(fs, nested):
        return nested
    return None


def looks_like(fs: Any, root: str) -> bool:
    """True when ``root`` (or its ``data/``) holds nuisance-kind folders and nothing else but ``questions``."""
    return image_root(fs, root) is not None


def load_imagenet_d(location: str):
    """Index the released layout at ``location`` into a :class:`pipeline.sources.Source`."""
    from pipeline.io.files import as_location, filesystem
    from pipeline.sources.common import IMAGE_EXTENSIONS, Source, SourceError
    from pipeline.sources.grouping import ImageRef, dominant_format, group_rows

    fs, top = filesystem(location)
    if not fs.isdir(top):
        raise SourceError(f"{location}: not a directory")
    root = image_root(fs, top) or top
    labels = label_space(LABELS)
    folders = imagenet_d.folder_ids()
    groups: dict[tuple[str, int, int], dict[float, Any]] = {}
    formats, unknown = [], []
    kinds = [k for k in imagenet_d.NUISANCE_KINDS if fs.isdir(posixpath.join(root, k))]
    if not kinds:
        raise SourceError(f"{location}: none of the ImageNet-D folders {', '.join(imagenet_d.NUISANCE_KINDS)}")
    for kind in kinds:
        kind_dir = posixpath.join(root, kind)
        for folder in sorted(p for p in fs.ls(kind_dir, detail=False) if fs.isdir(p)):
            name = posixpath.basename(folder.rstrip("/"))
            if name.startswith("."):
                continue
            if name not in folders:
                unknown.append(f"{kind}/{name}")
                continue
            class_id = folders[name]
            files = sorted(
                p for p in fs.ls(folder, detail=False) if os.path.splitext(p)[1].lower() in IMAGE_EXTENSIONS
            )
            for seed, path in enumerate(files):
                fmt = IMAGE_EXTENSIONS[os.path.splitext(path)[1].lower()]
                groups[(kind, class_id, seed)] = {0.0: ImageRef(as_location(fs, path, location), fmt=fmt)}
                formats.append(fmt)
    if unknown:
        shown = ", ".join(repr(n) for n in unknown[:10])
        raise SourceError(
            f"{location}: {len(unknown)} class folder(s) are not ImageNet-D classes ({shown}); "
            "the release's folder names are listed in pipeline/data/imagenet_d/classes.json"
        )
    names = {c: labels.name(c) for _, c, _ in groups}
    rows = group_rows(groups, names)
    from pipeline.sources.imagenet_d_questions import attach_questions

    note = attach_questions(fs, root if fs.isdir(posixpath.join(root, "questions")) else top, rows)
    return Source("imagenet_d", location, rows, dominant_format(formats), labels=LABELS, notes=[note] if note else [])
