"""Sources ``folders`` and ``webdataset``: the scale-0 image is the ``seed``-th image of the class.

The collection is indexed with the evaluate-side readers (:func:`pipeline.sources.load_folders`,
:func:`pipeline.sources.load_webdataset`), so folder -> class rules, label maps and
WebDataset metadata mean the same in both places.  In a build, ``benchmark.seeds`` are
image indices within each class (files sorted by folder, then name); an index a class
does not have is reported by ``validate`` before any work starts.  The image is resized
to ``generator.image_size`` (bicubic) unless it already has that size.
"""

from __future__ import annotations

import io
import os
import posixpath

from pipeline.errors import CnsbenchError
from pipeline.families.base import BaseImage, UnitContext
from pipeline.sources.base import ImageSource


class CollectionSource(ImageSource):
    kind = ""

    @classmethod
    def missing_files(cls, config) -> list[str]:
        path = config.source.path
        if not path:
            return [f"source.path: not set (source kind {config.source.kind!r} reads a collection)"]
        if "://" not in path and not os.path.isdir(path):
            return [f"source.path: not a directory: {path}"]
        try:
            index = cls.index(config)
        except ValueError as err:
            return [f"source.path: {err}"]
        missing = []
        for class_id in config.benchmark.classes:
            have = index.get(int(class_id), {})
            lacking = [s for s in config.benchmark.seeds if s not in have]
            if lacking:
                missing.append(
                    f"source.path: class {class_id} has {len(have)} image(s); no image for seed(s) {lacking[:10]} "
                    "(seeds index the images of a class)"
                )
        return missing

    @classmethod
    def read_source(cls, config):
        raise NotImplementedError

    @classmethod
    def index(cls, config) -> dict[int, dict[int, tuple[str, int, int, str]]]:
        """class id -> seed -> (path, offset, size, path relative to the collection)."""
        from pipeline.sources.common import NO_SHIFT

        source = cls.read_source(config)
        root = config.source.path.rstrip("/")
        out: dict[int, dict[int, tuple[str, int, int, str]]] = {}
        for row in source.rows:
            if row["shift"] != NO_SHIFT and 0.0 not in row["scales"]:
                continue
            i = row["scales"].index(0.0)
            path = row["paths"][i]
            rel = posixpath.relpath(path.split("://", 1)[-1], root.split("://", 1)[-1])
            out.setdefault(int(row["class_id"]), {})[int(row["seed"])] = (path, row["offsets"][i], row["sizes"][i], rel)
        return out

    def setup(self) -> None:
        self._index = self.index(self.config)

    def load(self, ctx: UnitContext) -> BaseImage:
        from PIL import Image

        from pipeline.io.files import filesystem
        from pipeline.models.sampler import resize

        try:
            path, offset, size, rel = self._index[ctx.class_id][ctx.seed]
        except KeyError:
            raise CnsbenchError(f"source {self.config.source.path}: no image {ctx.seed} for class {ctx.class_id}") from None
        fs, p = filesystem(path)
        data = fs.cat_file(p) if offset < 0 else fs.cat_file(p, start=offset, end=offset + size)
        image = Image.open(io.BytesIO(data)).convert("RGB")
        image = resize(image, self.config.generator.image_size)
        return BaseImage(image=image, info={"source": self.kind, "relpath": rel})


class FoldersSource(CollectionSource):
    kind = "folders"

    @classmethod
    def read_source(cls, config):
        from pipeline.sources.folders import load_folders

        return load_folders(
            config.source.path,
            config.benchmark.label_space,
            config.source.label_map,
            follow_symlinks=config.source.follow_symlinks,
        )


class WebDatasetSource(CollectionSource):
    kind = "webdataset"

    @classmethod
    def read_source(cls, config):
        from pipeline.sources.webdataset import load_webdataset

        return load_webdataset(
            config.source.path, config.benchmark.label_space, follow_symlinks=config.source.follow_symlinks
        )
