"""End to end: the tiny config built on a local Ray, through actor crashes, checked against
the output contract.

The build's first run has two actors crash (hard exits): the generation actor once on one
unit (restarted, retried, fine) and the classifier actor on every try of one batch (given up
after its retries and reported; the run exits 3).  The next run makes what failed; the
finished output is what the contract tests read.  (Builds killed whole with SIGKILL and
resumed: tests/test_resume.py, and on S3 tests/test_object_storage.py; a Ray worker node
killed mid-build, its output on S3: tests/test_cluster.py; Ray builds killed at random
moments: bench/chaos.py.)
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from buildproc import build_here, snapshot, tiny_config
from PIL import Image

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.io.webdataset import iter_tar
from pipeline.models.detectors import keep_decision

pytestmark = pytest.mark.slow

# The generation actor dies once on one unit; the classifier actor dies every time on one batch.
CRASHES = "generate:start:001/seed_0002:crash_once;classify:start:heavy_snow/022/seed_0002:crash"


@pytest.fixture(scope="module")
def tiny_assets():
    from pipeline.demo.assets import ensure_tiny_assets

    return ensure_tiny_assets()


def gpu_config(tmp_path: Path) -> Path:
    def on_gpu(raw):
        raw["resources"]["generate"]["num_gpus"] = 1
        raw["resources"]["classify"]["max_retries"] = 1  # two tries of a batch, then it is given up

    return tiny_config(tmp_path, on_gpu, name="demo-gpu.yaml", plots=True)


def printed_by(argv: list[str]) -> tuple[int, str]:
    """``main(argv)``'s exit code and what it printed."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(argv)
    return rc, buf.getvalue()


@pytest.fixture(scope="module")
def crashed(tiny_assets, ray_session, tmp_path_factory):
    """The first run (default runner: Ray, this test worker's) with CRASHES, then the next
    run in process (resuming is the driver's work, whichever runner made the shards): what
    each printed, and the output as the first run left it."""
    tmp = tmp_path_factory.mktemp("e2e")
    cfg_path = gpu_config(tmp)
    out, faults = tmp / "out", tmp / "faults"
    faults.mkdir()
    with pytest.MonkeyPatch.context() as mp:  # the rules reach the actors through their runtime_env
        mp.setenv("CNSBENCH_FAULT_INJECT", CRASHES)
        mp.setenv("CNSBENCH_FAULT_DIR", str(faults))
        rc, first = printed_by(["build", str(cfg_path), "--output", str(out)])
    assert rc == 3, first[-3000:]
    left = snapshot(out)
    failures = pd.concat(pd.read_parquet(p) for p in (out / "failures").glob("*.parquet"))
    status_rc, _ = printed_by(["status", str(out)])
    with contextlib.redirect_stdout(io.StringIO()) as buf:
        assert build_here(cfg_path, out) == 0
    return {"cfg": load_config(cfg_path), "out": out, "faults": faults, "first": first, "left": left,
            "failures": failures, "status_rc": status_rc, "next": buf.getvalue()}


@pytest.fixture(scope="module")
def built(crashed):
    return crashed["cfg"], crashed["out"]


def test_crashing_actor_is_retried_then_reported(crashed):
    assert list(crashed["faults"].glob("crashed-generate-*"))  # it did crash, and was retried
    assert "FAILED heavy_snow/022/seed_0002: [classify] worker crashed 2 times" in crashed["first"]
    done = {k.rsplit("_scale_", 1)[0] for k in crashed["left"]["images"]}
    assert "heavy_snow/022/seed_0002" not in done and "painting_style/001/seed_0002" in done
    assert 6 <= len(done) <= 7  # the crashing batch holds the failed trajectory and maybe one more
    assert "heavy_snow/022/seed_0002" in set(crashed["failures"]["trajectory_id"])
    assert set(crashed["failures"]["stage"]) == {"classify"}
    assert crashed["status_rc"] == 3
    # The next run retried the failed trajectories and completed the build.
    assert f"{len(done)} already done, {8 - len(done)} to make" in crashed["next"]
    assert len(snapshot(crashed["out"])["images"]) == 48


