"""Deployment artefacts (deploy/, docker/) and the Ray Jobs wrappers (pipeline/runtime/jobs.py).

No cloud, Docker engine or Ray cluster is needed: the YAML files are parsed and checked
(cluster-launcher configs with Ray's own validator, Serve configs with Ray Serve's
schema), and the Jobs API wrappers run against a small stand-in Jobs server that uses
Ray's real token-auth middleware, so the token handling is checked against what Ray
itself accepts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from pipeline.runtime import jobs
REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
DOCKER = REPO / "docker"

#: The one image every node of every deployment runs (see docker/README.md).
IMAGE_GPU = "${REGISTRY}/cnsbench:gpu"
IMAGE_CPU = "${REGISTRY}/cnsbench:cpu"
SERVE_IMPORT_PATH = "pipeline.serve.app:build_app"
KUBERAY_API = "ray.io/v1"
#: Placeholders the deploy files may contain; each is documented in deploy/README.md.
PLACEHOLDERS = {"REGISTRY", "CNSBENCH_WORKER_PROFILE_ARN", "GCP_PROJECT", "CNSBENCH_WORKER_SA", "CNSBENCH_BUCKET"}

EXPECTED_YAML = {
    "aws/cluster.yaml",
    "gcp/cluster.yaml",
    "kuberay/rayjob.yaml",
    "kuberay/raycluster.yaml",
    "kuberay/rayservice.yaml",
    "serve.yaml",
}


# =========================================================================== helpers
def _yaml_files() -> list[Path]:
    return sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])


def _docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _load(rel: str) -> Any:
    docs = _docs(DEPLOY / rel)
    assert len(docs) == 1, f"{rel}: expected one YAML document"
    return docs[0]


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """Yield (path, key, value) for every mapping entry in a YAML tree."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield f"{path}.{k}", k, v
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")


def _images(node: Any) -> list[str]:
    return [v for _, k, v in _walk(node) if k in ("image", "head_image", "worker_image") and isinstance(v, str)]


def _serve_schema():
    from ray.serve.schema import ServeDeploySchema

    return ServeDeploySchema


def _dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in path.read_text().splitlines():
        s = line.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if buf and s.startswith("#"):
            continue
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        buf += s
        instr, _, args = buf.partition(" ")
        out.append((instr.upper(), args.strip()))
        buf = ""
    return out


# =========================================================================== all YAML
def test_every_deploy_yaml_parses_and_expected_files_exist():
    found = {p.relative_to(DEPLOY).as_posix() for p in _yaml_files()}
    assert EXPECTED_YAML <= found, f"missing: {EXPECTED_YAML - found}"
    for p in _yaml_files():
        docs = _docs(p)
        assert docs and all(isinstance(d, dict) for d in docs), p


def test_images_are_the_one_documented_name():
    for p in _yaml_files():
        for img in _images(_docs(p)):
            assert img == IMAGE_GPU, f"{p}: image {img!r} != {IMAGE_GPU!r}"
    readme = (DOCKER / "README.md").read_text()
    for tag, image in (("gpu", IMAGE_GPU), ("cpu", IMAGE_CPU)):
        local = image.split("/", 1)[1]
        assert f"docker build -f docker/Dockerfile.{tag} -t {local} ." in readme
        assert image in readme
    assert IMAGE_GPU in (DEPLOY / "README.md").read_text()


def test_placeholders_are_known_and_documented():
    readme = (DEPLOY / "README.md").read_text()
    for p in _yaml_files():
        for name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", p.read_text()):
            assert name in PLACEHOLDERS, f"{p}: undocumented placeholder ${{{name}}}"
    for name in PLACEHOLDERS:
        assert f"${{{name}}}" in readme, f"deploy/README.md does not explain ${{{name}}}"


