"""Storage reads through the libraries: pyarrow's column and row filters, images digested as they stream."""

from __future__ import annotations

import io
import tarfile

import numpy as np
from PIL import Image

from pipeline.io import digest, tables
from pipeline.io.manifest import ShardManifest

SHARDS = ("shard-0000000000000001", "shard-0000000000000002")


class FakeStore:
    """The calls the readers make of an OutputStore: its manifests, a file's bytes, whether a file exists."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.reads = 0
        for n, shard in enumerate(SHARDS):
            rows = [{f.name: None for f in tables.PREDICTIONS} | {"sample_id": f"s{n}{i}", "classifier": c, "top1": i}
                    for i in range(3) for c in ("a", "b", "c")]
            self.files[f"predictions/{shard}.parquet"] = tables.parquet_bytes(rows, tables.PREDICTIONS)
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                for i in range(2):
                    png = io.BytesIO()
                    Image.fromarray(np.full((4, 4, 3), 10 * n + i, np.uint8)).save(png, format="PNG")
                    info = tarfile.TarInfo(f"s{n}{i}.png")
                    info.size = len(png.getvalue())
                    tar.addfile(info, io.BytesIO(png.getvalue()))
            self.files[f"images/{shard}.tar"] = buf.getvalue()

    def manifests(self) -> list[ShardManifest]:
        return [ShardManifest(s, [], {r: {} for r in self.files if s in r}, 0, {}, {}) for s in SHARDS]

    def read_bytes(self, rel: str) -> bytes:
        self.reads += 1
        return self.files[rel]

    def url(self, rel: str) -> str:
        return rel

    def exists(self, rel: str) -> bool:
        return rel in self.files


def test_predictions_filtered_as_read_equal_the_whole_table_filtered():
    store = FakeStore()
    whole = tables.load_predictions(store)
    some = tables.load_predictions(store, ["a", "c"])
    assert len(whole) == 18 and sorted(some["classifier"].unique()) == ["a", "c"]
    assert some.equals(whole[whole["classifier"].isin(["a", "c"])].reset_index(drop=True))
    assert tables.load_predictions(store, []).empty
    narrow = tables.load_predictions(store, ["b"], columns=["sample_id", "top1"])
    assert list(narrow.columns) == ["sample_id", "top1"] and narrow["top1"].tolist() == [0, 1, 2] * 2


def test_image_digest_holds_one_image_at_a_time(monkeypatch):
    """output_digest keeps each image's pixel hash, not its bytes: at most two images' bytes are
    alive at once (the one hashed and the next one read), where keeping them all held four."""
    import pandas as pd

    store = FakeStore()
    alive = [0, 0]  # alive now, most alive at once

    class Counted(bytes):
        def __new__(cls, value: bytes):
            alive[0] += 1
            alive[1] = max(alive[1], alive[0])
            return super().__new__(cls, value)

        def __del__(self):
            alive[0] -= 1

    real = digest._images
    monkeypatch.setattr(digest, "_images", lambda st: ((n, Counted(b)) for n, b in real(st)))
    monkeypatch.setattr(digest, "OutputStore", lambda uri: store)
    monkeypatch.setattr(tables, "load_samples", lambda st: pd.DataFrame(columns=list(digest._SAMPLE_KEYS)))
    monkeypatch.setattr(tables, "load_predictions", lambda st: pd.DataFrame(columns=list(digest._PRED_KEYS)))
    out = digest.output_digest("fake://")
    assert alive[1] <= 2
    expected = __import__("hashlib").sha256()
    for name, data in sorted(real(store)):
        expected.update(name.encode() + b"\0" + digest._pixels_sha(data))
    assert out["images"] == expected.hexdigest()


# --------------------------------------------------------------------------- hub
def test_hub_ids_by_huggingface_hubs_rule():
    from pipeline.assets.hub import is_hub_id

    for good in ("llava-hf/llava-1.5-7b-hf", "gpt2", "org/name.v2", "a_b/c-d"):
        assert is_hub_id(good), good
    for bad in ("../../x/y", "org/../evil", "a/b/c", "org--x/y", "repo.git", "-x/y", "", "x" * 97, 3):
        assert not is_hub_id(bad), bad


def test_offline_mode_and_the_mirror_endpoint(monkeypatch):
    """TRANSFORMERS_OFFLINE counts as offline; otherwise the HF_ENDPOINT mirror's reachability decides."""
    import socket

    from pipeline.assets import hub

    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    assert hub.offline()
    monkeypatch.delenv("TRANSFORMERS_OFFLINE")
    with socket.socket() as server:  # a local "mirror": reachable
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
        assert not hub.offline()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")  # closed now: unreachable
    assert hub.offline()


# --------------------------------------------------------------------------- demo assets
def test_demo_assets_build_under_a_file_lock(tmp_path, monkeypatch):
    """ensure_tiny_assets builds while holding filelock's lock beside the folder (another holder
    waits), and an up-to-date build is not redone."""
    from filelock import FileLock, Timeout

    from pipeline.demo import assets

    seen = []

    def build(root, stamp, echo):
        try:
            FileLock(tmp_path / ".tiny.lock").acquire(timeout=0)
            seen.append("free")
        except Timeout:
            seen.append("held")
        root.mkdir(parents=True)
        stamp.write_text(assets.VERSION)
        return root

    monkeypatch.setattr(assets, "_build_tiny_assets", build)
    assert assets.ensure_tiny_assets(tmp_path / "tiny", echo=lambda m: None) == tmp_path / "tiny"
    assets.ensure_tiny_assets(tmp_path / "tiny", echo=lambda m: None)
    assert seen == ["held"]
