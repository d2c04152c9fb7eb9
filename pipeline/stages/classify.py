"""Classify stage: runs the configured classifiers on every image of a batch.

Input rows follow :data:`pipeline.plan.schema.FILTERED`; output rows follow
:data:`pipeline.plan.schema.CLASSIFIED` with ``pred_top1[image][classifier]``,
``pred_top5[image][classifier][k]`` and ``pred_p_true[image][classifier]`` in the config's
classifier order, all as ImageNet ids.  Images are decoded once per batch and each
classifier sees all of them in one batched call (chunked inside ``predict``).  Filtered-out
images are classified too, so unfiltered numbers can be reported; failed rows pass
through with empty lists.

A stage owns a group of the classifiers (``classifiers``: their indices in the config,
default all).  When ``resources.classify.memory_budget_gb`` splits the pool into groups
(:func:`pipeline.perf.memory.classifier_groups`), each group is its own stage in the chain
(:func:`classify_specs`), and each stage merges its predictions into those of the groups
before it (``done``), so the columns stay in the config's order whatever the grouping.
:func:`group_stages` gives each group's stage arguments, for a build's chain and for the
reclassify stage (:mod:`pipeline.stages.reclassify`) alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pipeline import registry

from pipeline.plan import schema
from pipeline.stages.base import Stage, decode_image, pick_device

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import BuildConfig
    from pipeline.executors import StageSpec

# Per image, one entry per classifier.
_ADDED = ("pred_top1", "pred_top5", "pred_p_true", "pred_answer", "pred_excluded")


class ClassifyStage(Stage):
    name = "classify"
    output_schema = schema.CLASSIFIED

    def __init__(
        self,
        config,
        output: str | None = None,
        device: str | None = None,
        threads: int | None = None,
        classifiers: Sequence[int] | None = None,
        done: Sequence[int] = (),
    ) -> None:
        super().__init__(config, output, device, threads)
        n = len(self.config.classifiers)
        self.owned = sorted(range(n) if classifiers is None else classifiers)
        self.done = sorted(done)  # classifiers whose predictions the input rows carry already
        if set(self.owned) & set(self.done) or not set(self.owned + self.done) <= set(range(n)):
            raise ValueError(f"classify stage: classifiers {self.owned} and done {self.done} must be disjoint indices < {n}")

    @property
    def attempts_name(self) -> str:
        # One stage per classifier group: each counts the tries of a batch itself (a batch
        # that crashed one group's worker once must not have used up the next group's tries).
        if self.owned == list(range(len(self.config.classifiers))):
            return self.name
        return f"{self.name}-" + "-".join(map(str, self.owned))

    def setup(self) -> None:
        """Pick the device and build the classifiers this stage owns, in config order, in the
        configured precision."""
        self.device = pick_device(self.device_override)
        labels = self.config.benchmark.label_space
        specs = [self.config.classifiers[i] for i in self.owned]
        self.classifiers = [registry.CLASSIFIERS.get(spec.kind)(spec, self.device, labels) for spec in specs]
        from pipeline.models.precision import ModelPrecision

        # resources.classify.precision / channels_last; a kind with its own dtypes (a vlm) keeps them.
        precision = ModelPrecision.of(self.config.resources.classify)
        for clf in self.classifiers:
            clf.set_precision(precision)

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """FILTERED rows -> CLASSIFIED rows, same order."""
        from pipeline.models.classifiers import classify_all

        todo = [i for i, r in enumerate(rows) if not r.get("error") and r.get("images")]
        images, truth, owner, shifted, sids, params, slot = [], [], [], [], [], [], []
        for i in todo:
            for k, (data, scale) in enumerate(zip(rows[i]["images"], rows[i]["scales"], strict=True)):
                images.append(decode_image(data))
                truth.append(rows[i]["class_id"])
                owner.append(i)
                shifted.append(scale > 0)  # ImageNet-C's protocol crops these without resizing
                sids.append(rows[i]["sample_ids"][k])  # a vlm seeds its sampling with the sample id
                params.append((rows[i].get("params") or [None] * len(rows[i]["scales"]))[k])
                slot.append((i, k))

        # One (top1, top5, p_true, answer, excluded) tuple per classifier, each over all images;
        # vlms run after the ranking classifiers they draw distractors from.
        earlier = {self.config.classifiers[c].name: [rows[i]["pred_top5"][k][n] for i, k in slot]
                   for n, c in enumerate(self.done)}
        per_clf = classify_all(self.classifiers, images, truth, sids, params, earlier, shifted) if images else []

        preds: dict[int, dict[str, list]] = {i: {k: [] for k in _ADDED} for i in range(len(rows))}
        for j, i in enumerate(owner):
            for key, values in zip(_ADDED, zip(*per_clf)) if per_clf else ():
                preds[i][key].append([v[j] for v in values])
        if self.done:
            preds = {i: self._merged(rows[i], p) for i, p in preds.items()}
        return [{**row, **preds[i]} for i, row in enumerate(rows)]

    def _merged(self, row: dict[str, Any], own: dict[str, list]) -> dict[str, list]:
        """This group's predictions placed among those of earlier groups, in config order."""
        if not own["pred_top1"]:  # a failed row: nothing was classified
            return {k: row.get(k) or [] for k in _ADDED}
        order = sorted(self.done + self.owned)
        out: dict[str, list] = {}
        for key in _ADDED:
            merged = []
            for earlier, mine in zip(row[key], own[key], strict=True):  # per image
                by_index = {**dict(zip(self.done, earlier, strict=True)), **dict(zip(self.owned, mine, strict=True))}
                merged.append([by_index[c] for c in order])
            out[key] = merged
        return out


def group_stages(
    cfg: BuildConfig, owned: Sequence[int] | None = None, done: Sequence[int] = ()
) -> list[dict[str, list[int]]]:
    """The :class:`ClassifyStage` arguments (``classifiers``, ``done``) of the stages that run
    the classifiers ``owned`` (indices into ``cfg.classifiers``, default all): one stage per
    group that fits the memory budget (:func:`pipeline.perf.memory.classifier_groups`), in the
    order they run, each after ``done`` (classifiers whose predictions the rows carry
    already) and the groups before it."""
    from pipeline.perf.memory import classifier_groups

    if owned is None:
        owned, groups = list(range(len(cfg.classifiers))), classifier_groups(cfg)
    else:
        owned = sorted(owned)
        only = cfg.model_copy(update={"classifiers": [cfg.classifiers[i] for i in owned]})
        groups = classifier_groups(only)
    earlier = sorted(done)
    stages = []
    for group in groups:
        members = [owned[j] for j in group]
        stages.append({"classifiers": members, "done": list(earlier)})
        earlier = sorted(earlier + members)
    return stages


def classify_specs(cfg: BuildConfig) -> list[StageSpec]:
    """The classify stages of a chain: one per classifier group that fits the memory budget."""
    from pipeline.executors import StageSpec

    stages = group_stages(cfg)
    if len(stages) == 1:
        return [StageSpec(ClassifyStage)]
    return [StageSpec(ClassifyStage, kwargs) for kwargs in stages]