def test_nothing_is_exposed_publicly():
    for p in _yaml_files():
        text = p.read_text()
        assert not re.search(r"dashboard[-_]host['\"]?\s*[:=]\s*['\"]?0\.0\.0\.0", text), p
        for where, key, value in _walk(_docs(p)):
            if key in ("type", "serviceType") and isinstance(value, str):
                assert value not in ("LoadBalancer", "NodePort"), f"{p}{where}: {value}"
            if key == "serviceType":
                assert value == "ClusterIP", f"{p}{where}"
            if key == "enableIngress":
                assert value is False, f"{p}{where}"
            if key == "kind" and value == "Ingress":
                pytest.fail(f"{p}{where}: Ingress")
        for doc in _docs(p):
            if doc.get("kind") == "Service":
                assert doc.get("spec", {}).get("type", "ClusterIP") == "ClusterIP", p


# =========================================================================== cluster launcher
@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_cluster_launcher_config(cloud):
    from ray.autoscaler._private.util import validate_config

    cfg = _load(f"{cloud}/cluster.yaml")
    validate_config(cfg)  # Ray's schema + its cross-field checks
    assert cfg["cluster_name"]
    assert cfg["provider"]["type"] == cloud
    types = cfg["available_node_types"]
    assert cfg["head_node_type"] in types

    head = types[cfg["head_node_type"]]
    assert head.get("resources", {}).get("GPU", 0) == 0, "the head node type is CPU-only"

    gpu_types = {n: t for n, t in types.items() if t.get("resources", {}).get("GPU", 0) > 0}
    assert gpu_types, "a GPU worker type with resources.GPU"
    # An autoscaler learns a type's memory from its declaration (or a node of it that ran):
    # pools that ask Ray for memory would never start a node of a type that declares none.
    for name, t in types.items():
        declared = t.get("resources", {})
        assert {"CPU", "GPU", "memory"} <= set(declared), (name, declared)
        assert declared["memory"] >= 4 * 2**30, (name, declared["memory"])
    for name, t in gpu_types.items():
        assert name != cfg["head_node_type"]
        assert t["min_workers"] == 0, name
        assert t["max_workers"] > 0, name
        assert cfg["max_workers"] >= t["max_workers"], name
        nc = t["node_config"]
        if cloud == "aws":
            assert nc["InstanceMarketOptions"]["MarketType"] == "spot"
            assert nc["InstanceType"].startswith(("g5.", "g6.", "g4dn.", "p"))
        else:
            sched = nc["scheduling"]
            sched = {k: v for d in sched for k, v in d.items()} if isinstance(sched, list) else sched
            assert sched.get("preemptible") is True or sched.get("provisioningModel") == "SPOT"
            assert sched.get("onHostMaintenance") == "TERMINATE"  # required with GPUs
            assert nc["guestAccelerators"][0]["acceleratorCount"] >= 1

    docker = cfg["docker"]
    assert docker["image"] == IMAGE_GPU
    assert "head_image" not in docker and "worker_image" not in docker
    assert any("RAY_AUTH_MODE=token" in o for o in docker["run_options"])
    assert any("/models" in o for o in docker["run_options"])

    head_cmds = " ".join(cfg["head_start_ray_commands"])
    start = next(c for c in cfg["head_start_ray_commands"] if "ray start" in c)
    assert "--head" in start and "RAY_AUTH_MODE=token" in start
    assert "--dashboard-host=127.0.0.1" in start
    assert "0.0.0.0" not in head_cmds
    worker_start = next(c for c in cfg["worker_start_ray_commands"] if "ray start" in c)
    assert "RAY_AUTH_MODE=token" in worker_start

    assert "~/.ray/auth_token" in cfg["file_mounts"].values(), "the token is copied to the nodes"
    for key in ("setup_commands", "head_setup_commands", "worker_setup_commands"):
        assert not cfg.get(key), f"{key}: everything belongs in the image"
    if cloud == "aws":
        for perm in cfg["provider"].get("security_group", {}).get("IpPermissions", []):
            assert perm["FromPort"] == perm["ToPort"] == 22, "only SSH may be opened"


# =========================================================================== KubeRay
def _ray_cluster_specs() -> dict[str, dict]:
    return {
        "raycluster": _load("kuberay/raycluster.yaml")["spec"],
        "rayjob": _load("kuberay/rayjob.yaml")["spec"]["rayClusterSpec"],
        "rayservice": _load("kuberay/rayservice.yaml")["spec"]["rayClusterConfig"],
    }


