"""``pipeline.open_output(path)``: a built (or evaluated) benchmark, read as tables, images and datasets.

Everything is read from the output's committed shards (only files a manifest vouches for;
a damaged shard is left out and listed in :attr:`Benchmark.left_out`), so what a
:class:`Benchmark` shows is what the report counts.  Nothing here writes to the output.

Opening a folder that is not an output, or one another command writes (a card's, a
leaderboard's, a comparison's), raises :class:`pipeline.errors.CnsbenchError` naming it.
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Iterator

import pandas as pd

from pipeline.api.common import user_errors
from pipeline.api.rows import SAMPLE_COLUMNS, decode
from pipeline.errors import CnsbenchError
from pipeline.io.store import OutputStore

if TYPE_CHECKING:
    from PIL import Image

    from pipeline.config import BuildConfig

# Where an image lies: the output's business, not the reader's.
_LOCATION = ("shard", "key")

# Folders other commands write, by their marker file: what they are, and where the outputs are.
OTHER_COMMANDS = {
    "cnsbench-card.json": "a robustness card's folder (cnsbench card); its benchmarks' outputs are listed in card.json",
    "card.json": "a robustness card's folder (cnsbench card); its benchmarks' outputs are listed in card.json",
    "cnsbench-leaderboard.json": "a leaderboard's folder (cnsbench leaderboard), made from cards",
    "compare.json": "a comparison's folder (cnsbench compare); its outputs are listed in compare.json",
}


def open_output(path: str | os.PathLike[str]) -> "Benchmark":
    """Open the build or evaluate output at ``path`` (a folder or a URI) for reading."""
    from pipeline.aggregate.run import load_output_config

    location = os.fspath(path)
    if not location.strip():
        raise CnsbenchError("open_output: the path is empty: give a build or evaluate output")
    with user_errors():
        store = OutputStore(location)
        if not store.exists("config.json"):
            for marker, what in OTHER_COMMANDS.items():
                if store.exists(marker):
                    raise CnsbenchError(f"{store.uri} is {what}, not a benchmark output; open a build or evaluate output")
        cfg = load_output_config(store)
    return Benchmark(store, cfg)


class Benchmark:
    """One output: its config, tables, metrics, images, and views as ``torch`` / ``datasets`` datasets."""

    def __init__(self, store: OutputStore, config: "BuildConfig") -> None:
        self.store = store
        self.config = config

    def __repr__(self) -> str:
        return f"Benchmark({self.store.uri!r}, {self.config.benchmark.name!r})"

    @property
    def uri(self) -> str:
        return self.store.uri

    @property
    def classifiers(self) -> list[str]:
        """The classifiers of the output's config, in its order."""
        return [c.name for c in self.config.classifiers]

    # ------------------------------------------------------------------ tables
    @cached_property
    def _tables(self) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str]]:
        from pipeline.aggregate.run import load_sound_tables

        with user_errors():
            return load_sound_tables(self.store)

    @property
    def left_out(self) -> dict[str, str]:
        """Damaged shards left out of every table: shard -> what is wrong."""
        return dict(self._tables[2])

    def samples(self) -> pd.DataFrame:
        """One row per image: sample id, trajectory id, class id and name, seed, shift, scale,
        kept, then ``complete`` (the trajectory has every scale of its family and all of them
        kept: the trajectories the report's metrics count) and the detector scores.
        Sorted by sample id."""
        from pipeline.aggregate.metrics import complete_trajectories

        samples = self._tables[0]
        complete: set[str] = set()
        for group in self.config.family_groups():
            complete |= complete_trajectories(samples[samples["shift"].isin(group.shifts)], list(group.scales))
        out = samples.drop(columns=[c for c in _LOCATION if c in samples.columns])
        out["complete"] = out["trajectory_id"].isin(complete)
        rest = [c for c in out.columns if c not in SAMPLE_COLUMNS + ["complete"]]
        return out[SAMPLE_COLUMNS + ["complete"] + rest].sort_values("sample_id", kind="stable").reset_index(drop=True)

    def predictions(self, classifier: str | None = None) -> pd.DataFrame:
        """One row per (image, classifier): the predictions table joined to its image's
        trajectory, class, shift, scale and keep decision (on ``sample_id``)."""
        samples, predictions, _ = self._tables
        if classifier is not None:
            self._check_classifier(classifier, predictions)
            predictions = predictions[predictions["classifier"] == classifier]
        coords = samples[["sample_id", "trajectory_id", "class_id", "shift", "scale", "kept"]]
        out = predictions.merge(coords, on="sample_id", how="left")
        return out.sort_values(["classifier", "sample_id"], kind="stable").reset_index(drop=True)

    def metrics(self) -> dict[str, Any]:
        """The report's numbers (``report/metrics.json``): counts, per-classifier summary
        (accuracy drop, failure points, margins), accuracy per shift and scale, and each
        analysis' figures under ``analyses``.  Computed from the tables (the CNS part)
        when the output has no report yet."""
        from pipeline.io.safejson import loads

        if self.store.exists("report/metrics.json"):
            with user_errors():
                return loads(self.store.read_bytes("report/metrics.json"), self.store.url("report/metrics.json"))
        per_group = self._group_metrics()
        return per_group[0][1].to_json() if per_group else {}

    def failure_points(self, classifier: str | None = None) -> pd.DataFrame:
        """The failure point of every evaluated (trajectory, classifier): the first scale at
        which the classifier is wrong (NaN: never wrong), as the report computes it; with a
        ``family`` column (the family's kind)."""
        frames = [m.failure_points.assign(family=g.kind) for g, m in self._group_metrics()]
        fps = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
            columns=["trajectory_id", "shift", "classifier", "failure_point", "family"])
        if classifier is not None:
            self._check_classifier(classifier, self._tables[1])
            fps = fps[fps["classifier"] == classifier].reset_index(drop=True)
        return fps

    def _group_metrics(self) -> list:
        from pipeline.aggregate.analysis import AnalysisContext
        from pipeline.analyses.cns import group_metrics

        samples, predictions, _ = self._tables
        with user_errors():
            return group_metrics(AnalysisContext(self.config, samples, predictions))

    def _check_classifier(self, name: str, predictions: pd.DataFrame) -> None:
        known = list(dict.fromkeys([*self.classifiers, *predictions["classifier"].unique()]))
        if name not in known:
            raise CnsbenchError(f"{self.uri} has no classifier {name!r}; its classifiers: {', '.join(known) or 'none'}")

    # ------------------------------------------------------------------ images
    def image(self, sample_id: str) -> "Image.Image":
        """The image of one sample (a PIL image)."""
        from pipeline.aggregate.images import ImageReader

        samples = self._tables[0]
        if sample_id not in set(samples["sample_id"]):
            raise CnsbenchError(f"{self.uri} has no sample {sample_id!r} (sample ids look like {_example(samples)})")
        with user_errors():
            return decode(ImageReader(self.store, samples)(sample_id))

    def _rows(self, kept_only: bool) -> pd.DataFrame:
        """The image rows a dataset view holds, in sample-id order, with where each image lies."""
        from pipeline.aggregate.frames import kept_flags

        samples = self._tables[0]
        rows = samples[kept_flags(samples["kept"])] if kept_only else samples
        return rows.sort_values("sample_id", kind="stable").reset_index(drop=True)

    def iter_images(self, kept_only: bool = True) -> Iterator[tuple[dict[str, Any], bytes]]:
        """(sample row, encoded image bytes) of every image, each shard read once."""
        from pipeline.aggregate.images import IMAGE_EXTENSIONS
        from pipeline.io.webdataset import iter_tar

        from pipeline.io.image_refs import ShardStores

        rows = self._rows(kept_only)
        stores = ShardStores(self.store)
        for shard, group in rows.groupby("shard", sort=True):
            wanted = {str(k): r for k, r in zip(group["key"], group.to_dict("records"))}
            with user_errors():
                holder = stores(shard)
                for key, members in iter_tar(holder.read_bytes(shard), source=holder.url(shard)):
                    if key in wanted:
                        data = next((members[e] for e in IMAGE_EXTENSIONS if e in members), None)
                        if data is not None:
                            yield wanted[key], data

    def torch_dataset(self, transform: Callable[[Any], Any] | None = None, kept_only: bool = True):
        """A ``torch.utils.data.Dataset`` of ``(image, label, meta)``: the PIL image (or
        ``transform(image)``), the class id, and the sample's id, trajectory, class name,
        seed, shift, scale and keep decision.  Kept images only unless ``kept_only`` is False."""
        from pipeline.api.loaders import TorchView

        return TorchView(self.store, self._rows(kept_only), transform)

    def hf_dataset(self, kept_only: bool = True):
        """A Hugging Face ``datasets.Dataset`` with an ``image`` (``Image`` feature) and the
        sample's columns, ``label`` the class id.  Needs the ``datasets`` extra."""
        from pipeline.api.loaders import hf_dataset

        return hf_dataset(self.iter_images(kept_only))


def _example(samples: pd.DataFrame) -> str:
    return repr(str(samples["sample_id"].iloc[0])) if len(samples) else "'shift/class/seed_0000_scale_0000'"
