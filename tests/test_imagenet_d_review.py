"""Review of a mined set: decisions (atomic, resumable), final set = mined ∩ accepted,
calibration labels, and the Serve routes (in process, Starlette's test client)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from pipeline import cli
from pipeline.serve.review import Review, ReviewError, UnknownSet

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def output(tmp_path_factory) -> Path:
    """An evaluate output of a small released-layout folder, plus a hand-made hard set of 3 of its images."""
    from test_imagenet_d_release import make_release

    from pipeline.demo.assets import ensure_tiny_assets

    ensure_tiny_assets()
    root = tmp_path_factory.mktemp("review")
    release = make_release(root / "ImageNet-D")
    out = root / "out"
    cfg = REPO / "configs" / "tiny.yaml"
    assert cli.main(["evaluate", str(release), "--config", str(cfg), "--output", str(out), "--runner", "local", "--filter"]) == 0
    samples = pd.read_parquet(out / "samples").sort_values("sample_id")
    hard = samples.head(3)[["sample_id", "class_id", "class_name", "shift", "seed"]].assign(kind=lambda d: d["shift"])
    hard.to_parquet(out / "report" / "hard_set.parquet", index=False)
    return out


def fresh(output: Path) -> Path:
    """The output with no review decisions yet."""
    import shutil

    shutil.rmtree(output / "review", ignore_errors=True)
    return output


def test_decisions_persist_and_make_the_final_set(output):
    out = fresh(output)
    r = Review(str(out))
    assert r.sets() == ["hard_set"]
    ids = r.table("hard_set")["sample_id"].tolist()
    assert r.progress("hard_set") == {"set": "hard_set", "total": 3, "decided": 0, "remaining": 3, "accept": 0, "reject": 0, "not_class": 0}
    r.decide("hard_set", {ids[0]: "accept", ids[1]: "not_class"})
    # Resumable: a new reader (a restarted server) sees the stored decisions.
    again = Review(str(out))
    assert {k: v["decision"] for k, v in again.decisions("hard_set").items()} == {ids[0]: "accept", ids[1]: "not_class"}
    again.decide("hard_set", {ids[2]: "accept", ids[1]: "reject"})
    again.decide("hard_set", {ids[2]: None})  # undo
    p = again.progress("hard_set")
    assert (p["decided"], p["accept"], p["reject"], p["not_class"]) == (2, 1, 1, 0)
    final = pd.read_parquet(out / "review" / "hard_set_final.parquet")
    assert final["sample_id"].tolist() == [ids[0]]  # mined ∩ accepted
    doc = json.loads((out / "review" / "hard_set.json").read_text())
    assert doc["set"] == "hard_set" and set(doc["decisions"]) == {ids[0], ids[1]}
    assert not list((out / "review").glob(".tmp-*"))  # atomic writes leave no temporary file


def test_labels_feed_calibrate_filter(output, tmp_path):
    out = fresh(output)
    r = Review(str(out))
    ids = r.table("hard_set")["sample_id"].tolist()
    r.decide("hard_set", {ids[0]: "accept", ids[1]: "not_class", ids[2]: "reject"})
    labels = pd.read_parquet(out / "review" / "hard_set_labels.parquet")
    assert dict(zip(labels["sample_id"], labels["ooc"])) == {ids[0]: False, ids[1]: True}  # reject says nothing
    assert labels[["clip_text", "clip_shift_text", "clip_image", "dino_image"]].notna().all().all()
    # The labels file is what `cnsbench calibrate-filter` reads.
    from pipeline.models.calibrate import read_labels

    scores, ooc = read_labels(str(out / "review" / "hard_set_labels.parquet"))
    assert scores.shape == (2, 4) and ooc.tolist() == [False, True]


def test_bad_input_is_refused_and_nothing_written(output):
    out = fresh(output)
    r = Review(str(out))
    sid = r.table("hard_set")["sample_id"].iloc[0]
    with pytest.raises(ReviewError, match="sample ids not in set"):
        r.decide("hard_set", {"background/002/nope": "accept"})
    with pytest.raises(ReviewError, match="decisions must be one of"):
        r.decide("hard_set", {sid: "maybe"})
    with pytest.raises(UnknownSet, match="no set 'other'"):
        r.progress("other")
    with pytest.raises(ReviewError, match="must match"):
        r.progress("../etc")
    assert not (out / "review" / "hard_set.json").exists()


@pytest.fixture(scope="module")
def client(output):
    from starlette.testclient import TestClient

    from pipeline.serve.deployments import in_process_api

    return TestClient(in_process_api({"output": str(output), "allowed_hosts": ["testserver"]}))


def test_review_routes(output, client):
    fresh(output)
    page = client.get("/review")
    assert page.status_code == 200 and "review" in page.text and "sha256-" in page.headers["content-security-policy"]
    items = client.get("/api/review/hard_set/items").json()
    assert len(items["items"]) == 3 and items["progress"]["remaining"] == 3
    first = items["items"][0]
    assert set(first) >= {"sample_id", "class_name", "shift", "kind", "decision"} and first["decision"] is None
    r = client.post("/api/review/hard_set/decisions", json={"decisions": {first["sample_id"]: "accept"}})
    assert r.status_code == 200 and r.json()["accept"] == 1
    assert client.get("/api/review/hard_set/progress").json()["decided"] == 1
    assert client.get("/api/review/hard_set/items").json()["items"][0]["decision"] == "accept"
    # Bad input: 422 (unknown id or decision, wrong shape), 404 (unknown set), 415 / 400 (not JSON).
    assert client.post("/api/review/hard_set/decisions", json={"decisions": {first["sample_id"]: "x"}}).status_code == 422
    assert client.post("/api/review/hard_set/decisions", json={"decisions": {"nope": "accept"}}).status_code == 422
    assert client.post("/api/review/hard_set/decisions", json={"accept": []}).status_code == 422
    assert client.post("/api/review/hard_set/decisions", json={"decisions": {}}).status_code == 422
    assert client.get("/api/review/nope/items").status_code == 404
    assert client.get("/api/review/Bad..Name/items").status_code == 422
    assert client.post("/api/review/hard_set/decisions", content=b"{", headers={"content-type": "application/json"}).status_code == 400
    assert client.post("/api/review/hard_set/decisions", content=b"a=1", headers={"content-type": "text/plain"}).status_code == 415
    assert client.get("/api/review/hard_set/progress").json()["decided"] == 1  # nothing else was stored