def test_kuberay_kinds_and_api_versions():
    for rel, kind in (
        ("kuberay/raycluster.yaml", "RayCluster"),
        ("kuberay/rayjob.yaml", "RayJob"),
        ("kuberay/rayservice.yaml", "RayService"),
    ):
        doc = _load(rel)
        assert doc["apiVersion"] == KUBERAY_API, rel
        assert doc["kind"] == kind, rel
        assert doc["metadata"]["name"], rel


@pytest.mark.parametrize("which", ["raycluster", "rayjob", "rayservice"])
def test_kuberay_cluster_spec(which):
    spec = _ray_cluster_specs()[which]
    assert spec["authOptions"]["mode"] == "token"
    major, minor = (int(x) for x in spec["rayVersion"].split(".")[:2])
    assert (major, minor) >= (2, 52), "token auth needs Ray >= 2.52"
    head = spec["headGroupSpec"]
    assert head.get("serviceType", "ClusterIP") == "ClusterIP"
    assert head.get("enableIngress", False) is False
    head_ctr = head["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in head_ctr.get("resources", {}).get("limits", {})
    gpu_groups = [
        g
        for g in spec["workerGroupSpecs"]
        if any("nvidia.com/gpu" in c.get("resources", {}).get("limits", {}) for c in g["template"]["spec"]["containers"])
    ]
    assert gpu_groups, "a GPU worker group"
    for g in spec["workerGroupSpecs"]:  # KubeRay declares a group's resources from its container limits
        limits = g["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert {"cpu", "memory", "nvidia.com/gpu"} <= set(limits), (g["groupName"], limits)
    for g in gpu_groups:
        assert g["minReplicas"] == 0
        assert g["maxReplicas"] > 0
        assert g.get("replicas", 0) <= g["maxReplicas"]
    assert set(_images(spec)) == {IMAGE_GPU}
    for group in [head, *spec["workerGroupSpecs"]]:
        pod = group["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert any(v["name"] == "models" for v in pod["volumes"])
        for c in pod["containers"]:
            assert any(m["mountPath"] == "/models" for m in c["volumeMounts"])


def test_rayjob_entrypoint_and_retries():
    spec = _load("kuberay/rayjob.yaml")["spec"]
    ep = spec["entrypoint"]
    assert re.fullmatch(r"python -m pipeline\.cli build configs/[\w.-]+\.yaml --output s3://\S+ --max-gpus \d+", ep), ep
    assert "--new-version" not in ep, "retries must resume, not start a new version"
    assert spec["backoffLimit"] >= 1
    assert spec["shutdownAfterJobFinishes"] is True
    assert "entrypointNumCpus" not in spec and "entrypointNumGpus" not in spec  # driver on the head


def test_serve_configs_validate_with_ray_serve_schema():
    schema = _serve_schema()
    serve = _load("serve.yaml")
    parsed = schema.model_validate(serve)
    assert [a.import_path for a in parsed.applications] == [SERVE_IMPORT_PATH]
    assert serve["http_options"]["host"] == "127.0.0.1"
    assert parsed.http_options.host not in ("0.0.0.0", "::")

    svc = _load("kuberay/rayservice.yaml")
    inner = yaml.safe_load(svc["spec"]["serveConfigV2"])
    parsed = schema.model_validate(inner)
    assert [a.import_path for a in parsed.applications] == [SERVE_IMPORT_PATH]


# =========================================================================== docker
def test_dockerfiles():
    gpu = _dockerfile_instructions(DOCKER / "Dockerfile.gpu")
    cpu = _dockerfile_instructions(DOCKER / "Dockerfile.cpu")
    for name, instrs, extras in (("gpu", gpu, ".[gpu,s3]"), ("cpu", cpu, ".[s3]")):
        text = " ".join(f"{i} {a}" for i, a in instrs)
        assert any(i == "RUN" and f'"{extras}"' in a and "pip install" in a for i, a in instrs), name
        assert any(i == "VOLUME" and "/models" in a for i, a in instrs), name
        assert re.search(r"HF_HOME=/models\b", text), name
        users = [a for i, a in instrs if i == "USER"]
        assert users and users[-1] not in ("root", "0"), f"{name}: must end as a non-root user"
        assert not any(i == "ENTRYPOINT" for i, _ in instrs), f"{name}: Ray/KubeRay override the command"
        cmd = [a for i, a in instrs if i == "CMD"]
        assert cmd and "cnsbench" in cmd[-1], name
        assert any(i == "WORKDIR" and a == "/app" for i, a in instrs), name
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for i, a in gpu if i == "ARG" and "=" in a}
    base = next(a for i, a in gpu if i == "FROM").replace("${BASE_IMAGE}", args.get("BASE_IMAGE", ""))
    assert re.match(r"(rayproject/ray:[\w.]+-py311-(gpu|cu\d+)|nvidia/cuda:12\.[\w.-]*cudnn[\w.-]*runtime-ubuntu22\.04)", base), base
    ray_tag = re.search(r"rayproject/ray:(\d+\.\d+\.\d+)", base)
    if ray_tag:
        assert args["RAY_VERSION"] == ray_tag.group(1), "RAY_VERSION must match the base image"
    assert next(a for i, a in cpu if i == "FROM") == "python:3.11-slim"

    ignore = {ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", "runs"} <= ignore


# =========================================================================== jobs: packaging
SAMPLE_GITIGNORE = """\
# build outputs
*.log
!keep.log

/build/
data/cache/
secret.txt   
configs/local-*.yaml
"""


def _sample_repo(root: Path) -> Path:
    files = {
        ".gitignore": SAMPLE_GITIGNORE,
        "pyproject.toml": "[project]\nname = 'x'\n",
        "pipeline/__init__.py": "",
        "pipeline/cli.py": "print('hi')\n",
        "configs/demo.yaml": "benchmark: {}\n",
        "configs/local-mine.yaml": "benchmark: {}\n",
        ".venv/lib/site.py": "x",
        ".git/HEAD": "ref: refs/heads/main\n",
        "runs/old/shard-0.parquet": "x",
        "build/lib/x.py": "x",
        "data/cache/blob.bin": "x",
        "data/keep.txt": "x",
        "debug.log": "x",
        "keep.log": "x",
        "secret.txt": "x",
        "nested/runs/keep.txt": "x",
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


EXPECTED_UPLOAD = {
    ".gitignore",
    "pyproject.toml",
    "pipeline/__init__.py",
    "pipeline/cli.py",
    "configs/demo.yaml",
    "data/keep.txt",
    "keep.log",
    "nested/runs/keep.txt",
}


def test_gitignore_excludes_from_sample(tmp_path):
    (tmp_path / ".gitignore").write_text(SAMPLE_GITIGNORE)
    pats = jobs.gitignore_excludes(tmp_path / ".gitignore")
    assert pats == [
        "*.log",
        "!keep.log",
        "/build/",
        "/build",
        "data/cache/",
        "data/cache",
        "secret.txt",
        "configs/local-*.yaml",
    ]
    assert jobs.working_dir_excludes(tmp_path) == pats + [".git", ".venv", "/runs"]
    assert jobs.gitignore_excludes(tmp_path / "missing") == []
    assert jobs.working_dir_excludes(tmp_path / "nowhere") == [".git", ".venv", "/runs"]


def test_excludes_applied_by_rays_packaging(tmp_path, monkeypatch):
    """The excludes alone (Ray's own .gitignore reading switched off) leave out what they should."""
    from ray._private.runtime_env.packaging import create_package

    monkeypatch.setenv("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "1")
    repo = _sample_repo(tmp_path / "repo")
    out = tmp_path / "pkg.zip"
    create_package(str(repo), out, include_gitignore=False, excludes=jobs.working_dir_excludes(repo))
    with zipfile.ZipFile(out) as zf:
        names = {n.rstrip("/") for n in zf.namelist()}
    files = {n for n in names if (repo / n).is_file()}
    assert files == EXPECTED_UPLOAD
    for pruned in (".venv", ".git", "runs", "build", "data/cache"):
        assert pruned not in names, f"{pruned} should be pruned, not walked"


def test_repo_root_and_runtime_env(tmp_path):
    assert jobs.find_repo_root() == REPO
    env = jobs.build_runtime_env(REPO, ["s3fs==2024.1.0"])
    assert env["working_dir"] == str(REPO)
    assert env["excludes"][-3:] == [".git", ".venv", "/runs"]
    assert ".venv/" in env["excludes"]  # from the repo's .gitignore
    assert env["pip"] == ["s3fs==2024.1.0"]
    assert "pip" not in jobs.build_runtime_env(REPO)
    with pytest.raises(NotADirectoryError):
        jobs.build_runtime_env(tmp_path / "nope")


def test_entrypoint_string():
    assert (
        jobs.build_entrypoint("configs/demo.yaml", "s3://bucket/builds/demo")
        == "python -m pipeline.cli build configs/demo.yaml --output s3://bucket/builds/demo"
    )
    assert jobs.build_entrypoint("configs/a.yaml", "s3://b/p", new_version=True).endswith(
        "--output s3://b/p --new-version"
    )
    assert (
        jobs.build_entrypoint("configs/my run.yaml", "/mnt/shared/out dir")
        == "python -m pipeline.cli build 'configs/my run.yaml' --output '/mnt/shared/out dir'"
    )


def test_submit_build_rejects_bad_inputs_before_contacting_a_cluster(tmp_path, monkeypatch):
    repo = _sample_repo(tmp_path / "repo")
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text("x: 1\n")
    bogus = "http://127.0.0.1:9"  # nothing listens: reaching it would be a ConnectionError
    with pytest.raises(ValueError, match="outside the working_dir"):
        jobs.submit_build(outside, "s3://b/p", bogus, working_dir=repo)
    with pytest.raises(ValueError, match="excluded"):
        jobs.submit_build(repo / "configs/local-mine.yaml", "s3://b/p", bogus, working_dir=repo)
    with pytest.raises(FileNotFoundError):
        jobs.submit_build(repo / "configs/none.yaml", "s3://b/p", bogus, working_dir=repo)
    with pytest.raises(ValueError, match="relative path"):
        jobs.submit_build(repo / "configs/demo.yaml", "runs/out", bogus, working_dir=repo)
    with pytest.raises(ValueError, match="new --output"):  # a build command line without --new-version
        jobs.submit_build(repo / "configs/demo.yaml", "s3://b/p", bogus, working_dir=repo, new_version=True,
                          accepts=lambda *args: False)


def test_config_paths_must_be_uploaded(tmp_path):
    repo = _sample_repo(tmp_path / "repo")
    cfg = repo / "configs" / "paths.yaml"
    cfg.write_text(
        "generator:\n"
        "  model: stabilityai/stable-diffusion-2\n"  # hub id: fine
        "  slider_store: s3://bucket/sliders\n"  # URI: fine
        "  class_tokens: {kind: ti_folder, path: ../data/keep.txt}\n"  # uploaded: fine
        "classifiers:\n"
        "  - {name: a, model: m, checkpoint: ../data/cache/blob.bin}\n"  # .gitignore'd
        "  - {name: b, model: m, checkpoint: ../../outside.pth}\n"  # outside the working_dir
    )
    with pytest.raises(ValueError) as err:
        jobs.submit_build(cfg, "s3://b/p", "http://127.0.0.1:9", working_dir=repo)
    msg = str(err.value)
    assert "../data/cache/blob.bin (excluded" in msg and "../../outside.pth (outside" in msg
    assert "keep.txt" not in msg and "sliders" not in msg.split(". Use")[0]


def test_build_accepts_reads_the_build_cli():
    from pipeline.cli import make_parser
    from pipeline.cli.submit import build_accepts

    args = make_parser().parse_args(["submit", "c.yaml", "--output", "s3://b/p"])
    assert build_accepts(args.build_parser, "--output", "s3://b/p") is True
    assert build_accepts(args.build_parser, "--new-version") is True
    assert build_accepts(args.build_parser, "--no-such-option") is False
    assert build_accepts(None, "--new-version") is None


# =========================================================================== jobs: token
@pytest.fixture
def clean_auth_env(tmp_path, monkeypatch):
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def test_token_resolution_order(tmp_path, monkeypatch, clean_auth_env):
    home = clean_auth_env
    assert jobs.resolve_token() is None and jobs.auth_headers() == {}

    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text("default-token\n")
    assert jobs.resolve_token() is None, "the default file is Ray's business unless RAY_AUTH_MODE=token"
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert jobs.resolve_token() == "default-token"

    path_file = tmp_path / "path.token"
    path_file.write_text("  path-token \n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(path_file))
    assert jobs.resolve_token() == "path-token"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "env-token")
    assert jobs.resolve_token() == "env-token"

    explicit = tmp_path / "explicit.token"
    explicit.write_text("file-token\n")
    assert jobs.resolve_token(explicit) == "file-token"
    assert jobs.auth_headers(explicit) == {"Authorization": "Bearer file-token"}

    with pytest.raises(FileNotFoundError):
        jobs.resolve_token(tmp_path / "missing.token")
    (tmp_path / "empty.token").write_text("\n")
    with pytest.raises(ValueError):
        jobs.resolve_token(tmp_path / "empty.token")
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "missing.token"))
    with pytest.raises(FileNotFoundError, match="RAY_AUTH_TOKEN_PATH"):
        jobs.resolve_token()


def test_client_carries_token_header(tmp_path, clean_auth_env):
    """Ray's SubmissionClient keeps an explicit Authorization header (it never overrides one)."""
    from ray.dashboard.modules.dashboard_sdk import SubmissionClient

    tok = tmp_path / "t"
    tok.write_text("abc\n")
    client = SubmissionClient(address="http://127.0.0.1:9", headers=jobs.auth_headers(tok))
    assert client._headers["Authorization"] == "Bearer abc"


# =========================================================================== stand-in Jobs server
SERVER = r'''
import json, socket, sys
from pathlib import Path
import aiohttp
from aiohttp import web
import ray
from ray._private.authentication.http_token_authentication import get_token_auth_middleware

record = Path(sys.argv[1])
jobs = {}

async def version(req):
    return web.json_response({"version": "test", "ray_version": ray.__version__, "ray_commit": "test", "session_name": "test"})

async def pkg_get(req):
    return web.Response(status=404)

async def pkg_put(req):
    (record / req.match_info["name"]).write_bytes(await req.read())
    return web.Response(status=200)

async def submit(req):
    body = await req.json()
    (record / "submit.json").write_text(json.dumps(body))
    sid = body.get("submission_id") or f"raysubmit_test{len(jobs)}"
    jobs[sid] = body
    return web.json_response({"job_id": sid, "submission_id": sid})

async def info(req):
    sid = req.match_info["sid"]
    if sid not in jobs:
        return web.Response(status=404, text=f"Job {sid} does not exist")
    return web.json_response({"type": "SUBMISSION", "status": "SUCCEEDED", "submission_id": sid,
                              "entrypoint": jobs[sid]["entrypoint"], "metadata": jobs[sid].get("metadata")})

async def logs(req):
    return web.json_response({"logs": "build done\n"})

async def stop(req):
    return web.json_response({"stopped": False})

async def tail(req):
    ws = web.WebSocketResponse()
    await ws.prepare(req)
    for chunk in ("line 1\n", "line 2\n"):
        await ws.send_str(chunk)
    await ws.close()
    return ws

app = web.Application(middlewares=[get_token_auth_middleware(aiohttp)], client_max_size=1 << 28)
app.router.add_get("/api/version", version)
app.router.add_get("/api/packages/{proto}/{name}", pkg_get)
app.router.add_put("/api/packages/{proto}/{name}", pkg_put)
app.router.add_post("/api/jobs/", submit)
app.router.add_get("/api/jobs/{sid}", info)
app.router.add_get("/api/jobs/{sid}/logs", logs)
app.router.add_get("/api/jobs/{sid}/logs/tail", tail)
app.router.add_post("/api/jobs/{sid}/stop", stop)
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
web.run_app(app, sock=sock, print=None)
'''


@pytest.fixture(scope="module")
def _jobs_server_process(tmp_path_factory):
    """The stand-in server, started once for the module's tests that talk to it (not autouse:
    the YAML, packaging and argument tests above need no server and stay in the unit tier)."""
    root = tmp_path_factory.mktemp("jobs_server")
    (root / "record").mkdir()
    (root / "home").mkdir()
    script = root / "server.py"
    script.write_text(SERVER)
    token = secrets.token_hex(16)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")
    }
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, HOME=str(root / "home"))
    err_log = open(root / "server.err", "w")  # a file, not a pipe nobody drains
    proc = subprocess.Popen(
        [sys.executable, str(script), str(root / "record")],
        stdout=subprocess.PIPE,
        stderr=err_log,
        env=env,
        text=True,
    )
    port: list[str] = []
    reader = threading.Thread(target=lambda: port.append(proc.stdout.readline().strip()), daemon=True)
    reader.start()
    token_file = root / "cluster.token"
    token_file.write_text(token + "\n")
    try:
        yield {"root": root, "reader": reader, "port": port, "token_file": token_file}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        err_log.close()


@pytest.fixture
def jobs_server(_jobs_server_process):
    """A Jobs API stand-in behind Ray's real token middleware, in token mode."""
    srv = _jobs_server_process
    srv["reader"].join(timeout=30)
    if not srv["port"] or not srv["port"][0].isdigit():
        pytest.fail(f"stand-in Jobs server did not start: {(srv['root'] / 'server.err').read_text()[-2000:]}")
    return {
        "address": f"http://127.0.0.1:{srv['port'][0]}",
        "token_file": srv["token_file"],
        "record": srv["root"] / "record",
    }


def test_rays_middleware_rejects_missing_and_wrong_tokens(jobs_server, tmp_path, clean_auth_env):
    from ray.exceptions import AuthenticationError

    with pytest.raises(AuthenticationError):
        jobs.make_client(jobs_server["address"])  # no token configured
    wrong = tmp_path / "wrong.token"
    wrong.write_text("not-the-token\n")
    with pytest.raises(AuthenticationError, match="403|invalid|Invalid"):
        jobs.make_client(jobs_server["address"], token_file=wrong)
    jobs.make_client(jobs_server["address"], token_file=jobs_server["token_file"])  # accepted


def test_token_from_env_path_is_sent(jobs_server, monkeypatch, clean_auth_env):
    """RAY_AUTH_TOKEN_PATH alone (RAY_AUTH_MODE unset, where Ray's client sends nothing) suffices."""
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(jobs_server["token_file"]))
    jobs.make_client(jobs_server["address"])


