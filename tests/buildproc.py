"""Builds in subprocesses inside their own PID namespace, and SIGKILL at chosen points.

Shared by the resume and object-storage tests.  ``unshare -p -f --mount-proc`` gives every
build its own PID namespace, so killing the namespace's init takes the driver and every
Ray process of that build with it and leaves the host's other Ray processes alone.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from pipeline.io.webdataset import iter_tar

HAS_UNSHARE = shutil.which("unshare") is not None and subprocess.run(
    ["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True
).returncode == 0


# A Ray build of the tiny config in a fresh PID namespace takes about 100 s alone on a 2-core
# machine; beside the rest of the suite its Ray starts its actors and runs its units many
# times slower (measured: over 10 minutes with three busy processes beside it). Its tests
# allow for that (their pytest timeout is RAY_SUBPROCESS_TEST_S).
SUBPROCESS_BUILD_S = 1500
RAY_SUBPROCESS_TEST_S = 2 * SUBPROCESS_BUILD_S + 300


# Sampler steps of the tests' tiny builds (configs/tiny.yaml has the paper's 50).  With the
# LoRA window at t <= 750, 10 DDIM steps still make 2 steps before the window and 8 in it,
# so the shared prefix and the slider branches both run; generation costs a fifth.
TEST_STEPS = 10


def tiny_config(directory: Path, mutate=None, name: str = "tiny.yaml", plots: bool = False,
                steps: int = TEST_STEPS) -> Path:
    """configs/tiny.yaml with absolute asset paths (so it can live anywhere), optionally changed.

    The report's figures are off (``aggregate.plots``) unless ``plots``: drawing them costs a
    build about 4 CPU-seconds, and the suite builds this config dozens of times for tests
    that read the tables; the report tests ask for them.  The sampler runs ``steps`` steps
    (TEST_STEPS) unless ``mutate`` sets them."""
    import yaml

    from pipeline.cli import TINY_CONFIG
    from pipeline.demo.assets import ensure_tiny_assets

    ensure_tiny_assets()
    text = TINY_CONFIG.read_text().replace("../assets/", str(TINY_CONFIG.parent.parent / "assets") + "/")
    raw = yaml.safe_load(text)
    raw.setdefault("aggregate", {})["plots"] = plots
    raw["generator"]["steps"] = steps
    if mutate:
        mutate(raw)
    path = Path(directory) / name
    path.write_text(yaml.safe_dump(raw))
    return path


def build_cmd(cfg: Path, out: Path, runner: str, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "pipeline.cli", "build", str(cfg), "--output", str(out), "--runner", runner, *extra]
    return ["unshare", "-p", "-f", "--mount-proc", *cmd] if HAS_UNSHARE else cmd


def env_with(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNSBENCH_FAULT")}
    env.update(HF_HUB_OFFLINE="1", RAY_DATA_DISABLE_PROGRESS_BARS="1", **extra)
    return env


def run_build(cfg: Path, out: Path, runner: str, env: dict | None = None, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        build_cmd(cfg, out, runner, *extra), env=env or env_with(), capture_output=True, text=True,
        timeout=SUBPROCESS_BUILD_S,
    )


def build_here(cfg: Path, out: Path | str, *extra: str) -> int:
    """The same build in this process (runner local): for the runs that nothing kills, so
    the tests do not pay a new interpreter and its imports for each."""
    from pipeline.cli import main

    return main(["build", str(cfg), "--output", str(out), "--runner", "local", *extra])


def kill_at(cfg: Path, out: Path, runner: str, rule: str, fault_dir: Path) -> None:
    """Start a build that pauses at the fault rule's point, then SIGKILL all of it there."""
    fault_dir.mkdir(parents=True, exist_ok=True)
    env = env_with(CNSBENCH_FAULT_INJECT=rule, CNSBENCH_FAULT_DIR=str(fault_dir))
    proc = subprocess.Popen(build_cmd(cfg, out, runner), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + SUBPROCESS_BUILD_S
    try:
        while not list(fault_dir.glob("paused-*")):
            if proc.poll() is not None:
                raise AssertionError(f"build ended before reaching {rule}: {proc.stdout.read().decode()[-3000:]}")
            if time.time() > deadline:
                raise AssertionError(f"build never reached {rule}")
            time.sleep(0.2)
    finally:
        # The namespace's init is unshare's child: killing it kills the whole namespace.
        if HAS_UNSHARE:
            children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
            for pid in children:
                os.kill(int(pid), signal.SIGKILL)
        proc.kill()
        proc.wait(timeout=60)


def snapshot(out: Path | str) -> dict:
    """Per-sample image bytes, samples and predictions of an output (committed shards only)."""
    from pipeline.io.store import OutputStore

    store = OutputStore(str(out))
    images, samples, preds = {}, [], []
    for man in store.manifests():
        for rel in man.files:
            data = store.read_bytes(rel)
            if rel.startswith("images/"):
                for key, members in iter_tar(data, rel):
                    assert key not in images, f"duplicate sample {key}"
                    images[key] = members["png"]
            elif rel.startswith("samples/"):
                samples.append(pq.read_table(io.BytesIO(data)).to_pandas())
            elif rel.startswith("predictions/"):
                preds.append(pq.read_table(io.BytesIO(data)).to_pandas())
    s = pd.concat(samples).drop(columns=["shard"]).sort_values("sample_id").reset_index(drop=True)
    p = pd.concat(preds).sort_values(["sample_id", "classifier"]).reset_index(drop=True)
    p["top5"] = p["top5"].map(list)
    return {"images": images, "samples": s, "predictions": p}


def assert_same(a: dict, b: dict) -> None:
    assert set(a["images"]) == set(b["images"]) and len(a["images"]) == 48
    assert a["images"] == b["images"]  # byte-identical on CPU
    assert a["samples"]["sample_id"].is_unique and b["samples"]["sample_id"].is_unique
    pd.testing.assert_frame_equal(a["samples"], b["samples"])
    pd.testing.assert_frame_equal(a["predictions"], b["predictions"])


