"""The Ray Serve app (pipeline.serve.app) over HTTP, against a tiny benchmark built here.

One tiny build (a variant of configs/tiny.yaml whose filter removes some images and with
a fourth, two-way zero-shot classifier, so that kept flags and failure points vary) and
one Serve app with a token on 127.0.0.1 serve every test of the module.  Responses are
checked against the build's own Parquet and tar files, and the live preview against the
batch pipeline's predictions for the same (class, shift, seed).

The helpers (``serve_config``, ``build_benchmark``, ``start_server``, ``Client``) are
shared with ``test_serve_browser.py``; the build lives in the session's base temporary
directory so a second module only resumes it (a no-op).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import io
import json
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from buildproc import tiny_config
from PIL import Image

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.io.webdataset import iter_tar

pytestmark = pytest.mark.slow

TOKEN = "test-token-0123456789abcdef"
APP = "cnsbench"
#: The scores of the tiny random-weight detectors lie around this DINOv2 threshold, so the filter
#: keeps some images and removes others (the tiny config's own thresholds keep everything).
DINO_THRESHOLD = 0.96


# =========================================================================== shared helpers
def serve_config(directory: Path) -> Path:
    """The tiny config with a stricter filter and a two-way zero-shot classifier added."""

    def mutate(raw: dict[str, Any]) -> None:
        raw["filter"]["thresholds"] = {"dino_image": DINO_THRESHOLD}
        two_way = dict(raw["classifiers"][2])  # the open_clip zero-shot model, over classes 1 and 22 only
        two_way.update(name="tiny-clip-2way", label_map={0: 1, 1: 22})
        raw["classifiers"].append(two_way)

    return tiny_config(directory, mutate, name="serve-demo.yaml")


def build_benchmark(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(config, output) of the test benchmark, built once per session (later calls resume: no-op)."""
    from pipeline.demo.assets import ensure_tiny_assets

    ensure_tiny_assets()
    root = tmp_path_factory.getbasetemp() / "serve-benchmark"
    root.mkdir(exist_ok=True)
    cfg_path = serve_config(root)
    out = root / "out"
    assert main(["build", str(cfg_path), "--output", str(out)]) == 0
    return cfg_path, out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(cfg_path: Path | None, out: Path | None, token: str | None) -> str:
    from pipeline.serve.app import run_server

    return run_server(
        str(cfg_path) if cfg_path else None,
        str(out) if out else None,
        host="127.0.0.1",
        port=free_port(),
        token=token,
        blocking=False,
        echo=lambda *_: None,
    )


@dataclass
class Reply:
    status: int
    headers: Any
    body: bytes

    @property
    def type(self) -> str:
        return (self.headers.get("content-type") or "").split(";")[0]

    def json(self) -> Any:
        return json.loads(self.body)


