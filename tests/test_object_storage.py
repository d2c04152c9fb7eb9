"""Outputs and slider stores on S3: a real S3-compatible server on 127.0.0.1 (moto's server
mode), a build killed mid-write, resumed on Ray, and read back through the store."""

from __future__ import annotations

import os

import pytest
from buildproc import RAY_SUBPROCESS_TEST_S, build_here, env_with, kill_at, run_build, snapshot, tiny_config
from s3server import s3_environment

from pipeline.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(RAY_SUBPROCESS_TEST_S)]
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


def test_build_on_s3_survives_a_kill_and_resumes(s3, tmp_path, capsys):
    from pipeline.demo.assets import ensure_tiny_assets
    from pipeline.io.store import OutputStore

    sliders = f"s3://{BUCKET}/sliders"
    upload_tree(ensure_tiny_assets() / "sliders", sliders)

    def on_s3(raw):
        raw["generator"]["slider_store"] = sliders

    cfg = tiny_config(tmp_path, on_s3)
    out = f"s3://{BUCKET}/builds/demo"
    kill_at(cfg, out, "local", "write:before_manifest:*:pause", tmp_path / "faults")
    store = OutputStore(out)
    assert store.list("manifest") == [] and store.list("images")  # files written, nothing committed
    res = run_build(cfg, out, "ray", env_with(**s3))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "uncommitted file" in res.stdout
    snap = snapshot(out)
    assert len(snap["images"]) == 48 and snap["samples"]["sample_id"].is_unique
    assert len(snap["predictions"]) == 48 * 3
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