def read_dir(out: Path, kind: str) -> pd.DataFrame:
    return pd.concat([pq.read_table(p).to_pandas() for p in sorted((out / kind).glob("*.parquet"))], ignore_index=True)


def test_output_contract(built):
    cfg, out = built
    samples, preds = read_dir(out, "samples"), read_dir(out, "predictions")
    n_images = 2 * 2 * 2 * 6
    assert len(samples) == n_images and samples["sample_id"].is_unique
    assert list(samples.columns[:7]) == ["sample_id", "trajectory_id", "class_id", "class_name", "seed", "shift", "scale"]
    assert set(samples["class_id"]) == {1, 22} and set(samples["class_name"]) == {"goldfish", "bald eagle"}
    assert samples.groupby("trajectory_id").size().eq(6).all()
    # one prediction per (sample, classifier)
    assert len(preds) == n_images * 3
    assert preds.groupby(["sample_id", "classifier"]).size().eq(1).all()
    assert set(preds["sample_id"]) == set(samples["sample_id"])
    merged = preds.merge(samples[["sample_id", "class_id"]], on="sample_id")
    assert (merged["correct"] == (merged["top1"] == merged["class_id"])).all()
    assert merged["top5"].map(len).eq(5).all() and merged["p_true"].between(0, 1).all()
    # keep flags follow the 2-of-4 rule on the stored scores
    scores = {c: samples[c].tolist() for c in ("clip_text", "clip_shift_text", "clip_image", "dino_image")}
    n_pass, kept = keep_decision(scores, cfg.filter.thresholds, cfg.filter.min_pass)
    assert samples["n_pass"].tolist() == n_pass and samples["kept"].tolist() == kept
    # the scale-0 image is its own reference: image similarities are 1
    zero = samples[samples["scale"] == 0]
    assert zero["clip_image"].round(4).eq(1.0).all() and zero["dino_image"].round(4).eq(1.0).all()


def test_webdataset_shards(built):
    cfg, out = built
    samples = read_dir(out, "samples").set_index("sample_id")
    seen = {}
    for tar in sorted((out / "images").glob("*.tar")):
        for key, members in iter_tar(tar.read_bytes(), str(tar)):
            assert set(members) == {"png", "json"}
            img = Image.open(io.BytesIO(members["png"]))
            assert img.size == (64, 64) and img.mode == "RGB"
            meta = json.loads(members["json"])
            row = samples.loc[key]
            assert row["shard"] == f"images/{tar.name}" and row["key"] == key
            assert meta["label"] == row["class_id"] and meta["scale"] == row["scale"]
            seen[key] = members["png"]
    assert set(seen) == set(samples.index)
    # scale 0 is the same image for every shift of a (class, seed)
    assert seen["painting_style/022/seed_0002_scale_0000"] == seen["heavy_snow/022/seed_0002_scale_0000"]
    assert seen["painting_style/022/seed_0002_scale_2500"] != seen["heavy_snow/022/seed_0002_scale_2500"]


def test_report_consistent_with_parquet(built):
    cfg, out = built
    report = out / "report"
    for name in ("accuracy.csv", "failure_points.csv", "summary.csv", "metrics.json", "index.html",
                 "accuracy_drop.png", "fp_cumulative.png", "fp_distribution.png"):
        assert (report / name).is_file(), name
    samples, preds = read_dir(out, "samples"), read_dir(out, "predictions")
    complete = samples.groupby("trajectory_id")["kept"].all()
    keep = set(complete[complete].index)
    m = preds.merge(samples, on="sample_id")
    m = m[m["trajectory_id"].isin(keep)]
    expected = m.groupby(["classifier", "shift", "scale"])["correct"].mean()
    acc = pd.read_csv(report / "accuracy.csv").set_index(["classifier", "shift", "scale"])["accuracy"]
    assert len(acc) == len(expected)
    for idx, value in expected.items():
        assert acc.loc[idx] == pytest.approx(value)
    html = (report / "index.html").read_text()
    assert "accuracy_drop.png" in html and "fp_cumulative.png" in html
    config = json.loads((out / "config.json").read_text())
    assert len(config["config_hash"]) == 64 and (out / "config.yaml").is_file()


