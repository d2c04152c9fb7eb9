"""A content digest of an output: sample ids and coordinates, predictions and image bytes.

Two outputs with the same digest hold the same images, the same per-image coordinates and
the same predictions, whatever their shard layout, file names or Parquet encoding.  Images
are compared by their decoded pixels (mode, size and values), not their file bytes: the
encoder's library version changes PNG bytes without changing a pixel.  The
``params`` column and detector scores are left out (scores are floats that may differ in
the last bit across hardware).  Used to check that a refactoring or a resumed, faulted
build gives the same output as a clean one.
"""

from __future__ import annotations

import hashlib
import io
import tarfile

from pipeline.io.store import OutputStore

_SAMPLE_KEYS = ("sample_id", "trajectory_id", "class_id", "seed", "shift", "scale", "kept")
_PRED_KEYS = ("sample_id", "classifier", "top1", "correct")


def output_digest(uri: str) -> dict[str, str]:
    """``{"samples": sha, "predictions": sha, "images": sha}`` of the committed shards of ``uri``."""
    from pipeline.aggregate.run import load_predictions, load_samples

    store = OutputStore(uri)
    samples = load_samples(store).sort_values("sample_id")
    preds = load_predictions(store).sort_values(["sample_id", "classifier"])
    h_s, h_p, h_i = hashlib.sha256(), hashlib.sha256(), hashlib.sha256()
    for row in samples[list(_SAMPLE_KEYS)].itertuples(index=False):
        h_s.update(repr(tuple(row)).encode())
    for row in preds[list(_PRED_KEYS)].itertuples(index=False):
        h_p.update(repr(tuple(row)).encode())
    images: dict[str, bytes] = {}
    for manifest in store.manifests():
        for rel in manifest.files:
            if rel.startswith("images/") and rel.endswith(".tar"):
                with tarfile.open(fileobj=io.BytesIO(store.read_bytes(rel))) as tar:
                    for member in tar.getmembers():
                        if not member.name.endswith(".json"):
                            images[member.name] = tar.extractfile(member).read()
    for name in sorted(images):
        h_i.update(name.encode() + b"\0" + _pixels_sha(images[name]))
    return {"samples": h_s.hexdigest(), "predictions": h_p.hexdigest(), "images": h_i.hexdigest()}


def _pixels_sha(data: bytes) -> bytes:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.load()
        head = f"{im.mode}:{im.size[0]}x{im.size[1]}:".encode()
        return hashlib.sha256(head + im.tobytes()).digest()
