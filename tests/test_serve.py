"""The Serve app (pipeline.serve) over HTTP, against a tiny benchmark built here.

One tiny build (a variant of configs/tiny.yaml whose filter removes some images and with
a fourth, two-way zero-shot classifier, so that kept flags and failure points vary) and
one in-process ingress app with a token serve the tests: Starlette's test client talks
to the ASGI app, whose model deployments are plain objects of this process (no Ray).
Responses are checked against the build's own Parquet and tar files, and the live
preview against the batch pipeline's predictions for the same (class, shift, seed).
One slow test starts the real Ray Serve application and checks it end to end.

The helpers (``serve_config``, ``build_benchmark``, ``local_ingress``, ``http_server``,
``read_dir``) are shared with ``test_serve_browser.py``; the build lives in the session's
base temporary directory so a second module only resumes it (a no-op).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import io
import json
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from buildproc import shared_build, tiny_config
from PIL import Image

from pipeline.config import load_config
from pipeline.io.webdataset import iter_tar

TOKEN = "test-token-0123456789abcdef"
APP = "cnsbench"
LOOPBACK = ["127.0.0.1", "localhost", "[::1]"]
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

    return tiny_config(directory, mutate, name="serve-demo.yaml", plots=True)


def build_benchmark(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(config, output) of the test benchmark, built in process once per test run and shared
    read-only by the test workers."""
    return shared_build(tmp_path_factory, "serve-benchmark", serve_config)