def test_rebuild_is_a_no_op(built, capsys):
    cfg, out = built
    before = {p: p.read_bytes() for p in sorted(out.glob("*/*")) if p.parent.name in ("images", "samples")}
    cfg_path = next(out.parent.glob("demo-gpu.yaml"))
    assert main(["build", str(cfg_path), "--output", str(out)]) == 0
    assert "8 already done, 0 to make" in capsys.readouterr().out
    after = {p: p.read_bytes() for p in sorted(out.glob("*/*")) if p.parent.name in ("images", "samples")}
    assert before == after


def test_status_command(built, capsys):
    _, out = built
    assert main(["status", str(out)]) == 0
    text = capsys.readouterr().out
    assert "48/48 images" in text and "aggregated  yes" in text



def test_ray_writer_batches_are_whole_shards(ray_session, tmp_path):
    # Ray Data cuts a bundle of >= batch_size rows into batch_size + a remainder: 3-row blocks
    # made batches of 4 and 2 (two shards per planned one) until the writer's input was
    # repartitioned into blocks of exactly batch_size rows.
    import pyarrow as pa

    from pipeline.config import StageResources
    from pipeline.executors import Chain, StageSpec
    from pipeline.executors.ray_data import RayDataExecutor

    class Emit3:  # every input row becomes a block of 3 rows (a unit's trajectories)
        name, exact_batches, keeps_attempts = "emit", False, False

        def __init__(self, **_):
            pass

        def __call__(self, batch):
            return pa.table({"i": [i for i in batch.column("i").to_pylist() for _ in range(3)]})

    class Shards:  # a writer stand-in: one row per batch, holding the batch's size
        name, exact_batches, keeps_attempts = "write", True, False

        def __init__(self, **_):
            pass

        def __call__(self, batch):
            return pa.table({"n": [batch.num_rows]})

    from pipeline.cli import TINY_CONFIG

    cfg, out = load_config(TINY_CONFIG), tmp_path
    res = StageResources(num_cpus=0.5)
    chain = Chain(cfg, [StageSpec(Emit3, resources=res, batch_size=1), StageSpec(Shards, resources=res, batch_size=4)],
                  project_memory=False)
    rows = RayDataExecutor(cfg).run([{"i": i} for i in range(8)], str(out / "unused"), chain, num_blocks=8)
    assert sorted(r["n"] for r in rows) == [4] * 6  # 24 rows in shards of exactly 4


def test_local_gpu_requests_are_scaled_to_fit_the_cluster(ray_session):
    # One logical GPU (the session's Ray): generate 1 + filter 0.25 + two classify groups of
    # 0.5 ask for 2.25; scaled by 1/2.25 every pool can hold its actor at once.
    from pipeline.config import StageResources
    from pipeline.executors import Chain, StageSpec
    from pipeline.executors.ray_data import RayDataExecutor

    from pipeline.cli import TINY_CONFIG

    cfg = load_config(TINY_CONFIG)
    notices = []
    ex = RayDataExecutor(cfg, notice=notices.append)
    res = [StageResources(num_gpus=g) for g in (1.0, 0.25, 0.5, 0.5)] + [StageResources(num_cpus=1)]
    chain = Chain(cfg, [StageSpec(object, resources=r) for r in res])
    assert ex._local_gpu_scale(chain) == pytest.approx(1 / 2.25)
    assert "ask for 2.25 GPUs" in notices[0] and "has 1" in notices[0]
    assert ex._local_gpu_scale(chain[1:3]) == 1.0  # 0.75 fits
    assert RayDataExecutor(cfg, address="ray://elsewhere:10001")._local_gpu_scale(chain) == 1.0
