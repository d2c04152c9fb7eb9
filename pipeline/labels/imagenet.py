"""ImageNet-1k class names (the CLIP-style common names that open_clip ships).

The list is read from ``open_clip/zero_shot_metadata.py`` by parsing, not importing, so
config validation never pays for importing torch.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path


@functools.lru_cache(maxsize=1)
def class_names() -> tuple[str, ...]:
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("open_clip_torch is not installed; it provides the ImageNet class names")
    source = Path(next(iter(spec.submodule_search_locations))) / "zero_shot_metadata.py"
    tree = ast.parse(source.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "IMAGENET_CLASSNAMES" for t in node.targets
        ):
            names = tuple(ast.literal_eval(node.value))
            if len(names) != 1000:
                raise RuntimeError(f"{source}: expected 1000 ImageNet class names, found {len(names)}")
            return names
    raise RuntimeError(f"{source}: IMAGENET_CLASSNAMES not found")


def class_name(class_id: int) -> str:
    return class_names()[class_id]


@functools.lru_cache(maxsize=1)
def wnids() -> tuple[str, ...]:
    """The 1000 ImageNet-1k WordNet ids in class-index order (timm's ``imagenet_synsets.txt``, read as text).

    The index of a class is the position of its wnid in the sorted list, the order of the
    ILSVRC2012 release; this is checked.
    """
    spec = importlib.util.find_spec("timm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("timm is not installed; it provides the ImageNet WordNet ids")
    source = Path(next(iter(spec.submodule_search_locations))) / "data" / "_info" / "imagenet_synsets.txt"
    ids = tuple(source.read_text().split())
    if len(ids) != 1000 or list(ids) != sorted(ids):
        raise RuntimeError(f"{source}: expected the 1000 sorted ImageNet-1k WordNet ids")
    return ids


def wnid_index(wnid: str) -> int | None:
    """ImageNet class index of a WordNet id (``n01443537`` -> 1), None when it is not one of the 1000."""
    table = {w: i for i, w in enumerate(wnids())}
    return table.get(wnid)
