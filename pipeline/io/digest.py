"""A content digest of an output: sample ids and coordinates, predictions and image bytes.

Two outputs with the same digest hold the same images, the same per-image coordinates and
the same predictions, whatever their shard layout, file names or Parquet encoding.  Images
are compared by their decoded pixels (mode, size and values), not their file bytes: the
encoder's library version changes PNG bytes without changing a pixel.  Decoded pixels are
exact on one machine, under either runner, but not across CPUs: the kernels torch picks
(AVX2, AVX-512, ...) sum floats in different orders, which moves a few pixels of a few
images by one level.  The thread count does the same, so each stage computes with its
``resources.<stage>.num_cpus`` threads under both runners (:meth:`Stage.own_threads`); an
output made with other ``num_cpus`` may differ the same way.
``pixel_blocks`` is the fingerprint for comparisons across machines.  The
``params`` column and detector scores are left out (scores are floats that may differ in
the last bit across hardware).  Used to check that a refactoring or a resumed, faulted
build gives the same output as a clean one.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from typing import TYPE_CHECKING

from pipeline.io.store import OutputStore

if TYPE_CHECKING:
    import numpy as np

_SAMPLE_KEYS = ("sample_id", "trajectory_id", "class_id", "seed", "shift", "scale", "kept")
_PRED_KEYS = ("sample_id", "classifier", "top1", "correct")


def output_digest(uri: str) -> dict[str, str]:
    """``{"samples": sha, "predictions": sha, "images": sha}`` of the committed shards of ``uri``."""
    from pipeline.io.tables import load_predictions, load_samples

    store = OutputStore(uri)
    samples = load_samples(store).sort_values("sample_id")
    preds = load_predictions(store).sort_values(["sample_id", "classifier"])
    h_s, h_p, h_i = hashlib.sha256(), hashlib.sha256(), hashlib.sha256()
    for row in samples[list(_SAMPLE_KEYS)].itertuples(index=False):
        h_s.update(repr(tuple(row)).encode())
    for row in preds[list(_PRED_KEYS)].itertuples(index=False):
        h_p.update(repr(tuple(row)).encode())
    # One shard's tar at a time, each image reduced to its pixels' SHA-256 as it is read: the
    # memory held is the digests (32 bytes an image), not the images.
    pixels = {name: _pixels_sha(data) for name, data in _images(store)}
    for name in sorted(pixels):
        h_i.update(name.encode() + b"\0" + pixels[name])
    return {"samples": h_s.hexdigest(), "predictions": h_p.hexdigest(), "images": h_i.hexdigest()}


def _pixels_sha(data: bytes) -> bytes:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.load()
        head = f"{im.mode}:{im.size[0]}x{im.size[1]}:".encode()
        return hashlib.sha256(head + im.tobytes()).digest()


def pixel_blocks(uri: str, grid: int = 4) -> dict[str, np.ndarray]:
    """Per image of ``uri``'s committed shards: the sums of its pixel values over a
    ``grid`` x ``grid`` tiling, per channel (int64, shape ``(grid, grid, channels)``).

    A pixel moved by one level moves one block sum by one; a different image (another seed,
    scale or slider) moves them by hundreds.  Compare two fingerprints with a small
    absolute tolerance to tell "the same images, computed on another CPU" from "other images".
    """
    import numpy as np
    from PIL import Image

    blocks: dict[str, np.ndarray] = {}
    for name, data in _images(OutputStore(uri)):
        with Image.open(io.BytesIO(data)) as im:
            px = np.asarray(im, dtype=np.int64)
        px = px.reshape(px.shape[0], px.shape[1], -1)
        h, w = px.shape[0] // grid * grid, px.shape[1] // grid * grid
        tiles = px[:h, :w].reshape(grid, h // grid, grid, w // grid, px.shape[2])
        blocks[name] = tiles.sum(axis=(1, 3))
    return blocks


def _images(store: OutputStore):
    """``(member name, file bytes)`` of every image in the committed shards of ``store``, one
    at a time (a generator: the caller keeps what it needs of each).  An evaluation output
    that refers to a benchmark's images (:mod:`pipeline.io.image_refs`) gives the images its
    sample rows name, read from where they are."""
    from pipeline.io.image_refs import referenced

    if referenced(store) is not None:
        yield from _referred_images(store)
        return
    for manifest in store.manifests():
        for rel in manifest.files:
            if rel.startswith("images/") and rel.endswith(".tar"):
                with tarfile.open(fileobj=io.BytesIO(store.read_bytes(rel))) as tar:
                    for member in tar.getmembers():
                        if not member.name.endswith(".json"):
                            yield member.name, tar.extractfile(member).read()


def _referred_images(store: OutputStore):
    """The images an evaluation output's sample rows name, under the member names the
    benchmark gave them (:func:`pipeline.io.image_refs.referred_members`)."""
    from pipeline.io.image_refs import referred_members
    from pipeline.io.tables import load_samples

    rows = load_samples(store)[["shard", "key"]].to_dict("records")
    for key, members in referred_members(store, rows):
        yield from ((f"{key}.{ext}", data) for ext, data in members.items() if ext != "json")
