"""Outputs and slider stores on S3: a real S3-compatible server on 127.0.0.1 (moto's server
mode), a build killed whole with SIGKILL mid-write, resumed, and read back through the store.

The killed build runs in a child forked from this process (see ``buildproc.kill_at``); the
runs after it (the resume, the reference) run in this process.  Resuming is the driver's
work (plan, clean up, commit), whichever runner made the shards.  Ray's actors writing to
S3 are tests/test_cluster.py's: its two-node build, worker node killed mid-write, keeps its
output on this server.
"""

from __future__ import annotations

import os

import pytest
from buildproc import assert_same_as_full, build_here, kill_at, light, snapshot, tiny_config
from s3server import s3_environment

from pipeline.cli import main

pytestmark = pytest.mark.slow
BUCKET = "cnsbench-test"


@pytest.fixture(scope="module")
def s3():
    """The ``AWS_*`` variables of a test server holding BUCKET (also set in this process)."""
    pytest.importorskip("s3fs")
    with s3_environment(BUCKET) as server:
        yield server.env()


def upload_tree(local_dir, uri: str) -> None:
    import fsspec

    fs, root = fsspec.core.url_to_fs(uri)
    for path in sorted(local_dir.rglob("*")):
        if path.is_file():
            fs.pipe(f"{root}/{path.relative_to(local_dir).as_posix()}", path.read_bytes())


def test_build_on_s3_killed_mid_write_resumes_identically(s3, tiny_reference, tmp_path, capsys):
    """Shards a build committed to S3 before its kill, completed by the next run, equal the
    uninterrupted local build's where they share columns (ids and seeds come from
    coordinates: the storage changes no byte)."""
    from pipeline.demo.assets import ensure_tiny_assets
    from pipeline.io.store import OutputStore

    sliders = f"s3://{BUCKET}/sliders"
    upload_tree(ensure_tiny_assets() / "sliders", sliders)

    def on_s3(raw):
        light(raw)  # what is tested is the killed build's path, not the models
        raw["generator"]["slider_store"] = sliders

    cfg = tiny_config(tmp_path, on_s3)
    out = f"s3://{BUCKET}/builds/demo"
    # The last unit's write pauses (files written, manifest not): the kill lands with the
    # other shards committed and one half-written.
    kill_at(cfg, out, "local", "write:before_manifest:painting_style/022/seed_0002:pause", tmp_path / "faults", env=s3)
    store = OutputStore(out)
    committed = len(store.list("manifest"))
    assert committed >= 1, "the killed build committed nothing before the last unit"
    referenced = {rel for m in store.manifests() for rel in m.files}
    assert set(store.list("images")) - referenced  # the half-written shard
    capsys.readouterr()
    assert build_here(cfg, out) == 0
    text = capsys.readouterr().out
    assert f"8 trajectories planned, {2 * committed} already done" in text and "uncommitted file" in text
    snap = snapshot(out)
    assert_same_as_full(snap, snapshot(tiny_reference))
    assert len(snap["predictions"]) == 48
    assert store.exists("report/index.html") and store.exists("report/accuracy.csv")
    # Every file in the shard folders is vouched for by a manifest: nothing half-written is left.
    referenced = {rel for m in store.manifests() for rel in m.files}
    for kind in ("images", "samples", "predictions"):
        assert set(store.list(kind)) <= referenced
    assert main(["status", out]) == 0
    # Rebuilding is a no-op; `aggregate` works on the URI too.
    capsys.readouterr()
    assert build_here(cfg, out) == 0 and "8 already done, 0 to make" in capsys.readouterr().out
    assert main(["aggregate", out]) == 0


def test_missing_slider_on_s3_is_reported(s3, tmp_path, capsys):
    def on_s3(raw):
        raw["generator"]["slider_store"] = f"s3://{BUCKET}/no-sliders-here"

    cfg = tiny_config(tmp_path, on_s3)
    assert main(["validate", str(cfg)]) == 2
    out = capsys.readouterr().out
    assert f"s3://{BUCKET}/no-sliders-here/heavy_snow/001.safetensors" in out
    assert os.environ["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
