"""What the views of an output share: the columns that identify an image, and decoding one."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL import Image

# The columns of ``Benchmark.samples()`` that identify an image, in this order.
SAMPLE_COLUMNS = ["sample_id", "trajectory_id", "class_id", "class_name", "seed", "shift", "scale", "kept"]


def decode(data: bytes) -> "Image.Image":
    """Encoded image bytes -> a loaded RGB PIL image."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


def meta_of(row: dict[str, Any]) -> dict[str, Any]:
    """What a dataset item says of its image beside the pixels and the label."""
    return {k: row[k] for k in SAMPLE_COLUMNS if k in row}
