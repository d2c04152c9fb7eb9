"""The contract of an analysis (the plug-ins of ``pipeline/analyses/``) and the context it reads.

An analysis is a function ``run(ctx: AnalysisContext) -> AnalysisResult``.  It reads the
output's tables (``ctx.samples``: one row per image, ``ctx.predictions``: one row per
(image, classifier)) and the config, and returns tables (written as ``report/<name>.csv``),
figures (``report/<name>.png``), other files (``report/<name>``), JSON merged into
``report/metrics.json`` under the analysis' name, and an HTML section of ``index.html``.
Analyses never write themselves: the aggregation driver (:func:`pipeline.aggregate.run.render_report`)
writes what they return, so every analysis works the same on local disk and object storage.  The
driver finds an analysis through ``pipeline.registry.ANALYSES``, never by importing it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from matplotlib.figure import Figure

    from pipeline.config import BuildConfig, FamilyGroup


@dataclass
class AnalysisContext:
    config: "BuildConfig"
    samples: "pd.DataFrame"  # pipeline.io.tables.SAMPLES columns (+ ``params`` JSON strings)
    predictions: "pd.DataFrame"  # pipeline.io.tables.PREDICTIONS columns
    options: dict[str, Any] = field(default_factory=dict)  # this analysis' entry in aggregate.analyses
    config_hash: str | None = None
    # Read-only access to the output for analyses that need image bytes (e.g. image strips):
    # ``read_image(sample_id) -> bytes``; None when images are not available.
    read_image: Callable[[str], bytes] | None = None
    # What several analyses of one report compute alike (e.g. the family groups' metrics),
    # kept here once: the report gives every analysis' context the same dict.
    memo: dict[str, Any] = field(default_factory=dict)

    @property
    def groups(self) -> "list[FamilyGroup]":
        """The build's family groups (kind, shifts, scales, options), primary first."""
        return self.config.family_groups()

    def group_of(self, shift: str) -> "FamilyGroup | None":
        return next((g for g in self.groups if shift in g.shifts), None)

    def samples_of(self, group: "FamilyGroup") -> "pd.DataFrame":
        """The samples of one family group (its shifts)."""
        return self.samples[self.samples["shift"].isin(group.shifts)]

    def params(self) -> "pd.DataFrame":
        """``ctx.samples`` with its ``params`` JSON expanded into columns (``param.<key>``)."""
        import pandas as pd

        raw = self.samples.get("params")
        if raw is None:
            return self.samples.copy()
        parsed = [json.loads(v) if isinstance(v, str) and v else {} for v in raw]
        extra = pd.json_normalize(parsed).add_prefix("param.") if parsed else pd.DataFrame()
        extra.index = self.samples.index
        return pd.concat([self.samples, extra], axis=1)


@dataclass
class AnalysisResult:
    tables: "dict[str, pd.DataFrame]" = field(default_factory=dict)  # report/<name>.csv
    figures: "dict[str, Figure]" = field(default_factory=dict)  # report/<name>.png
    files: dict[str, bytes] = field(default_factory=dict)  # report/<name> (e.g. hard_set.parquet)
    json: dict[str, Any] = field(default_factory=dict)  # metrics.json[<analysis name>]
    html: str = ""  # a section of index.html (may reference the files above by name)
    title: str = ""  # heading of the section


Analysis = Callable[[AnalysisContext], AnalysisResult]


def read_images(read_image: Callable[[str], bytes], sample_ids) -> dict[str, bytes]:
    """``{sample_id: image bytes}`` of many samples: through the reader's ``many`` when it
    has one (ImageReader reads each tar once for all of them, not once per image)."""
    ids = list(sample_ids)
    many = getattr(read_image, "many", None)
    return many(ids) if many is not None else {sid: read_image(sid) for sid in ids}
