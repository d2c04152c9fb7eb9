"""Label spaces: the class vocabulary a benchmark's class ids index into.

The default is ImageNet-1k (ids 0..999, CLIP-style common names).  A benchmark may name
its own vocabulary instead (an inline list or a JSON/text file of names, e.g. the demo
world's digits); ids are then positions in that list.
"""

from __future__ import annotations

import difflib
import functools
import json
from pathlib import Path

from pipeline import imagenet


class LabelSpace:
    def __init__(self, key: str, names: tuple[str, ...]) -> None:
        if not names:
            raise ValueError(f"label space {key!r} is empty")
        self.key = key
        self.names = names

    def __len__(self) -> int:
        return len(self.names)

    def name(self, class_id: int) -> str:
        return self.names[class_id]

    def resolve(self, value: int | str) -> int:
        """A class id (int or decimal string) or a class name -> the id, with a helpful error."""
        n = len(self.names)
        if isinstance(value, bool):
            raise ValueError(f"class must be an id or a name, got {value!r}")
        if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
            idx = int(value)
            if not 0 <= idx < n:
                raise ValueError(f"class id must be in 0..{n - 1} for label space {self.key!r}, got {idx}")
            return idx
        lowered = {name.lower(): i for i, name in enumerate(self.names)}
        key = str(value).strip().lower()
        if key in lowered:
            return lowered[key]
        close = difflib.get_close_matches(key, list(lowered), n=5, cutoff=0.6)
        hint = f"; close names: {', '.join(repr(c) for c in close)}" if close else ""
        raise ValueError(f"unknown class name {value!r} in label space {self.key!r}{hint}")


@functools.lru_cache(maxsize=16)
def _load(key: str | tuple[str, ...]) -> LabelSpace:
    if isinstance(key, tuple):
        return LabelSpace("custom", key)
    if key == "imagenet":
        return LabelSpace("imagenet", imagenet.class_names())
    path = Path(key)
    if not path.is_file():
        raise ValueError(f"labels must be 'imagenet', a list of names, or a JSON/text file of names; no file {key!r}")
    text = path.read_text()
    names = json.loads(text) if path.suffix == ".json" else [line.strip() for line in text.splitlines() if line.strip()]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{path}: expected a list of class names")
    return LabelSpace(str(path), tuple(names))


def label_space(spec: str | list[str] | tuple[str, ...] = "imagenet") -> LabelSpace:
    return _load(tuple(spec) if isinstance(spec, (list, tuple)) else spec)
