"""The ImageNet-D vocabularies as data: its 113 classes and the three nuisance lists.

Files (``pipeline/data/imagenet_d/``, copied from the public ImageNet-D repository):

* ``classes.json``: the 113 classes (ImageNet ∩ ObjectNet), each with its release folder
  name (``binder_closed``), its category (``binder_(closed)``, from
  ``preprocessing/imgnet_d_dir2imgnet_d_id.txt``) and its list of ImageNet-1k ids
  (``preprocessing/imgnet_d2imgnet_id.txt``; ``chair`` is 423, 559 and 765).  Class id =
  position in that file (the release's own ImageNet-D id).
* ``background.csv`` (468 scenes), ``texture.csv`` (47 DTD textures), ``material.csv``
  (32 OpenSurfaces materials): Broden's concept lists, ``code,name`` as in ``nuisances/*.csv``.

Names become words and shift names here, in one place: :func:`category_words` is the
original zero-shot evaluation's class text (``binder (closed)``, ``coffee or french
press``), :func:`nuisance_words` strips Broden's scene suffix ``-s`` and turns ``_``/``-``
into spaces, :func:`shift_name` makes a valid shift name (``plastic-opaque`` ->
``plastic_opaque``).
"""

from __future__ import annotations

import csv
import functools
import io
import json
import re
from importlib import resources

from pipeline.errors import CnsbenchError

NUISANCE_KINDS = ("background", "texture", "material")


def _data(name: str) -> str:
    return resources.files("pipeline.data").joinpath("imagenet_d", name).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def classes() -> tuple[dict, ...]:
    """The 113 classes: ``{"id", "folder", "category", "imagenet_ids"}`` in id order."""
    rows = json.loads(_data("classes.json"))["classes"]
    if [r["id"] for r in rows] != list(range(len(rows))):
        raise RuntimeError("pipeline/data/imagenet_d/classes.json: ids must be 0..N-1 in order")
    return tuple(rows)


def category_words(category: str) -> str:
    """``binder_(closed)`` -> ``binder (closed)``; ``coffee/french press`` -> ``coffee or french press``.

    The class text of the original CLIP evaluation (``evaluate_vlm.py``).
    """
    return category.replace("_", " ").replace("-", " ").replace("/", " or ").lower()


def class_names() -> tuple[str, ...]:
    return tuple(category_words(c["category"]) for c in classes())


def folder_ids() -> dict[str, int]:
    """Release class folder name (``banana``, ``t_shirt``) -> ImageNet-D class id."""
    return {c["folder"]: c["id"] for c in classes()}


def parse_nuisance_csv(text: str, where: str) -> list[str]:
    """A ``code,name`` CSV (the released format) or one name per line -> the names in order."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines and lines[0].replace(" ", "").lower() == "code,name":
        names = []
        for i, row in enumerate(csv.DictReader(io.StringIO("\n".join(lines))), start=2):
            name = (row.get("name") or "").strip()
            if not name:
                raise CnsbenchError(f"{where}: line {i} has no name")
            names.append(name)
        return names
    return [ln.strip() for ln in lines]


@functools.lru_cache(maxsize=None)
def nuisances(kind: str) -> tuple[str, ...]:
    """The released names of one nuisance kind (``background``, ``texture``, ``material``)."""
    if kind not in NUISANCE_KINDS:
        raise CnsbenchError(f"unknown ImageNet-D nuisance kind {kind!r}; kinds: {', '.join(NUISANCE_KINDS)}")
    return tuple(parse_nuisance_csv(_data(f"{kind}.csv"), f"pipeline/data/imagenet_d/{kind}.csv"))


def nuisance_words(name: str) -> str:
    """``forest-broadleaf-s`` -> ``forest broadleaf``; ``plastic-opaque`` -> ``plastic opaque``."""
    return re.sub(r"-s$", "", name.strip()).replace("_", " ").replace("-", " ").strip()


def shift_name(name: str) -> str:
    """A nuisance name as a shift name (``^[a-z0-9][a-z0-9_]*$``): ``poolroom-home-s`` -> ``poolroom_home``."""
    return re.sub(r"[^a-z0-9]+", "_", nuisance_words(name).lower()).strip("_")
