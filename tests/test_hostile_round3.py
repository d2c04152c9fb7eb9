"""Third round of hostile inputs (issue 43): object-storage credentials and closed endpoints,
hub ids that are neither ids nor paths, review decisions from several processes, serve while
its output is rebuilt, `status` of an evaluate output, oversized request headers, and strict
JSON in every file a report writes (degenerate outputs included)."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile import manifest_paths, synthetic_output, tiny_cfg_path

from pipeline.cli import main

REPO = Path(__file__).resolve().parents[1]
BUCKET = "cnsbench-round3"


# --------------------------------------------------------------------------- 1. S3 credentials
@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from s3server import s3_environment

    with s3_environment(BUCKET) as server:
        yield server


@pytest.fixture
def no_credentials(s3, tmp_path, monkeypatch):
    """Empty keys, no profile files, no instance metadata: nothing to sign with."""
    from s3server import clear_s3_clients

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        monkeypatch.delenv(key, raising=False)
    clear_s3_clients()
    yield
    clear_s3_clients()


def one_line_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("command", ["status", "build", "serve"])
def test_missing_s3_credentials_are_one_line_naming_the_url_and_the_variables(command, no_credentials, tmp_path, capsys):
    uri = f"s3://{BUCKET}/out"
    if command == "build":
        argv = ["build", str(tiny_cfg_path(tmp_path)), "--output", uri, "--runner", "local"]
    else:
        argv = {"status": ["status", uri], "serve": ["serve", "--output", uri]}[command]
    capsys.readouterr()  # only what the command itself prints
    assert main(argv) == 2
    line = one_line_error(capsys.readouterr().err)
    assert uri in line and "AWS_ACCESS_KEY_ID" in line and "AWS_SECRET_ACCESS_KEY" in line
    assert "AWS_EC2_METADATA_DISABLED" in line  # the instance metadata was not asked, and it says why


def test_contract_status_without_credentials_exits_2_with_one_line(s3, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ENDPOINT_URL=s3.url, AWS_ACCESS_KEY_ID="", AWS_SECRET_ACCESS_KEY="", AWS_EC2_METADATA_DISABLED="true",
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
        PYTHONPATH=str(REPO),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "status", "s3://bucket/out"], env=env, capture_output=True, text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "s3://bucket/out" in one_line_error(proc.stderr)


def test_wrong_s3_credentials_name_the_url_and_where_the_keys_came_from(s3, monkeypatch, capsys):
    import moto.settings

    from s3server import clear_s3_clients

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # the server now checks signatures
    clear_s3_clients()
    try:
        assert main(["status", f"s3://{BUCKET}/out"]) == 2
    finally:
        clear_s3_clients()
    line = one_line_error(capsys.readouterr().err)
    assert f"s3://{BUCKET}/out" in line and "AWS_ACCESS_KEY_ID" in line and "denied" in line


def test_a_closed_endpoint_fails_within_15_seconds(s3, monkeypatch, capsys):
    from s3server import clear_s3_clients, free_port

    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    clear_s3_clients()
    start = time.monotonic()
    try:
        code = main(["status", f"s3://{BUCKET}/out"])
    finally:
        clear_s3_clients()
    assert time.monotonic() - start < 15
    assert code == 2
    line = one_line_error(capsys.readouterr().err)
    assert endpoint in line and f"s3://{BUCKET}/out" in line and "AWS_ENDPOINT_URL" in line


# --------------------------------------------------------------------------- 2. hub ids
VLM = "classifiers[0]={{name: v, kind: vlm, model: '{model}', protocol: {{kind: open}}}}"


@pytest.mark.parametrize("model", ["../../x/y", "org/../evil", "a/b/c", "org/--x", "/nowhere/at/all"])
@pytest.mark.parametrize("command", ["validate", "prefetch"])
def test_a_model_that_is_neither_a_hub_id_nor_a_path_is_an_error(command, model, tmp_path, capsys):
    tiny_cfg_path(tmp_path)  # the tiny assets exist
    capsys.readouterr()
    assert main([command, str(REPO / "configs" / "tiny.yaml"), "--set", VLM.format(model=model)]) == 2
    out = capsys.readouterr()
    text = out.out + out.err
    assert "classifiers[0].model" in text and "cached" not in text.replace("not cached", "")


@pytest.mark.integration  # refused after the output's claim, inside the build
def test_build_refuses_a_model_that_is_neither_a_hub_id_nor_a_path(tmp_path, capsys):
    cfg = tiny_cfg_path(tmp_path)
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["build", str(cfg), "--output", str(out), "--runner", "local", "--set", VLM.format(model="org/../evil")]) == 2
    assert "classifiers[0].model" in capsys.readouterr().err
    assert not (out / "images").exists()


def test_hub_ids_and_local_paths_are_still_accepted(tmp_path):
    from pipeline.assets.hub import model_ref_problem

    (tmp_path / "weights").mkdir()
    assert model_ref_problem("llava-hf/llava-1.5-7b-hf", "k") is None
    assert model_ref_problem("gpt2", "k") is None
    assert model_ref_problem(str(tmp_path / "weights"), "k") is None
    assert "k" in model_ref_problem("org/../evil", "k")


# --------------------------------------------------------------------------- 4. review writers
SET_ROWS = 24


@pytest.fixture
def review_output(tmp_path) -> Path:
    import pandas as pd

    out = tmp_path / "out"
    synthetic_output(out, tiny_cfg_path(tmp_path))
    samples = pd.read_parquet(out / "samples").sort_values("sample_id").head(SET_ROWS)
    assert len(samples) == SET_ROWS
    (out / "report").mkdir()
    samples[["sample_id", "class_id", "class_name", "shift", "seed"]].to_parquet(out / "report" / "hard_set.parquet")
    return out


def _decide_one_by_one(out: str, ids: list[str], start) -> None:
    from pipeline.io.store import OutputStore
    from pipeline.serve.review import Review

    write = OutputStore.write_bytes

    def slow_write(self, rel, data):  # a slow store: every write of a review file takes 30 ms
        if rel.startswith("review/"):
            time.sleep(0.03)
        return write(self, rel, data)

    OutputStore.write_bytes = slow_write
    start.wait()
    r = Review(out)
    for sid in ids:
        r.decide("hard_set", {sid: "reject"})


def test_review_decisions_of_two_processes_are_all_kept(review_output):
    from pipeline.serve.review import Review

    ids = Review(str(review_output)).table("hard_set")["sample_id"].tolist()
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    procs = [ctx.Process(target=_decide_one_by_one, args=(str(review_output), ids[k::2], start)) for k in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    again = Review(str(review_output))
    assert sorted(again.decisions("hard_set")) == sorted(ids)
    assert again.progress("hard_set")["reject"] == SET_ROWS


def test_review_undo_and_redecide_merge_by_time(review_output):
    from pipeline.serve.review import Review

    a, b = Review(str(review_output)), Review(str(review_output))
    ids = a.table("hard_set")["sample_id"].tolist()
    a.decide("hard_set", {ids[0]: "accept", ids[1]: "reject"})
    b.decide("hard_set", {ids[0]: None, ids[2]: "not_class"})  # an undo by another reviewer
    a.decide("hard_set", {ids[1]: "accept"})
    got = {k: v["decision"] for k, v in Review(str(review_output)).decisions("hard_set").items()}
    assert got == {ids[1]: "accept", ids[2]: "not_class"}
    doc = json.loads((review_output / "review" / "hard_set.json").read_text())
    assert {k: v["decision"] for k, v in doc["decisions"].items()} == got


# --------------------------------------------------------------------------- 5. serve during --new-version
def test_serve_while_the_output_is_replaced_answers_503_then_404(tmp_path):
    from starlette.testclient import TestClient

    from pipeline.output_run import archive_previous
    from pipeline.io.store import OutputStore
    from pipeline.serve.deployments import in_process_api

    out = tmp_path / "out"
    synthetic_output(out, tiny_cfg_path(tmp_path))
    app = in_process_api({"output": str(out), "allowed_hosts": ["testserver"], "refresh_s": 0.2})
    client = TestClient(app, raise_server_exceptions=False)
    (out / "report").mkdir()
    (out / "report" / "metrics.json").write_text("{}")
    (out / "report" / "summary.csv").write_text("a,b\n1,2\n")
    time.sleep(0.3)
    traj = client.get("/api/benchmarks/trajectories", params={"shift": "heavy_snow", "class_id": 1}).json()
    old = traj["trajectories"][0]["samples"][0]["image"]
    assert client.get(f"/{old}").status_code == 200
    report = [n for n in client.get("/api/info").json()["benchmark"]["report_files"] if n.endswith(".csv")]
    assert client.get(f"/report/{report[0]}").status_code == 200

    # `build --new-version`: the old build moves under previous/, the new one is not there yet.
    archive_previous(OutputStore(str(out)))
    for _ in range(3):
        for path in (f"/{old}", f"/report/{report[0]}", "/api/report"):
            r = client.get(path)
            assert r.status_code == 503, (path, r.status_code, r.text)
            assert "being replaced" in r.json()["detail"] and r.headers.get("retry-after")
        time.sleep(0.25)

    # The new version (other seeds: other sample ids) is committed: what is gone is 404.
    other = tiny_cfg_path(tmp_path, lambda raw: raw["benchmark"].update(seeds=[5, 6]), name="other.yaml")
    synthetic_output(out, other)
    time.sleep(0.3)
    r = client.get(f"/{old}")
    assert r.status_code == 404 and r.json()["detail"]
    traj = client.get("/api/benchmarks/trajectories", params={"shift": "heavy_snow", "class_id": 1}).json()
    assert {t["seed"] for t in traj["trajectories"]} == {5, 6}
    assert client.get("/" + traj["trajectories"][0]["samples"][0]["image"]).status_code == 200


# --------------------------------------------------------------------------- 7. status of an evaluate output
def test_status_of_an_evaluate_output_counts_its_own_plan_and_names_evaluate(tmp_path, capsys):
    out = tmp_path / "out"
    synthetic_output(out, tiny_cfg_path(tmp_path))  # 8 trajectories of 6 images, 2 per shard
    # An evaluation of a source of 6 trajectories (36 images): its own plan, not the config's product.
    source = {"kind": "folders", "location": str(tmp_path / "images"), "trajectories": 6, "images": 36, "classes": 2,
              "shifts": ["heavy_snow", "painting_style"], "scales": [0.0], "image_format": "png", "notes": []}
    (out / "source.json").write_text(json.dumps(source))
    first = manifest_paths(out)[0]
    shard = json.loads(first.read_text())
    first.unlink()  # one shard of 2 trajectories not committed: 6 of 8 written
    tar = next(rel for rel in json.loads(manifest_paths(out)[0].read_text())["files"] if rel.startswith("images/"))
    (out / tar).write_bytes(b"damaged")  # and one damaged: 4 count
    assert shard["trajectories"]
    assert main(["status", str(out)]) == 3
    text = capsys.readouterr().out
    assert "4/6 trajectories" in text and "24/36 images" in text
    assert "cnsbench evaluate" in text and "cnsbench build" not in text
    assert str(tmp_path / "images") in text


# --------------------------------------------------------------------------- 10. request headers
def test_request_headers_over_16_kib_get_431_before_the_token_check(tmp_path):
    from starlette.testclient import TestClient

    from pipeline.serve.deployments import in_process_api

    out = tmp_path / "out"
    synthetic_output(out, tiny_cfg_path(tmp_path))
    app = in_process_api({"output": str(out), "allowed_hosts": ["testserver"], "token": "t" * 32})
    client = TestClient(app, raise_server_exceptions=False)
    big = {"x-padding": "a" * (17 * 1024)}
    for path in ("/api/info", "/healthz", "/"):
        r = client.get(path, headers=big)  # no token at all
        assert r.status_code == 431 and "16384" in r.json()["detail"], path
    many = {f"x-h{i}": "b" * 1000 for i in range(20)}
    assert client.get("/api/info", headers=many).status_code == 431
    assert client.get("/api/info", headers={"x-small": "a" * 1000}).status_code == 401
    assert client.get("/api/info", headers={"authorization": "Bearer " + "t" * 32}).status_code == 200


# --------------------------------------------------------------------------- 11 and item 7. strict JSON
def strict_load(text: str, where: str):
    def refuse(name: str):
        raise ValueError(f"{where}: non-finite number {name}")

    return json.loads(text, parse_constant=refuse)


def all_json_strict(root: Path) -> list[str]:
    names = []
    for path in sorted(root.rglob("*.json")):
        strict_load(path.read_text(), str(path))
        names.append(str(path.relative_to(root)))
    return names


DEGENERATE = {
    # name: (config change, correct(class_id, seed, shift, scale index), kept(...))
    "one_class": (lambda raw: raw["benchmark"].update(classes=["goldfish"]), None, None),
    "one_image": (
        lambda raw: raw["benchmark"].update(classes=["goldfish"], seeds=[1], shifts=["heavy_snow"], scales=[0]),
        None, None,
    ),
    "constant_accuracy": (None, lambda c, seed, shift, i: True, None),
    "never_right": (None, lambda c, seed, shift, i: False, None),
    "all_excluded": (None, None, lambda c, seed, shift, i: False),
}
ANALYSES = ["cns", "family_comparison", {"name": "robustness_score", "probe": False}, "scenario_regression"]


@pytest.mark.parametrize("case", sorted(DEGENERATE))
def test_reports_of_degenerate_outputs_are_strict_json(case, tmp_path):
    from pipeline.aggregate.run import aggregate_output, load_output_config
    from pipeline.io.store import OutputStore

    change, correct, kept = DEGENERATE[case]

    def mutate(raw):
        if change:
            change(raw)
        raw["aggregate"]["analyses"] = ANALYSES

    out = tmp_path / "out"
    synthetic_output(out, tiny_cfg_path(tmp_path, mutate), correct=correct, kept=kept)
    store = OutputStore(str(out))
    aggregate_output(store, load_output_config(store))
    names = all_json_strict(out)
    assert "report/metrics.json" in names and "config.json" in names
    page = (out / "report" / "index.html").read_text()
    for bad in (">NaN<", ">nan<", ">inf<", ">-inf<", "R² = nan", "R² = -inf", "R² = inf", "R² = None"):
        assert bad not in page, bad


def test_a_constant_accuracy_regression_is_null_and_n_a_on_the_page(tmp_path):
    from pipeline.aggregate.run import aggregate_output, load_output_config
    from pipeline.io.store import OutputStore

    out = tmp_path / "out"
    cfg = tiny_cfg_path(tmp_path, lambda raw: raw["aggregate"].update(analyses=["cns", "scenario_regression"]))
    synthetic_output(out, cfg, correct=lambda c, seed, shift, i: True)
    store = OutputStore(str(out))
    aggregate_output(store, load_output_config(store))
    metrics = strict_load((out / "report" / "metrics.json").read_text(), "metrics.json")
    assert metrics["analyses"]["scenario_regression"]["r_squared"] is None
    assert "R² = n/a" in (out / "report" / "index.html").read_text()


def test_the_strict_writer_turns_every_non_finite_number_into_null():
    import numpy as np

    from pipeline.io.safejson import dumps

    doc = {"a": math.nan, "b": [math.inf, -math.inf, 1.5, np.float32("nan"), np.float64(2.0)], "c": {"d": (np.inf, 3)},
           "e": np.int64(4), "f": np.array([1.0, np.nan])}
    text = dumps(doc)
    assert strict_load(text, "doc") == {"a": None, "b": [None, None, 1.5, None, 2.0], "c": {"d": [None, 3]}, "e": 4,
                                        "f": [1.0, None]}


# --------------------------------------------------------------------------- a build's distractors
QUESTIONS_VLM = "classifiers[0]={name: v, kind: vlm, model: org/llava, protocol: {kind: two_choice, distractors: questions}}"


def test_validate_refuses_released_questions_as_a_builds_distractors(tmp_path, capsys):
    tiny_cfg_path(tmp_path)
    capsys.readouterr()
    assert main(["validate", str(REPO / "configs" / "tiny.yaml"), "--set", QUESTIONS_VLM]) == 2
    out = capsys.readouterr()
    assert "classifiers[0] (v).protocol.distractors: 'questions' needs a released ImageNet-D" in out.out + out.err


@pytest.mark.integration  # refused after the output's claim, inside the build
def test_build_refuses_released_questions_before_any_image(tmp_path, capsys):
    cfg = tiny_cfg_path(tmp_path)
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["build", str(cfg), "--output", str(out), "--runner", "local", "--set", QUESTIONS_VLM]) == 2
    assert "classifiers[0] (v).protocol.distractors" in capsys.readouterr().err
    assert not (out / "images").exists()