class Client:
    """A few lines of urllib: raw paths (no client-side normalisation of '..'), bearer token."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/")
        self.token = token

    def request(
        self,
        path: str,
        method: str = "GET",
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        token: str | None | bool = True,
    ) -> Reply:
        h = dict(headers or {})
        tok = self.token if token is True else token
        if tok:
            h["Authorization"] = f"Bearer {tok}"
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                return Reply(r.status, r.headers, r.read())
        except urllib.error.HTTPError as err:
            return Reply(err.code, err.headers, err.read())

    def get(self, path: str, **kw: Any) -> Reply:
        return self.request(path, **kw)

    def post_json(self, path: str, data: Any, **kw: Any) -> Reply:
        return self.request(
            path, "POST", json.dumps(data).encode(), {"Content-Type": "application/json"}, **kw
        )


def read_dir(out: Path, kind: str) -> pd.DataFrame:
    return pd.concat([pq.read_table(p).to_pandas() for p in sorted((out / kind).glob("*.parquet"))], ignore_index=True)


def png(data: bytes) -> np.ndarray:
    img = Image.open(io.BytesIO(data))
    img.load()
    return np.asarray(img.convert("RGB"), dtype=np.int16)


# =========================================================================== fixtures
def start_ray() -> None:
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)


def stop_ray() -> None:
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_session():
    start_ray()
    yield
    stop_ray()


@pytest.fixture(scope="module")
def built(ray_session, tmp_path_factory):
    return build_benchmark(tmp_path_factory)


@pytest.fixture(scope="module")
def client(built) -> Client:
    cfg_path, out = built
    return Client(start_server(cfg_path, out, TOKEN), TOKEN)


@pytest.fixture(scope="module")
def tables(built) -> dict[str, Any]:
    cfg_path, out = built
    samples, preds = read_dir(out, "samples"), read_dir(out, "predictions")
    cfg = load_config(cfg_path)
    n_scales = len(cfg.benchmark.scales)
    g = samples.groupby("trajectory_id")
    complete = set(g.size()[(g.size() == n_scales) & g["kept"].all()].index)
    images = {}
    for tar in sorted((out / "images").glob("*.tar")):
        for key, members in iter_tar(tar.read_bytes(), str(tar)):
            images[key] = members["png"]
    return {"cfg": cfg, "samples": samples, "preds": preds, "complete": complete, "images": images, "out": out}


def model_stats() -> dict[str, dict[str, int]]:
    from ray import serve

    return {
        name: serve.get_deployment_handle(name, app_name=APP).stats.remote().result(timeout_s=60)
        for name in ("PreviewGenerator", "PreviewClassifier")
    }


# =========================================================================== the build is varied enough
def test_fixture_benchmark_has_filtered_images_and_mixed_failure_points(tables):
    s, p = tables["samples"], tables["preds"]
    assert len(s) == 48 and not s["kept"].all() and s["kept"].any()
    assert 0 < len(tables["complete"]) < 8, "want complete and incomplete trajectories"
    two_way = p[p["classifier"] == "tiny-clip-2way"]
    assert two_way["correct"].any() and not two_way["correct"].all()


# =========================================================================== basics
def test_health_and_page_are_open_and_self_contained(client):
    r = client.get("/healthz", token=None)
    assert r.status == 200 and r.json() == {"status": "ok"}
    r = client.get("/", token=None)
    assert r.status == 200 and r.type == "text/html"
    html = r.body.decode()
    assert "<script>" in html and 'id="trajectories"' in html and 'id="preview-form"' in html
    # no external resources: no absolute URLs at all, a CSP that allows only this origin
    assert "http://" not in html and "https://" not in html and "//cdn" not in html
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'sha256-" in csp and "connect-src 'self'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"


def test_token_is_required_on_the_api(client, tables):
    sid = tables["samples"]["sample_id"].iloc[0]
    paths = [
        "/api/info",
        "/api/benchmarks/shifts",
        "/api/benchmarks/classes?shift=heavy_snow",
        "/api/benchmarks/trajectories?shift=heavy_snow&class_id=1",
        f"/api/benchmarks/image/{sid}",
        "/api/report",
        "/report/accuracy_drop.png",
        "/api/preview/strip.png?class=1&shift=heavy_snow&seed=1",
        "/api/openapi.json",
    ]
    for path in paths:
        for token in (None, "wrong-token", TOKEN + "x", TOKEN[:-1]):
            r = client.get(path, token=token)
            assert r.status == 401, (path, token, r.status)
            assert r.headers["www-authenticate"].startswith("Bearer")
        r = client.get(path, headers={"Authorization": f"Basic {TOKEN}"}, token=None)
        assert r.status == 401, path
    r = client.post_json("/api/preview", {"class": 1, "shift": "heavy_snow", "seed": 1}, token=None)
    assert r.status == 401
    assert client.get("/api/info").status == 200
    # the scheme is case-insensitive (RFC 7235)
    assert client.get("/api/info", headers={"Authorization": f"bearer {TOKEN}"}, token=None).status == 200


def test_only_loopback_host_headers_are_accepted(client):
    assert client.get("/healthz", headers={"Host": "evil.example:8000"}).status == 400
    assert client.get("/api/info", headers={"Host": "localhost"}).status == 200


def test_deployments_scale_independently(client, tables):
    from ray import serve

    from pipeline.config import StageResources
    from pipeline.serve.app import deployment_options

    status = serve.status().applications[APP]
    assert status.status == "RUNNING"
    assert {"Ingress", "PreviewGenerator", "PreviewClassifier"} <= set(status.deployments)
    opts = deployment_options(
        StageResources(num_gpus=0.5, num_cpus=2, pool_size=2, max_pool_size=5), max_ongoing_requests=1, max_queued_requests=8
    )
    assert opts["ray_actor_options"] == {"num_cpus": 2, "num_gpus": 0.5}
    assert opts["autoscaling_config"]["min_replicas"] == 2 and opts["autoscaling_config"]["max_replicas"] == 5
    fixed = deployment_options(StageResources(pool_size=3), max_ongoing_requests=1, max_queued_requests=8)
    assert fixed["autoscaling_config"]["min_replicas"] == fixed["autoscaling_config"]["max_replicas"] == 3


def test_info(client, tables):
    info = client.get("/api/info").json()
    cfg = tables["cfg"]
    assert info["benchmark"]["shifts"] == sorted(cfg.benchmark.shifts)
    assert info["benchmark"]["classifiers"] == [c.name for c in cfg.classifiers]
    assert info["benchmark"]["n_samples"] == 48 and info["benchmark"]["n_complete"] == len(tables["complete"])
    assert info["preview"]["scales"] == cfg.benchmark.scales
    assert info["preview"]["scale_bounds"] == [0.0, 2 * max(cfg.benchmark.scales)]
    assert info["preview"]["max_scales"] == 12 and info["same_config"] is True


# =========================================================================== benchmark browser
def test_shifts_and_classes_match_the_parquet(client, tables):
    s, complete = tables["samples"], tables["complete"]
    r = client.get("/api/benchmarks/shifts")
    assert r.status == 200 and r.type == "application/json"
    shifts = r.json()["shifts"]
    assert [x["shift"] for x in shifts] == sorted(s["shift"].unique())
    for x in shifts:
        tids = set(s.loc[s["shift"] == x["shift"], "trajectory_id"])
        assert x["n_trajectories"] == len(tids) and x["n_complete"] == len(tids & complete)
        classes = client.get(f"/api/benchmarks/classes?shift={x['shift']}").json()["classes"]
        sub = s[s["shift"] == x["shift"]]
        assert [c["class_id"] for c in classes] == sorted(sub["class_id"].unique())
        for c in classes:
            rows = sub[sub["class_id"] == c["class_id"]]
            assert c["class_name"] == rows["class_name"].iloc[0]
            assert c["n_trajectories"] == rows["trajectory_id"].nunique()
    every = client.get("/api/benchmarks/classes").json()["classes"]
    assert {c["class_id"]: c["n_trajectories"] for c in every} == {1: 4, 22: 4}


def test_trajectories_and_failure_points_match_the_parquet(client, tables):
    s, p, complete, cfg = tables["samples"], tables["preds"], tables["complete"], tables["cfg"]
    merged = p.merge(s[["sample_id", "trajectory_id", "scale", "kept"]], on="sample_id")
    api_fps: dict[tuple[str, str], list[float | None]] = {}  # (classifier, shift) -> failure points
    for (shift, class_id), rows in s.groupby(["shift", "class_id"]):
        r = client.get(f"/api/benchmarks/trajectories?shift={shift}&class_id={class_id}")
        assert r.status == 200 and r.type == "application/json"
        data = r.json()
        assert data["scales"] == cfg.benchmark.scales and data["classifiers"] == [c.name for c in cfg.classifiers]
        assert [t["trajectory_id"] for t in data["trajectories"]] == sorted(rows["trajectory_id"].unique())
        for t in data["trajectories"]:
            tid = t["trajectory_id"]
            trows = rows[rows["trajectory_id"] == tid].sort_values("scale")
            assert [x["scale"] for x in t["samples"]] == trows["scale"].tolist()  # ordered by scale
            assert [x["sample_id"] for x in t["samples"]] == trows["sample_id"].tolist()
            assert [x["kept"] for x in t["samples"]] == trows["kept"].tolist()
            assert t["complete"] == (tid in complete)
            for x in t["samples"]:
                assert x["image"] == f"api/benchmarks/image/{x['sample_id']}"
                for name, pred in x["predictions"].items():
                    row = merged[(merged["sample_id"] == x["sample_id"]) & (merged["classifier"] == name)].iloc[0]
                    assert pred["top1"] == row["top1"] and pred["correct"] == row["correct"]
                    assert pred["p_true"] == pytest.approx(row["p_true"])
                assert set(x["predictions"]) == set(data["classifiers"])
            if tid not in complete:
                assert t["failure_points"] is None
                continue
            for name in data["classifiers"]:
                m = merged[(merged["trajectory_id"] == tid) & (merged["classifier"] == name)]
                wrong = m.loc[~m["correct"], "scale"]
                expected = float(wrong.min()) if len(wrong) else None
                assert t["failure_points"][name] == expected, (tid, name)
                api_fps.setdefault((name, shift), []).append(expected)
    assert len({fp for fps in api_fps.values() for fp in fps}) >= 2, f"failure points all alike: {api_fps}"
    # the report's failure-point distribution counts exactly these failure points
    table = pd.read_csv(tables["out"] / "report" / "failure_points.csv")
    table = table[table["shift"] != "all"]
    assert len(table) == len(api_fps) * len(cfg.benchmark.scales)
    for r in table.itertuples(index=False):
        fps = api_fps[(r.classifier, r.shift)]
        assert r.fp_count == sum(fp == r.scale for fp in fps), r
        assert r.fp_ratio == pytest.approx(r.fp_count / len(fps))


def test_images_are_the_stored_bytes(client, tables):
    ids = tables["samples"]["sample_id"].tolist()
    for sid in ids[:12] + ids[-6:]:
        r = client.get(f"/api/benchmarks/image/{sid}")
        assert r.status == 200 and r.type == "image/png", sid
        assert r.body == tables["images"][sid]
        assert png(r.body).shape == (64, 64, 3)
    # percent-encoded separators name the same sample
    sid = ids[0]
    assert client.get("/api/benchmarks/image/" + sid.replace("/", "%2F")).body == tables["images"][sid]


def test_unknown_shift_and_class_are_404_with_choices(client, tables):
    r = client.get("/api/benchmarks/classes?shift=fog")
    assert r.status == 404 and r.json()["choices"] == ["heavy_snow", "painting_style"]
    r = client.get("/api/benchmarks/trajectories?shift=fog&class_id=1")
    assert r.status == 404 and r.json()["choices"] == ["heavy_snow", "painting_style"]
    r = client.get("/api/benchmarks/trajectories?shift=heavy_snow&class_id=7")
    assert r.status == 404 and [c["class_id"] for c in r.json()["choices"]] == [1, 22]
    assert client.get("/api/benchmarks/trajectories?shift=heavy_snow&class_id=abc").status == 422
    assert client.get("/api/benchmarks/trajectories?shift=heavy_snow").status == 422


@pytest.mark.parametrize(
    "path",
    [
        "/api/benchmarks/image/../../etc/passwd",
        "/api/benchmarks/image/..%2F..%2Fetc%2Fpasswd",
        "/api/benchmarks/image/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "/api/benchmarks/image/%252e%252e%252fetc%252fpasswd",
        "/api/benchmarks/image//etc/passwd",
        "/api/benchmarks/image/%2Fetc%2Fpasswd",
        "/api/benchmarks/image/heavy_snow/001/../../../config.json",
        "/api/benchmarks/image/heavy_snow/001/seed_0001_scale_0000/../../../../config.yaml",
        "/api/benchmarks/image/config.json",
        "/api/benchmarks/image/report/metrics.json",
        "/report/../config.json",
        "/report/..%2Fconfig.json",
        "/report/%2e%2e%2fconfig.yaml",
        "/report/..%5Cconfig.json",
        "/report/%2Fetc%2Fpasswd",
        "/report/missing.png",
    ],
)
def test_path_traversal_is_404(client, path):
    r = client.get(path)
    assert r.status == 404, (path, r.status, r.body[:200])
    assert b"root:" not in r.body and b"config_hash" not in r.body and b"benchmark" not in r.body


def test_tar_members_are_reachable_only_by_sample_id(client, tables):
    samples = tables["samples"]
    shard = samples["shard"].iloc[0]
    assert client.get(f"/api/benchmarks/image/{shard}").status == 404
    assert client.get(f"/api/benchmarks/image/{samples['sample_id'].iloc[0]}.png").status == 404
    assert client.get(f"/api/benchmarks/image/{samples['sample_id'].iloc[0]}.json").status == 404


def test_report(client, tables):
    out = tables["out"]
    r = client.get("/api/report")
    assert r.status == 200 and r.type == "application/json"
    assert r.json() == json.loads((out / "report" / "metrics.json").read_text())
    plots = sorted(p.name for p in (out / "report").glob("*.png"))
    assert {"accuracy_drop.png", "fp_cumulative.png", "fp_distribution.png"} <= set(plots)
    assert client.get("/api/info").json()["benchmark"]["report_files"] == sorted(p.name for p in (out / "report").iterdir())
    for name in plots:
        r = client.get(f"/report/{name}")
        assert r.status == 200 and r.type == "image/png" and r.body == (out / "report" / name).read_bytes()
        assert png(r.body).ndim == 3
    r = client.get("/report/accuracy.csv")
    assert r.status == 200 and r.type == "text/csv"
    r = client.get("/report/nope.png")
    assert r.status == 404 and "accuracy_drop.png" in r.json()["choices"]


# =========================================================================== live preview
def test_preview_matches_the_batch_pipeline(client, tables):
    s, p, cfg = tables["samples"], tables["preds"], tables["cfg"]
    names = [c.name for c in cfg.classifiers]
    thresholds = cfg.filter.thresholds
    # one complete and one incomplete trajectory, addressed by class name and by id
    picks = [min(tables["complete"]), min(set(s["trajectory_id"]) - tables["complete"])]
    for n, tid in enumerate(picks):
        rows = s[s["trajectory_id"] == tid].sort_values("scale")
        first = rows.iloc[0]
        ref = first["class_name"] if n == 0 else int(first["class_id"])
        body = {"class": ref, "shift": first["shift"], "seed": int(first["seed"])}
        r = client.post_json("/api/preview", body)
        assert r.status == 200 and r.type == "application/json", r.body[:300]
        data = r.json()
        assert data["trajectory_id"] == tid and data["scales"] == cfg.benchmark.scales
        assert data["classifiers"] == names
        assert [e["sample_id"] for e in data["images"]] == rows["sample_id"].tolist()
        assert data["complete"] == (tid in tables["complete"])
        for e, (_, row) in zip(data["images"], rows.iterrows()):
            assert e["image"].startswith("data:image/png;base64,")
            live = png(base64.b64decode(e["image"].split(",", 1)[1]))
            stored = png(tables["images"][row["sample_id"]])
            assert live.shape == stored.shape == (64, 64, 3)
            assert np.abs(live - stored).max() <= 2, row["sample_id"]
            for name in names:
                batch = p[(p["sample_id"] == row["sample_id"]) & (p["classifier"] == name)].iloc[0]
                assert e["predictions"][name]["top1"] == batch["top1"], (row["sample_id"], name)
                assert e["predictions"][name]["correct"] == batch["correct"]
                assert e["predictions"][name]["p_true"] == pytest.approx(batch["p_true"], abs=0.02)
            f = e["filter"]
            for col in ("clip_image", "dino_image"):
                assert f[col] == pytest.approx(row[col], abs=0.01)
            if abs(row["dino_image"] - thresholds.dino_image) > 1e-3:  # not on the edge of the threshold
                assert f["kept"] == row["kept"], row["sample_id"]
            assert f["n_pass"] == sum(
                f[c] is not None and f[c] > getattr(thresholds, c)
                for c in ("clip_text", "clip_shift_text", "clip_image", "dino_image")
            )
        # the preview's failure points follow the same definition as the benchmark's
        for name in names:
            wrong = [e["scale"] for e in data["images"] if not e["predictions"][name]["correct"]]
            assert data["failure_points"][name] == (min(wrong) if wrong else None)


def test_preview_custom_scales_and_strip(client, tables):
    r = client.post_json("/api/preview", {"class": 22, "shift": "painting_style", "seed": 12345, "scales": [3.0, 1.25]})
    assert r.status == 200, r.body[:300]
    data = r.json()
    assert data["scales"] == [0.0, 1.25, 3.0]  # scale 0, the filter's reference, is added; sorted
    assert data["images"][0]["sample_id"] == "painting_style/022/seed_12345_scale_0000"
    r = client.get("/api/preview/strip.png?class=bald%20eagle&shift=painting_style&seed=12345&scales=1.25,3")
    assert r.status == 200 and r.type == "image/png"
    strip = png(r.body)
    assert strip.shape == (64, 3 * 64 + 2 * 4, 3)
    first = png(base64.b64decode(data["images"][0]["image"].split(",", 1)[1]))
    assert np.array_equal(strip[:, :64], first)


def test_bad_preview_requests_never_reach_the_models(client, tables):
    before = model_stats()
    ok = {"class": 1, "shift": "heavy_snow", "seed": 1}

    r = client.post_json("/api/preview", {**ok, "class": "tench"})
    assert r.status == 404 and {c["class_name"] for c in r.json()["choices"]} == {"goldfish", "bald eagle"}
    r = client.post_json("/api/preview", {**ok, "class": "no such class"})
    assert r.status == 404 and len(r.json()["choices"]) == 2
    assert client.post_json("/api/preview", {**ok, "class": 0}).status == 404
    r = client.post_json("/api/preview", {**ok, "shift": "fog"})
    assert r.status == 404 and r.json()["choices"] == ["painting_style", "heavy_snow"]

    invalid = [
        {**ok, "seed": -1},
        {**ok, "seed": 2**31},
        {**ok, "seed": 1.5},
        {**ok, "seed": True},
        {**ok, "seed": "abc"},
        {**ok, "scales": [5.01]},
        {**ok, "scales": [-0.5]},
        {**ok, "scales": []},
        {**ok, "scales": [0.5, 0.5]},
        {**ok, "scales": [0.25 * i for i in range(1, 13)]},  # 12 + scale 0 = 13 > 12
        {**ok, "scales": "0,1"},
        {**ok, "scales": [True]},
        {**ok, "class": True},
        {**ok, "class": ""},
        {**ok, "extra": 1},
        {"shift": "heavy_snow", "seed": 1},
        [ok],
    ]
    for body in invalid:
        r = client.post_json("/api/preview", body)
        assert r.status == 422, (body, r.status, r.body[:200])
        assert isinstance(r.json()["detail"], list)
    for raw in (b'{"class": 1, "shift": "heavy_snow", "scales": [NaN]}', b'{"class": 1, "shift": "heavy_snow", "scales": [Infinity]}',
                b'{"class": 1, "shift": "heavy_snow", "scales": [1e400]}'):
        r = client.request("/api/preview", "POST", raw, {"Content-Type": "application/json"})
        assert r.status == 422, raw
    r = client.request("/api/preview", "POST", b"{not json", {"Content-Type": "application/json"})
    assert r.status == 400
    r = client.request("/api/preview", "POST", json.dumps(ok).encode(), {"Content-Type": "text/plain"})
    assert r.status == 415
    # 12 scales including 0 is the limit, and the maximum bound itself is allowed
    assert client.get("/api/preview/strip.png?class=1&shift=heavy_snow&seed=1&scales=0,abc").status == 422
    assert client.get("/api/preview/strip.png?class=1&shift=heavy_snow&seed=-3").status == 422
    assert client.get("/api/preview/strip.png?class=1&shift=heavy_snow&seed=1&bogus=1").status == 422
    assert client.get("/api/preview/strip.png?class=1&shift=fog&seed=1").status == 404

    # bodies over 16 KiB: declared (Content-Length) and undeclared (chunked)
    huge = json.dumps({**ok, "pad": "x" * 20000}).encode()
    assert client.request("/api/preview", "POST", huge, {"Content-Type": "application/json"}).status == 413
    host, port = client.url.split("//", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request(
        "POST",
        "/api/preview",
        body=iter([huge[i : i + 4096] for i in range(0, len(huge), 4096)]),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
        encode_chunked=True,
    )
    resp = conn.getresponse()
    assert resp.status == 413 and b"larger than" in resp.read()
    conn.close()

    assert model_stats() == before, "a rejected request reached a model deployment"


# =========================================================================== builder, CLI
def test_build_app_rejects_bad_args(tmp_path):
    from pipeline.config import ConfigError
    from pipeline.serve.app import build_app

    with pytest.raises(ConfigError, match="--config CONFIG"):
        build_app({})
    with pytest.raises(ConfigError, match="bogus"):
        build_app({"output": str(tmp_path), "bogus": 1})
    with pytest.raises(FileNotFoundError, match="not a directory"):
        build_app({"output": str(tmp_path / "missing")})
    with pytest.raises(FileNotFoundError, match="config.json"):
        build_app({"output": str(tmp_path)})
    with pytest.raises(ConfigError, match="config file not found"):
        build_app({"config": str(tmp_path / "missing.yaml")})

    def no_sliders(raw: dict[str, Any]) -> None:
        raw["generator"]["slider_store"] = str(tmp_path / "no-sliders")

    with pytest.raises(FileNotFoundError, match="no-sliders"):  # checked before any replica starts
        build_app({"config": str(tiny_config(tmp_path, no_sliders))})


def test_index_picks_up_shards_committed_later(tables, tmp_path):
    """A build still running: shards committed after the server started appear after refresh_s."""
    import shutil
    import time

    from pipeline.serve.app import BenchmarkIndex

    out = tmp_path / "out"
    shutil.copytree(tables["out"], out)
    manifests = sorted((out / "manifest").glob("*.json"))
    held = tmp_path / "held"
    held.mkdir()
    for m in manifests[1:]:
        shutil.move(str(m), held / m.name)  # as if only the first shard were committed yet
    index = BenchmarkIndex(str(out), refresh_s=0.05)
    first = index.info()["n_samples"]
    assert 0 < first < 48
    for m in held.iterdir():
        shutil.move(str(m), out / "manifest" / m.name)
    time.sleep(0.1)
    assert index.info()["n_samples"] == 48
    sid = tables["samples"]["sample_id"].iloc[-1]
    assert index.image(sid)[0] == tables["images"][sid]


def test_cli_registration():
    from pipeline.serve.app import add_cli

    parser = argparse.ArgumentParser()
    add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--output", "runs/demo"])
    assert (args.host, args.port, args.config, args.token) == ("127.0.0.1", 8000, None, None)
    assert callable(args.func)
    args = parser.parse_args(["serve", "--config", "c.yaml", "--host", "0.0.0.0", "--port", "9000", "--token", "t"])
    assert (args.host, args.port, args.config, args.token) == ("0.0.0.0", 9000, "c.yaml", "t")


def test_serve_config_files_name_the_app_args():
    import yaml
    from ray.serve.schema import ServeDeploySchema

    from pipeline.serve.app import ServeOptions

    repo = Path(__file__).resolve().parents[1]
    serve_yaml = yaml.safe_load((repo / "deploy" / "serve.yaml").read_text())
    svc = yaml.safe_load((repo / "deploy" / "kuberay" / "rayservice.yaml").read_text())
    for doc in (serve_yaml, yaml.safe_load(svc["spec"]["serveConfigV2"])):
        parsed = ServeDeploySchema.model_validate(doc)
        (app,) = parsed.applications
        assert app.import_path == "pipeline.serve.app:build_app"
        opts = ServeOptions.model_validate(app.args)
        assert opts.config and opts.output and opts.token is None  # tokens come from the environment