def test_submit_and_follow_a_build(jobs_server, tmp_path, monkeypatch, clean_auth_env):
    monkeypatch.setenv("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "1")  # only our excludes act
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:9")  # an explicit address must win
    repo = _sample_repo(tmp_path / "repo")
    addr, tok = jobs_server["address"], jobs_server["token_file"]

    job_id = jobs.submit_build(
        repo / "configs/demo.yaml",
        "s3://bucket/builds/demo",
        addr,
        working_dir=repo,
        entrypoint_num_gpus=0,
        token_file=tok,
    )
    sent = json.loads((jobs_server["record"] / "submit.json").read_text())
    assert sent["entrypoint"] == "python -m pipeline.cli build configs/demo.yaml --output s3://bucket/builds/demo"
    assert sent["runtime_env"]["working_dir"].startswith("gcs://_ray_pkg_")
    assert sent["runtime_env"]["excludes"] == jobs.working_dir_excludes(repo)
    assert sent["metadata"] == {"cnsbench.config": "configs/demo.yaml", "cnsbench.output": "s3://bucket/builds/demo"}
    assert sent["entrypoint_num_cpus"] == 1
    assert "RAY_AUTH_TOKEN" not in json.dumps(sent) and tok.read_text().strip() not in json.dumps(sent)

    pkg = jobs_server["record"] / sent["runtime_env"]["working_dir"].split("://", 1)[1]
    with zipfile.ZipFile(pkg) as zf:
        names = {n.rstrip("/") for n in zf.namelist()}
    assert {n for n in names if (repo / n).is_file()} == EXPECTED_UPLOAD

    assert jobs.job_status(job_id, addr, token_file=tok) == "SUCCEEDED"
    assert jobs.job_logs(job_id, addr, token_file=tok) == "build done\n"
    assert list(jobs.job_logs(job_id, addr, follow=True, token_file=tok)) == ["line 1\n", "line 2\n"]
    assert jobs.stop_job(job_id, addr, token_file=tok) is False
    assert jobs.wait_job(job_id, addr, 5, token_file=tok) == "SUCCEEDED"
    assert os.environ["RAY_ADDRESS"] == "http://127.0.0.1:9", "the environment is restored"


# =========================================================================== jobs: CLI
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cnsbench")
    from pipeline.cli.submit import register

    register(parser.add_subparsers(dest="command"))
    return parser


def test_cli_arguments():
    p = _parser()
    a = p.parse_args(
        "submit configs/demo.yaml --address http://h:8265 --output s3://b/p "
        "--token-file t --num-gpus 1 --new-version".split()
    )
    assert (a.config, a.address, a.output, a.token_file, a.num_gpus, a.num_cpus, a.new_version) == (
        "configs/demo.yaml", "http://h:8265", "s3://b/p", "t", 1.0, 1.0, True,
    )
    assert callable(a.func)
    for sub in ("status", "logs", "stop", "wait"):
        a = p.parse_args(["jobs", sub, "raysubmit_1", "--address", "http://h:8265"])
        assert a.job_id == "raysubmit_1" and a.address == "http://h:8265" and callable(a.func)
    assert p.parse_args(["jobs", "logs", "j", "--follow"]).follow is True
    with pytest.raises(SystemExit):
        p.parse_args(["submit", "configs/demo.yaml"])  # --output is required
    with pytest.raises(SystemExit):
        p.parse_args(["jobs", "restart", "j"])


def test_cli_against_server(jobs_server, tmp_path, monkeypatch, capsys, clean_auth_env):
    repo = _sample_repo(tmp_path / "repo")
    monkeypatch.chdir(repo)
    p = _parser()
    conn = ["--address", jobs_server["address"], "--token-file", str(jobs_server["token_file"])]

    args = p.parse_args(["submit", "configs/demo.yaml", "--output", "s3://b/cli", "--working-dir", str(repo), *conn])
    assert args.func(args) == 0
    job_id = capsys.readouterr().out.strip()
    assert job_id.startswith("raysubmit_")

    for sub, expected in (("status", "SUCCEEDED\n"), ("logs", "build done\n"), ("stop", "job was not running\n")):
        args = p.parse_args(["jobs", sub, job_id, *conn])
        assert args.func(args) == 0
        assert capsys.readouterr().out == expected
    args = p.parse_args(["jobs", "logs", job_id, "--follow", *conn])
    assert args.func(args) == 0 and capsys.readouterr().out == "line 1\nline 2\n"
    args = p.parse_args(["jobs", "wait", job_id, *conn])
    assert args.func(args) == 0 and capsys.readouterr().out == "SUCCEEDED\n"

    # errors become a message, not a traceback: exit 1 for what the cluster answers, 2 for bad input
    args = p.parse_args(["jobs", "status", "raysubmit_nope", *conn])
    assert args.func(args) == 1
    assert "cnsbench: error:" in capsys.readouterr().err
    args = p.parse_args(["jobs", "status", job_id])  # no --address, no RAY_ADDRESS
    assert args.func(args) == 2
    assert "--address" in capsys.readouterr().err