def local_ingress(cfg_path: Path | None, out: Path | None, token: str | None, **options: Any):
    """The app's ingress with its models in this process, as ``cnsbench serve`` on 127.0.0.1 sets it up."""
    from pipeline.serve.deployments import in_process_ingress

    return in_process_ingress(
        {
            "config": str(cfg_path) if cfg_path else None,
            "output": str(out) if out else None,
            "token": token,
            "allowed_hosts": LOOPBACK,
            **options,
        }
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def http_server(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a thread on 127.0.0.1; yields its URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def read_dir(out: Path, kind: str) -> pd.DataFrame:
    return pd.concat([pq.read_table(p).to_pandas() for p in sorted((out / kind).glob("*.parquet"))], ignore_index=True)


def png(data: bytes) -> np.ndarray:
    img = Image.open(io.BytesIO(data))
    img.load()
    return np.asarray(img.convert("RGB"), dtype=np.int16)


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
    """Starlette's test client on the ASGI app, with the bearer token by default."""

    def __init__(self, app: Any, token: str | None) -> None:
        from starlette.testclient import TestClient

        self.app = app
        self.http = TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False)
        self.token = token

    def _headers(self, headers: dict[str, str] | None, token: str | None | bool) -> dict[str, str]:
        h = dict(headers or {})
        tok = self.token if token is True else token
        if tok:
            h["Authorization"] = f"Bearer {tok}"
        return h

    def request(
        self,
        path: str,
        method: str = "GET",
        body: Any = None,
        headers: dict[str, str] | None = None,
        token: str | None | bool = True,
    ) -> Reply:
        r = self.http.request(method, path, content=body, headers=self._headers(headers, token))
        return Reply(r.status_code, r.headers, r.content)

    def get(self, path: str, **kw: Any) -> Reply:
        return self.request(path, **kw)

    def post_json(self, path: str, data: Any, **kw: Any) -> Reply:
        return self.request(path, "POST", json.dumps(data).encode(), {"Content-Type": "application/json"}, **kw)

    def raw_get(self, raw_path: str, token: str | None | bool = True) -> Reply:
        """GET with the path exactly as given, as an HTTP server passes it on (no '..' removal).

        HTTP clients normalise dot segments before sending; a hostile one need not.
        """
        raw = raw_path.encode()
        path = raw_path.split("?", 1)[0]
        headers = [(b"host", b"127.0.0.1")] + [(k.lower().encode(), v.encode()) for k, v in self._headers(None, token).items()]
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
            "path": unquote(path), "raw_path": raw.split(b"?", 1)[0], "query_string": b"", "root_path": "",
            "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
        }  # fmt: skip
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        asyncio.run(self.app(scope, receive, send))
        start = next(m for m in sent if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return Reply(start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body)


# =========================================================================== fixtures
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_benchmark(tmp_path_factory)


@pytest.fixture(scope="module")
def ingress(built):
    cfg_path, out = built
    return local_ingress(cfg_path, out, TOKEN)


@pytest.fixture(scope="module")
def client(ingress) -> Client:
    return Client(ingress.__serve_build_asgi_app__(), TOKEN)


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


def model_stats(ingress: Any) -> dict[str, dict[str, int]]:
    return {
        "PreviewGenerator": ingress.preview.generator.target.stats(),
        "PreviewClassifier": ingress.preview.classifier.target.stats(),
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
    assert 'id="trajectories"' in html and 'id="preview-form"' in html
    # no external resources: no absolute URLs at all, a CSP that allows only this origin
    assert "http://" not in html and "https://" not in html and "//cdn" not in html
    assert "<link" not in html and "src=" not in html.split("<script>", 1)[0]
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    # the static files are inlined, and the CSP pins exactly the script that is there
    static = Path(__file__).resolve().parents[1] / "pipeline" / "serve" / "static"
    scripts = re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    assert scripts == [(static / "app.js").read_text()]
    assert (static / "app.css").read_text() in html
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp


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


def test_deployment_options_follow_the_stage_resources():
    from pipeline.config import StageResources
    from pipeline.serve import deployment_options

    opts = deployment_options(
        StageResources(num_gpus=0.5, num_cpus=2, pool_size=2, max_pool_size=5), max_ongoing_requests=1, max_queued_requests=8
    )
    assert opts["ray_actor_options"] == {"num_cpus": 2, "num_gpus": 0.5}
    assert opts["autoscaling_config"]["min_replicas"] == 2 and opts["autoscaling_config"]["max_replicas"] == 5
    assert (opts["max_ongoing_requests"], opts["max_queued_requests"]) == (1, 8)
    fixed = deployment_options(StageResources(pool_size=3), max_ongoing_requests=1, max_queued_requests=8)
    assert fixed["autoscaling_config"]["min_replicas"] == fixed["autoscaling_config"]["max_replicas"] == 3


def test_info(client, tables):
    info = client.get("/api/info").json()
    cfg = tables["cfg"]
    assert info["app"] == APP
    assert info["benchmark"]["shifts"] == sorted(cfg.benchmark.shifts)
    assert info["benchmark"]["classifiers"] == [c.name for c in cfg.classifiers]
    assert info["benchmark"]["n_samples"] == 48 and info["benchmark"]["n_complete"] == len(tables["complete"])
    assert info["benchmark"]["skipped_manifests"] == []
    assert info["preview"]["scales"] == cfg.benchmark.scales
    assert info["preview"]["shifts"] == cfg.benchmark.shifts
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
    assert client.get("/api/benchmarks/trajectories?shift=heavy_snow&class_id=" + "9" * 400).status == 422
    assert client.get("/api/benchmarks/classes?shift=" + "x" * 101).status == 422


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
    r = client.raw_get(path)
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


def test_preview_custom_scales_and_strip(client, ingress, tables):
    r = client.post_json("/api/preview", {"class": 22, "shift": "painting_style", "seed": 12345, "scales": [3.0, 1.25]})
    assert r.status == 200, r.body[:300]
    data = r.json()
    assert data["scales"] == [0.0, 1.25, 3.0]  # scale 0, the filter's reference, is added; sorted
    assert data["images"][0]["sample_id"] == "painting_style/022/seed_12345_scale_0000"
    before = model_stats(ingress)
    r = client.get("/api/preview/strip.png?class=bald%20eagle&shift=painting_style&seed=12345&scales=1.25,3")
    assert r.status == 200 and r.type == "image/png"
    assert model_stats(ingress) == before, "the strip of a trajectory just previewed comes from the cache"
    strip = png(r.body)
    assert strip.shape == (64, 3 * 64 + 2 * 4, 3)
    first = png(base64.b64decode(data["images"][0]["image"].split(",", 1)[1]))
    assert np.array_equal(strip[:, :64], first)


def test_bad_preview_requests_never_reach_the_models(client, ingress, tables):
    before = model_stats(ingress)
    ok = {"class": 1, "shift": "heavy_snow", "seed": 1}

    r = client.post_json("/api/preview", {**ok, "class": "tench"})
    assert r.status == 404 and {c["class_name"] for c in r.json()["choices"]} == {"goldfish", "bald eagle"}
    r = client.post_json("/api/preview", {**ok, "class": "no such class"})
    assert r.status == 404 and len(r.json()["choices"]) == 2
    assert client.post_json("/api/preview", {**ok, "class": 0}).status == 404
    assert client.post_json("/api/preview", {**ok, "class": 10**40}).status == 404
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
        # Not JSON (RFC 8259 has no NaN/Infinity): 400 from the strict parser; 1e400: 422 (not finite)
        assert r.status in (400, 422), raw
    r = client.request("/api/preview", "POST", b"{not json", {"Content-Type": "application/json"})
    assert r.status == 400
    r = client.request("/api/preview", "POST", json.dumps(ok).encode(), {"Content-Type": "text/plain"})
    assert r.status == 415
    assert client.get("/api/preview/strip.png?class=1&shift=heavy_snow&seed=1&scales=0,abc").status == 422
    assert client.get("/api/preview/strip.png?class=1&shift=heavy_snow&seed=-3").status == 422
    assert client.get("/api/preview/strip.png?class=1&shift=heavy_snow&seed=1&bogus=1").status == 422
    assert client.get("/api/preview/strip.png?class=1&shift=fog&seed=1").status == 404

    # bodies over 16 KiB: declared (Content-Length) and undeclared (chunked)
    huge = json.dumps({**ok, "pad": "x" * 20000}).encode()
    assert client.request("/api/preview", "POST", huge, {"Content-Type": "application/json"}).status == 413
    chunks = iter([huge[i : i + 4096] for i in range(0, len(huge), 4096)])
    r = client.request("/api/preview", "POST", chunks, {"Content-Type": "application/json"})
    assert r.status == 413 and b"larger than" in r.body

    assert model_stats(ingress) == before, "a rejected request reached a model deployment"


def _nested(depth: int, leaf: str = "1") -> bytes:
    return ("[" * depth + leaf + "]" * depth).encode()


@pytest.mark.parametrize(
    "raw",
    [
        # wrong JSON types, field by field and for the whole body
        b'"a string"', b"42", b"null", b"true", b"[]", b'[{"class": 1}]',
        b'{"class": [1], "shift": "heavy_snow"}', b'{"class": {"id": 1}, "shift": "heavy_snow"}',
        b'{"class": 1.5, "shift": "heavy_snow"}', b'{"class": null, "shift": "heavy_snow"}',
        b'{"class": 1, "shift": 7}', b'{"class": 1, "shift": ["heavy_snow"]}', b'{"class": 1, "shift": null}',
        b'{"class": 1, "shift": {"name": "heavy_snow"}}', b'{"class": 1, "shift": ""}',
        b'{"class": 1, "shift": "heavy_snow", "seed": null}', b'{"class": 1, "shift": "heavy_snow", "seed": [1]}',
        b'{"class": 1, "shift": "heavy_snow", "seed": {"v": 1}}', b'{"class": 1, "shift": "heavy_snow", "seed": "1e3"}',
        b'{"class": 1, "shift": "heavy_snow", "scales": {"0": 1}}', b'{"class": 1, "shift": "heavy_snow", "scales": ["a"]}',
        b'{"class": 1, "shift": "heavy_snow", "scales": [[0.5]]}', b'{"class": 1, "shift": "heavy_snow", "scales": [null]}',
        b'{"class": 1, "shift": "heavy_snow", "scales": 1}', b'{"class": "1" , "shift": "heavy_snow", "seed": 1, "class": []}',
        b'{"class": 1, "shift": "heavy_snow", "seed": 1' + b"0" * 5000 + b"}",  # an integer beyond Python's digit limit
        # deeply nested JSON: the whole body, and inside each field
        _nested(5000), ("{\"a\": " * 2000 + "1" + "}" * 2000).encode(),
        b'{"class": ' + _nested(800) + b', "shift": "heavy_snow"}',
        b'{"class": 1, "shift": "heavy_snow", "scales": ' + _nested(900, "0.5") + b"}",
        b'{"class": 1, "shift": "heavy_snow", "seed": ' + _nested(3000) + b"}",
        # not JSON at all
        b"", b"\xff\xfe\x00", b'{"class": 1,}', b"{'class': 1}", b"\x00" * 64,
    ],
)  # fmt: skip
def test_malformed_preview_bodies_are_client_errors(client, ingress, raw):
    before = model_stats(ingress)
    r = client.request("/api/preview", "POST", raw, {"Content-Type": "application/json"})
    assert r.status in (400, 422), (raw[:80], r.status, r.body[:300])
    assert isinstance(r.json()["detail"], (str, list))
    assert model_stats(ingress) == before


# =========================================================================== index robustness
def _copy_output(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_corrupt_manifests_are_skipped_and_reported(tables, tmp_path):
    """One unreadable manifest (or shard file) leaves the rest of the output browsable."""
    from pipeline.serve.deployments import in_process_api

    out = _copy_output(tables["out"], tmp_path / "out")
    manifests = sorted((out / "manifest").glob("*.json"))
    assert len(manifests) == 4
    bad = {
        manifests[0].name: b"\x00{not json",  # garbage
        manifests[1].name: b'["a", "list"]',  # JSON of the wrong shape
    }
    for name, data in bad.items():
        (out / "manifest" / name).write_bytes(data)
    # a well-formed manifest whose samples file is corrupt
    third = json.loads(manifests[2].read_text())
    samples_rel = next(f for f in third["files"] if f.startswith("samples/"))
    (out / samples_rel).write_bytes(b"PAR1 but not really")
    lost_shards = {m.stem for m in manifests[:3]}

    client = Client(in_process_api({"output": str(out), "token": TOKEN}), TOKEN)
    info = client.get("/api/info").json()["benchmark"]
    skipped = {s["file"]: s["reason"] for s in info["skipped_manifests"]}
    assert set(skipped) == {f"manifest/{m.name}" for m in manifests[:3]}
    assert "malformed manifest" in skipped[f"manifest/{manifests[0].name}"]
    assert "malformed manifest" in skipped[f"manifest/{manifests[1].name}"]
    assert samples_rel in skipped[f"manifest/{manifests[2].name}"]
    assert str(tmp_path) not in json.dumps(info), "reasons name files relative to the output"

    s = tables["samples"]
    kept_rows = s[~s["shard"].map(lambda rel: Path(rel).stem).isin(lost_shards)]
    assert 0 < info["n_samples"] == len(kept_rows) < 48
    shifts = client.get("/api/benchmarks/shifts").json()["shifts"]
    assert sum(x["n_trajectories"] for x in shifts) == kept_rows["trajectory_id"].nunique()
    for shift, class_id in kept_rows[["shift", "class_id"]].drop_duplicates().itertuples(index=False):
        r = client.get(f"/api/benchmarks/trajectories?shift={shift}&class_id={class_id}")
        assert r.status == 200
    sid = kept_rows["sample_id"].iloc[0]
    r = client.get(f"/api/benchmarks/image/{sid}")
    assert r.status == 200 and r.body == tables["images"][sid]
    lost = s.loc[~s["sample_id"].isin(kept_rows["sample_id"]), "sample_id"].iloc[0]
    assert client.get(f"/api/benchmarks/image/{lost}").status == 404


def test_every_manifest_corrupt_still_serves(tables, tmp_path):
    from pipeline.serve.deployments import in_process_api

    out = _copy_output(tables["out"], tmp_path / "out")
    for m in (out / "manifest").glob("*.json"):
        m.write_text("{")
    client = Client(in_process_api({"output": str(out)}), None)
    info = client.get("/api/info").json()["benchmark"]
    assert info["n_samples"] == 0 and len(info["skipped_manifests"]) == 4
    assert client.get("/api/benchmarks/shifts").json()["shifts"] == []
    assert client.get("/api/benchmarks/classes?shift=heavy_snow").status == 404


def test_index_picks_up_shards_committed_later(tables, tmp_path):
    """A build still running: shards committed after the server started appear after refresh_s."""
    from pipeline.serve import BenchmarkIndex

    out = _copy_output(tables["out"], tmp_path / "out")
    manifests = sorted((out / "manifest").glob("*.json"))
    held = tmp_path / "held"
    held.mkdir()
    for m in manifests[1:]:
        shutil.move(str(m), held / m.name)  # as if only the first shard were committed yet
    index = BenchmarkIndex(str(out), refresh_s=0.05)
    first = index.info()["n_samples"]
    assert 0 < first < 48
    # a shard committed with a corrupt manifest is reported, not fatal
    (out / "manifest" / manifests[1].name).write_text("not json")
    time.sleep(0.1)
    info = index.info()
    assert info["n_samples"] == first and [s["file"] for s in info["skipped_manifests"]] == [f"manifest/{manifests[1].name}"]
    for m in held.iterdir():
        shutil.move(str(m), out / "manifest" / m.name)
    time.sleep(0.1)
    info = index.info()
    assert info["n_samples"] == 48 and info["skipped_manifests"] == []
    sid = tables["samples"]["sample_id"].iloc[-1]
    assert index.image(sid)[0] == tables["images"][sid]


# =========================================================================== builder, CLI, package
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


def test_cli_registration():
    from pipeline.cli.serve import register as add_cli

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

    from pipeline.serve import ServeOptions

    repo = Path(__file__).resolve().parents[1]
    serve_yaml = yaml.safe_load((repo / "deploy" / "serve.yaml").read_text())
    svc = yaml.safe_load((repo / "deploy" / "kuberay" / "rayservice.yaml").read_text())
    for doc in (serve_yaml, yaml.safe_load(svc["spec"]["serveConfigV2"])):
        parsed = ServeDeploySchema.model_validate(doc)
        (app,) = parsed.applications
        assert app.import_path == "pipeline.serve.app:build_app"
        opts = ServeOptions.model_validate(app.args)
        assert opts.config and opts.output and opts.token is None  # tokens come from the environment


def test_serve_package_modules_stay_small_and_ray_free():
    import subprocess
    import sys

    pkg = Path(__file__).resolve().parents[1] / "pipeline" / "serve"
    sizes = {p.name: len(p.read_text().splitlines()) for p in pkg.glob("*.py")}
    assert {"options.py", "preview.py", "index.py", "api.py", "deployments.py", "launch.py"} <= set(sizes)
    assert max(sizes.values()) <= 420, sizes
    code = "import sys, pipeline.serve.app; print(sorted(m for m in ('ray', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# =========================================================================== the real thing
@pytest.mark.slow
def test_live_ray_serve_smoke(built, tables, ray_session):
    """The application on Ray Serve: three deployments, token, Host guard, browse and preview over HTTP."""
    import urllib.error
    import urllib.request

    from ray import serve

    from pipeline.serve import run_server

    cfg_path, out = built
    try:
        url = run_server(
            str(cfg_path), str(out), host="127.0.0.1", port=free_port(), token=TOKEN, blocking=False, echo=lambda *_: None
        )

        def call(path: str, data: bytes | None = None, token: str | None = TOKEN, host: str | None = None) -> Reply:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            if data is not None:
                headers["Content-Type"] = "application/json"
            if host:
                headers["Host"] = host
            req = urllib.request.Request(url.rstrip("/") + path, data=data, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=300) as r:
                    return Reply(r.status, r.headers, r.read())
            except urllib.error.HTTPError as err:
                return Reply(err.code, err.headers, err.read())

        status = serve.status().applications[APP]
        assert status.status == "RUNNING"
        assert {"Ingress", "PreviewGenerator", "PreviewClassifier"} <= set(status.deployments)
        assert call("/healthz", token=None).json() == {"status": "ok"}
        assert call("/api/info", token=None).status == 401
        assert call("/healthz", host="evil.example:8000").status == 400
        info = call("/api/info").json()
        assert info["benchmark"]["n_samples"] == 48 and info["same_config"] is True
        sid = tables["samples"]["sample_id"].iloc[0]
        assert call(f"/api/benchmarks/image/{sid}").body == tables["images"][sid]

        def stats() -> dict[str, Any]:
            return {
                name: serve.get_deployment_handle(name, app_name=APP).stats.remote().result(timeout_s=60)
                for name in ("PreviewGenerator", "PreviewClassifier")
            }

        before = stats()
        assert call("/api/preview", b'{"class": 1, "shift": "heavy_snow", "seed": [1]}').status == 422
        r = call("/api/preview", json.dumps({"class": 1, "shift": "heavy_snow", "seed": 777, "scales": [1.0]}).encode())
        assert r.status == 200, r.body[:300]
        data = r.json()
        assert [e["sample_id"] for e in data["images"]] == [f"heavy_snow/001/seed_0777_scale_{t}" for t in ("0000", "1000")]
        assert png(base64.b64decode(data["images"][1]["image"].split(",", 1)[1])).shape == (64, 64, 3)
        after = stats()
        assert after["PreviewGenerator"]["calls"] == before["PreviewGenerator"]["calls"] + 1
        assert after["PreviewClassifier"]["images"] == before["PreviewClassifier"]["images"] + 2
    finally:
        serve.shutdown()
