"""Classify stage: runs every configured classifier on every image of a batch.

Input rows follow :data:`pipeline.schema.FILTERED`; output rows follow
:data:`pipeline.schema.CLASSIFIED` with ``pred_top1[image][classifier]``,
``pred_top5[image][classifier][k]`` and ``pred_p_true[image][classifier]`` in the config's
classifier order, all as ImageNet ids.  Images are decoded once per batch and each
classifier sees all of them in one batched call (chunked inside ``predict``).  Filtered-out
images are classified too, so unfiltered numbers can be reported; failed rows pass
through with empty lists.
"""

from __future__ import annotations

from typing import Any

from pipeline import registry, schema
from pipeline.stages.base import Stage, decode_image, pick_device

_ADDED = ("pred_top1", "pred_top5", "pred_p_true")


class ClassifyStage(Stage):
    name = "classify"
    output_schema = schema.CLASSIFIED

    def setup(self) -> None:
        """Pick the device and build every classifier of the config, in order."""
        self.device = pick_device(self.device_override)
        labels = self.config.benchmark.label_space
        self.classifiers = [
            registry.CLASSIFIERS.get(spec.kind)(spec, self.device, labels) for spec in self.config.classifiers
        ]

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """FILTERED rows -> CLASSIFIED rows, same order."""
        from pipeline.models.classifiers import topk_predictions

        todo = [i for i, r in enumerate(rows) if not r.get("error") and r.get("images")]
        images, truth, owner = [], [], []
        for i in todo:
            for data in rows[i]["images"]:
                images.append(decode_image(data))
                truth.append(rows[i]["class_id"])
                owner.append(i)

        per_clf = []  # one (top1, top5, p_true) triple per classifier, each over all images
        for clf in self.classifiers if images else []:
            logits = clf.predict(images)
            per_clf.append(topk_predictions(logits, clf.out_to_label, truth))

        preds: dict[int, dict[str, list]] = {i: {k: [] for k in _ADDED} for i in range(len(rows))}
        for j, i in enumerate(owner):
            preds[i]["pred_top1"].append([top1[j] for top1, _, _ in per_clf])
            preds[i]["pred_top5"].append([top5[j] for _, top5, _ in per_clf])
            preds[i]["pred_p_true"].append([p[j] for _, _, p in per_clf])
        return [{**row, **preds[i]} for i, row in enumerate(rows)]
