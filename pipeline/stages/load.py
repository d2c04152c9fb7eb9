"""The load stage of ``cnsbench evaluate``: pointer rows of a source -> trajectory rows with image bytes."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

from pipeline.io.files import filesystem
from pipeline.plan import schema
from pipeline.stages.base import Stage, encode_image

log = logging.getLogger(__name__)


_FORMATS = {"JPEG": "jpg", "PNG": "png"}


class LoadStage(Stage):
    """Pointer rows (:data:`SOURCE_ROW`) -> trajectory rows with encoded image bytes.

    Output: :data:`pipeline.plan.schema.GENERATED` (``unet_evals`` and ``gen_seconds`` 0), or
    with ``fill_filter`` :data:`pipeline.plan.schema.FILTERED` with the filter columns as
    "not filtered" (NaN scores, ``n_pass`` 0, ``kept`` True) so the classify stage follows
    directly.  Images already in ``output.image_format`` pass through byte for byte
    (published JPEGs stay the published JPEGs); others are re-encoded to it.  An image that
    cannot be read or decoded fails its trajectory (``error`` starting ``[load]``), as does
    a trajectory without a scale-0 image when the filter (which needs it) follows.
    """

    name = "load"

    def __init__(
        self,
        config: Any,
        output: str | None = None,
        device: str | None = None,
        threads: int | None = None,
        fill_filter: bool = False,
    ) -> None:
        super().__init__(config, output, device, threads)
        self.fill_filter = fill_filter
        self.output_schema = schema.FILTERED if fill_filter else schema.GENERATED

    def batch_keys(self, rows: list[dict[str, Any]]) -> list[str]:
        # Reading files does not kill workers; no crash bookkeeping (and no `resources.load`).
        return []

    def setup(self) -> None:
        pass  # nothing to load; fsspec caches its filesystem instances itself

    def _read(self, path: str, offset: int, size: int) -> bytes:
        fs, p = filesystem(path)
        if offset < 0:
            return fs.cat_file(p)
        data = fs.cat_file(p, start=offset, end=offset + size)
        if len(data) != size:
            raise OSError(f"read {len(data)} of {size} bytes at offset {offset} (truncated shard?)")
        return data

    def _image(self, path: str, offset: int, size: int) -> bytes:
        from PIL import Image

        data = self._read(path, offset, size)
        img = Image.open(io.BytesIO(data))
        img.load()  # decode now: a corrupt file fails here, as its trajectory, not in a model stage
        fmt = self.config.output.image_format
        if _FORMATS.get(img.format or "") == fmt:
            return data
        return encode_image(img.convert("RGB"), fmt, self.config.output.jpeg_quality)

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for r in rows:
            row = {k: r[k] for k in ("trajectory_id", "unit_id", "class_id", "class_name", "seed", "shift")}
            row.update(scales=list(r["scales"]), sample_ids=list(r["sample_ids"]), unet_evals=0.0, gen_seconds=0.0)
            row["params"] = r.get("params")  # per image, from layouts that record some (ImageNet-D questions)
            error = None
            images: list[bytes] = []
            if not self.fill_filter and 0.0 not in row["scales"]:
                error = "[load] no scale-0 image for this trajectory; the OOC filter needs it as reference"
            else:
                for path, offset, size in zip(r["paths"], r["offsets"], r["sizes"]):
                    where = path if offset < 0 else f"{path} (bytes {offset}..{offset + size})"
                    try:
                        images.append(self._image(path, offset, size))
                    except Exception as err:  # recorded per trajectory; the run goes on
                        error = f"[load] cannot read image {where}: {type(err).__name__}: {err}"
                        break
            if error:
                log.warning("%s: %s", row["trajectory_id"], error)
                row.update(scales=[], sample_ids=[], images=[], params=None, error=error)
            else:
                row.update(images=images, error=None)
            decided = r.get("source_filter")
            if self.fill_filter:
                n = len(row["images"])
                nan = [float("nan")] * n
                row.update({c: nan for c in (*schema.SCORE_COLUMNS, *schema.REALISATION_COLUMNS)})
                row.update(n_pass=[0] * n, kept=[True] * n)
                if decided and not error:  # a build's own decisions (pipeline.sources.webdataset)
                    row.update(source_decisions(json.loads(decided), n))
            out.append(row)
        return out


def source_decisions(decided: list[dict[str, Any] | None], n: int) -> dict[str, list[Any]]:
    """The filter columns of a trajectory from what its build decided per image (an image the
    build's table lacks counts as kept, with no scores)."""
    nan = float("nan")
    out: dict[str, list[Any]] = {"kept": [], "n_pass": []}
    columns = (*schema.SCORE_COLUMNS, *schema.REALISATION_COLUMNS)
    for c in columns:
        out[c] = []
    for d in (decided + [None] * n)[:n]:
        d = d or {}
        out["kept"].append(bool(d.get("kept", True)))
        out["n_pass"].append(int(d.get("n_pass", 0)))
        for c in columns:
            v = d.get(c)
            out[c].append(nan if v is None else float(v))
    return out
