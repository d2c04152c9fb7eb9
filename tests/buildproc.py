"""Builds killed with SIGKILL at chosen points, the tests' tiny config, and output snapshots.

Shared by the resume, object-storage and cluster tests.  A killed Ray build runs in a
subprocess inside its own PID namespace (``unshare -p -f --mount-proc``), so killing the
namespace's init takes the driver and every Ray process of that build with it and leaves
the host's other Ray processes alone; a killed local build runs in a forked child.
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

from pipeline.plan import schema
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

# Zero-shot prompt templates of the tests' tiny builds: one, not the "simple" set of
# configs/tiny.yaml.  The head is the same function of the weights, the class names and the
# templates either way; with one template it is built in a tenth of the time (about 3.5
# CPU-seconds less for every process that classifies: each Ray actor, each subprocess build).
TEST_TEMPLATES = ["a photo of a {c}."]


# One prompt template for the tiny config's zero-shot classifier (its --set): the head is built
# in a tenth of the time, nothing else changes.
FAST_ZERO_SHOT = ["classifiers[2].templates=['a photo of a {c}.']"]

def tiny_config(directory: Path, mutate=None, name: str = "tiny.yaml", plots: bool = False,
                steps: int = TEST_STEPS) -> Path:
    """configs/tiny.yaml with absolute asset paths (so it can live anywhere), optionally changed.

    The report's figures are off (``aggregate.plots``) unless ``plots``: drawing them costs a
    build about 4 CPU-seconds, and the suite builds this config dozens of times for tests
    that read the tables; the report tests ask for them.  The sampler runs ``steps`` steps
    (TEST_STEPS) unless ``mutate`` sets them; the zero-shot classifier has TEST_TEMPLATES."""
    import yaml

    from pipeline.cli import TINY_CONFIG
    from pipeline.demo.assets import ensure_tiny_assets

    ensure_tiny_assets()
    text = TINY_CONFIG.read_text().replace("../assets/", str(TINY_CONFIG.parent.parent / "assets") + "/")
    raw = yaml.safe_load(text)
    raw.setdefault("aggregate", {})["plots"] = plots
    raw["generator"]["steps"] = steps
    for clf in raw["classifiers"]:
        if clf["kind"] == "open_clip_zeroshot":
            clf["templates"] = list(TEST_TEMPLATES)
    if mutate:
        mutate(raw)
    path = Path(directory) / name
    path.write_text(yaml.safe_dump(raw))
    return path


def shared_output(tmp_path_factory, name: str, make, prepare=None):
    """(``prepare(root)``, ``root/out``): an output made by ``make(prepared, out)`` once per
    test run and shared read-only by every test worker (pytest-xdist): the first worker to
    ask makes it under a file lock, the others wait for it and read it.  ``prepare`` runs
    under the lock in every worker (e.g. writing the config the output is built from)."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    root.mkdir(exist_ok=True)
    out, done = root / "out", root / "done"
    with FileLock(str(root / "lock")):
        prepared = prepare(root) if prepare else None
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)  # a build that did not finish
            make(prepared, out)
            done.touch()
    return prepared, out


def shared_build(tmp_path_factory, name: str, make_config) -> tuple[Path, Path]:
    """(config, output) of an in-process build of ``make_config(directory)``, made once per
    test run and shared read-only by every test worker (:func:`shared_output`)."""

    def make(cfg: Path, out: Path) -> None:
        assert build_here(cfg, out) == 0

    return shared_output(tmp_path_factory, name, make, make_config)


def wait_for_pause(proc, fault_dir: Path, rule: str, output) -> None:
    """Until the build ``proc`` pauses at ``rule`` (its marker in ``fault_dir``); AssertionError,
    with the tail of ``output()``, when it ends first or not within SUBPROCESS_BUILD_S."""
    deadline = time.time() + SUBPROCESS_BUILD_S
    while not list(fault_dir.glob("paused-*")):
        if proc.poll() is not None:
            raise AssertionError(f"build ended before reaching {rule}: {output()[-3000:]}")
        if time.time() > deadline:
            raise AssertionError(f"build never reached {rule}")
        time.sleep(0.2)


def build_cmd(cfg: Path, out: Path, runner: str, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "pipeline.cli", "build", str(cfg), "--output", str(out), "--runner", runner, *extra]
    return ["unshare", "-p", "-f", "--mount-proc", *cmd] if HAS_UNSHARE else cmd


