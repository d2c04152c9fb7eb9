"""Label spaces: the class vocabulary a benchmark's class ids index into.

The default is ImageNet-1k (ids 0..999, CLIP-style common names).  A benchmark may name
its own vocabulary instead (an inline list or a JSON/text file of names, e.g. the demo
world's digits); ids are then positions in that list.

``imagenet_d`` is the 113-class space of ImageNet-D, whose classes each stand for a *set*
of ImageNet ids (``chair``: 423, 559, 765).  Such a space carries ``imagenet_ids``, and
:meth:`LabelSpace.outputs_from_imagenet` is the multi-id correctness rule in one place: an
ImageNet-1k output maps to the class that lists its id, so a top-1 prediction is correct
when it is any of the class's ids (an id no class lists maps to -1, always wrong).

``ximagenet12`` is ImageNet-1k restricted to XIMAGENET-12's 12 classes: the same ids and
names, but a space with ``outputs`` set takes an ImageNet-1k model's top-1 over those
outputs only (the paper's 12-way accuracy; ``pipeline.models.classifiers``).
"""

from __future__ import annotations

import difflib
import functools
import json
from pathlib import Path

from pipeline.errors import CnsbenchError
from pipeline.labels import imagenet
# XIMAGENET-12's 12 classes (the label space ``ximagenet12``, and the class folders its release
# is read by, :mod:`pipeline.sources.ximagenet`): WordNet id -> (ImageNet-1k index, the paper's
# name).  The wnids are the folder names of the repository's scripts and annotation counts
# (n01689811, n02992211, n07614500, ...); the indices are their positions in the ImageNet-1k
# class list.
XIMAGENET_CLASSES: dict[str, tuple[int, str]] = {
    "n01689811": (44, "lizard"),  # alligator lizard
    "n01693334": (46, "green lizard"),
    "n01985128": (124, "crayfish"),
    "n02066245": (147, "whale"),  # grey whale
    "n02085936": (153, "dog"),  # Maltese dog
    "n02119022": (277, "fox"),  # red fox
    "n02607072": (393, "anemone fish"),
    "n02692877": (405, "airship"),
    "n02974003": (479, "car wheel"),
    "n02977058": (480, "cash machine"),
    "n02992211": (486, "cello"),
    "n07614500": (928, "ice cream"),
}


class LabelSpace:
    def __init__(
        self,
        key: str,
        names: tuple[str, ...],
        imagenet_ids: tuple[tuple[int, ...], ...] | None = None,
        aliases: dict[str, int] | None = None,
        outputs: tuple[int, ...] | None = None,
    ) -> None:
        if not names:
            raise CnsbenchError(f"label space {key!r} is empty")
        if imagenet_ids is not None and len(imagenet_ids) != len(names):
            raise CnsbenchError(f"label space {key!r}: {len(imagenet_ids)} id lists for {len(names)} classes")
        self.key = key
        self.names = names
        # Per class, the ImageNet-1k ids it stands for (None: the space is not defined over ImageNet).
        self.imagenet_ids = imagenet_ids
        self.aliases = {k.lower(): v for k, v in (aliases or {}).items()}  # e.g. release folder names
        # The class ids an ImageNet-1k model's top-1 is taken over (None: all of them).
        self.outputs = outputs

    def outputs_from_imagenet(self, n_out: int = 1000) -> list[int]:
        """Class id of each ImageNet-1k output index (-1 where no class lists the id).

        The multi-id rule: with ``top1 = outputs_from_imagenet()[argmax]`` a prediction is
        correct exactly when the top-1 ImageNet id is one of the true class's ids.
        """
        if self.imagenet_ids is None:
            raise CnsbenchError(f"label space {self.key!r} is not defined over ImageNet ids")
        out = [-1] * n_out
        for class_id, ids in enumerate(self.imagenet_ids):
            for i in ids:
                if not 0 <= i < n_out:
                    raise CnsbenchError(f"label space {self.key!r}: class {class_id} lists ImageNet id {i} outside 0..{n_out - 1}")
                if out[i] != -1:
                    raise CnsbenchError(f"label space {self.key!r}: ImageNet id {i} belongs to classes {out[i]} and {class_id}")
                out[i] = class_id
        return out

    def __len__(self) -> int:
        return len(self.names)

    def name(self, class_id: int) -> str:
        return self.names[class_id]

    def resolve(self, value: int | str) -> int:
        """A class id (int or decimal string) or a class name -> the id, with a helpful error."""
        n = len(self.names)
        if isinstance(value, bool):
            raise CnsbenchError(f"class must be an id or a name, got {value!r}")
        if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
            idx = int(value)
            if not 0 <= idx < n:
                raise CnsbenchError(f"class id must be in 0..{n - 1} for label space {self.key!r}, got {idx}")
            return idx
        lowered = {name.lower(): i for i, name in enumerate(self.names)}
        key = str(value).strip().lower()
        if key in lowered:
            return lowered[key]
        if key in self.aliases:
            return self.aliases[key]
        close = difflib.get_close_matches(key, list(lowered), n=5, cutoff=0.6)
        hint = f"; close names: {', '.join(repr(c) for c in close)}" if close else ""
        raise CnsbenchError(f"unknown class name {value!r} in label space {self.key!r}{hint}")


@functools.lru_cache(maxsize=16)
def _load(key: str | tuple[str, ...]) -> LabelSpace:
    if isinstance(key, tuple):
        return LabelSpace("custom", key)
    if key == "imagenet":
        return LabelSpace("imagenet", imagenet.class_names())
    if key == "imagenet_d":
        from pipeline.labels import imagenet_d
        rows = imagenet_d.classes()
        return LabelSpace(
            "imagenet_d",
            imagenet_d.class_names(),
            imagenet_ids=tuple(tuple(r["imagenet_ids"]) for r in rows),
            aliases={r["folder"]: r["id"] for r in rows},
        )
    if key == "ximagenet12":
        ids = tuple(sorted(i for i, _ in XIMAGENET_CLASSES.values()))
        return LabelSpace("ximagenet12", imagenet.class_names(), outputs=ids)
    path = Path(key)
    if not path.is_file():
        raise CnsbenchError(
            "labels must be 'imagenet', 'imagenet_d', 'ximagenet12', a list of names, or a JSON/text file of names; "
            f"no file {key!r}"
        )
    text = path.read_text()
    names = json.loads(text) if path.suffix == ".json" else [line.strip() for line in text.splitlines() if line.strip()]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CnsbenchError(f"{path}: expected a list of class names")
    return LabelSpace(str(path), tuple(names))


def label_space(spec: str | list[str] | tuple[str, ...] = "imagenet") -> LabelSpace:
    return _load(tuple(spec) if isinstance(spec, (list, tuple)) else spec)