def env_with(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNSBENCH_FAULT")}
    env.update(HF_HUB_OFFLINE="1", RAY_DATA_DISABLE_PROGRESS_BARS="1", **extra)
    return env


def build_here(cfg: Path, out: Path | str, *extra: str) -> int:
    """The same build in this process (runner local): for the runs that nothing kills, so
    the tests do not pay a new interpreter and its imports for each."""
    from pipeline.cli import main

    return main(["build", str(cfg), "--output", str(out), "--runner", "local", *extra])


def kill_at(cfg: Path, out: Path | str, runner: str, rule: str, fault_dir: Path, env: dict | None = None) -> None:
    """Start a build that pauses at the fault rule's point, then SIGKILL all of it there
    (``env``: more variables for the build, e.g. a storage server's).

    A local build runs in a child forked from this process (:func:`_kill_forked`); a Ray
    build in a fresh interpreter in its own PID namespace, whose init the kill takes with
    every Ray process of the build."""
    fault_dir.mkdir(parents=True, exist_ok=True)
    if runner == "local":
        return _kill_forked(cfg, out, rule, fault_dir, env or {})
    env = env_with(CNSBENCH_FAULT_INJECT=rule, CNSBENCH_FAULT_DIR=str(fault_dir), **(env or {}))
    proc = subprocess.Popen(build_cmd(cfg, out, runner), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for_pause(proc, fault_dir, rule, lambda: proc.stdout.read().decode())
    finally:
        # The namespace's init is unshare's child: killing it kills the whole namespace.
        if HAS_UNSHARE:
            children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
            for pid in children:
                os.kill(int(pid), signal.SIGKILL)
        proc.kill()
        proc.wait(timeout=60)


class ForkedBuild:
    """A ``cnsbench`` command (the CLI's ``main(argv)``) in a child forked from this process:
    a whole process of its own, which a signal stops or kills as it would a fresh
    interpreter, but which starts with this process's imports (and models already loaded
    in process), so it does not pay a new interpreter's torch and diffusers (about 15
    CPU-seconds here).  ``env`` is its whole environment (default: this process's); what it
    prints goes to ``log`` (its stderr to ``err_log`` when given).  It has the part of
    :class:`subprocess.Popen` the tests and ``bench/chaos.py`` use: ``pid``, ``poll``,
    ``send_signal``, ``kill``, ``wait``, ``returncode``."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None,
                 err_log: Path | None = None) -> None:
        self.returncode: int | None = None
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:  # the child: the command, until it ends or is killed
            code = 99
            try:
                out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                err = os.open(err_log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if err_log else out
                os.dup2(out, 1)
                os.dup2(err, 2)
                sys.stdout = open(1, "w", buffering=1, closefd=False)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                if env is not None:
                    os.environ.clear()
                    os.environ.update(env)
                from pipeline.cli import main

                code = main([str(a) for a in argv])
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 1
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked pid {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _kill_forked(cfg: Path, out: Path | str, rule: str, fault_dir: Path, env: dict) -> None:
    """A local build (``cnsbench build --runner local``) in a :class:`ForkedBuild`, SIGKILLed
    at the rule's pause: a kill costs the build's work up to the pause and not a new
    interpreter's imports.  What it prints goes to ``fault_dir/build.log``."""
    log = fault_dir / "build.log"
    child_env = env_with(CNSBENCH_FAULT_INJECT=rule, CNSBENCH_FAULT_DIR=str(fault_dir), **env)
    proc = ForkedBuild(["build", cfg, "--output", out, "--runner", "local"], log, env=child_env)
    try:
        wait_for_pause(proc, fault_dir, rule, log.read_text)
    finally:
        proc.kill()
        proc.wait()  # reaped: its lease on the output names a dead process


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


LIGHT_CLASSIFIERS = {"tiny-resnet"}
# The filter's columns of the samples table.
FILTER_COLUMNS = [*schema.SCORE_COLUMNS, *schema.REALISATION_COLUMNS, "n_pass", "kept"]


def light(raw: dict) -> None:
    """A ``tiny_config`` mutation for builds whose subject is their path (a killed Ray build,
    a cluster), not the models: no filter, one classifier, so each actor it starts (and
    starts again after a kill) imports and loads less.  Every other Ray build runs them all."""
    raw["filter"]["enabled"] = False
    raw["classifiers"] = [c for c in raw["classifiers"] if c["name"] in LIGHT_CLASSIFIERS]


def assert_same_as_full(light_snap: dict, full_snap: dict) -> None:
    """A ``light`` build equals the full tiny build (``tiny_reference``) where they share
    columns: coordinates, shards and image bytes, and tiny-resnet's predictions."""
    assert set(light_snap["images"]) == set(full_snap["images"]) and len(light_snap["images"]) == 48
    assert light_snap["images"] == full_snap["images"]  # byte-identical on CPU
    pd.testing.assert_frame_equal(light_snap["samples"].drop(columns=FILTER_COLUMNS),
                                  full_snap["samples"].drop(columns=FILTER_COLUMNS))
    assert light_snap["samples"]["kept"].all()  # without the filter every image is kept
    full = full_snap["predictions"]
    full = full[full["classifier"].isin(LIGHT_CLASSIFIERS)].reset_index(drop=True)
    pd.testing.assert_frame_equal(light_snap["predictions"].reset_index(drop=True), full)


def assert_same(a: dict, b: dict) -> None:
    assert set(a["images"]) == set(b["images"]) and len(a["images"]) == 48
    assert a["images"] == b["images"]  # byte-identical on CPU
    assert a["samples"]["sample_id"].is_unique and b["samples"]["sample_id"].is_unique
    pd.testing.assert_frame_equal(a["samples"], b["samples"])
    pd.testing.assert_frame_equal(a["predictions"], b["predictions"])


