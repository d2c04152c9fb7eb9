"""A newcomer's first hour: every shipped config runs from the command line of a fresh clone.

* ``validate`` passes for every config in ``configs/`` whose files ship or are made on
  first use (the tiny random-weight assets); a config naming hub weights that are not here
  (``cns_bench.yaml``) exits 2 listing them, never with a traceback;
* a fresh clone (no ``assets/tiny``) gets its tiny assets from the first command;
* ``train-sliders configs/tiny.yaml`` trains at the tiny model's scale and says how far it is;
* a command's terminal shows the project's lines, not third-party notices.

All in process; the one asset build goes into a temporary checkout.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.runtime.checkout import REPO_ROOT, TINY_CONFIG
from pipeline.cli import main

# Suites (configs/suite_*.yaml) name benchmarks rather than a build: tests/test_card.py checks them.
CONFIGS = sorted(p for p in (REPO_ROOT / "configs").glob("*.yaml") if not p.name.startswith("suite_"))
# Configs whose weights come from a model hub: validate lists what is not cached here.
HUB_CONFIGS = {"cns_bench.yaml"}


@pytest.fixture(scope="module")
def tiny_assets():
    from pipeline.demo.assets import ensure_tiny_assets

    return ensure_tiny_assets()


def test_the_shipped_configs_are_the_ones_checked_here():
    assert {p.name for p in CONFIGS} >= {"tiny.yaml", "demo.yaml", "cns_bench.yaml"}
    assert HUB_CONFIGS <= {p.name for p in CONFIGS}


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_shipped_config_validates(config, tiny_assets, capsys):
    """Each build config validates (suites are checked with the cards)."""
    if config.name.startswith(("demo", "world_")) and not (REPO_ROOT / "assets" / "world" / "world.json").is_file():
        pytest.skip("the shipped world (assets/world) is missing")
    code = main(["validate", str(config)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert f"config {config}: valid" in out
    if config.name in HUB_CONFIGS:
        assert code == 2, out
        assert "problem(s):" in out
        assert "stabilityai/stable-diffusion-2" in out  # the hub weights not cached here are named
    else:
        assert code == 0, out
        assert "all assets present" in out


def test_a_fresh_clone_makes_the_tiny_assets_on_first_use(tmp_path, monkeypatch, capsys):
    """``cnsbench validate configs/tiny.yaml`` in a checkout without ``assets/tiny``: exit 0."""
    import pipeline.demo.assets as assets

    clone = tmp_path / "clone"
    (clone / "configs").mkdir(parents=True)
    shutil.copy(TINY_CONFIG, clone / "configs" / "tiny.yaml")
    monkeypatch.setattr(assets, "TINY_ROOT", clone / "assets" / "tiny")
    config = str(clone / "configs" / "tiny.yaml")

    assert main(["validate", config]) == 0
    out = capsys.readouterr().out
    assert f"building the tiny random-weight assets in {clone / 'assets' / 'tiny'}" in out
    assert "all assets present" in out
    assert (clone / "assets" / "tiny" / "sd2-tiny" / "model_index.json").is_file()
    # Made once: the second command finds them.
    assert main(["validate", config]) == 0
    assert "building the tiny" not in capsys.readouterr().out


def test_a_config_outside_the_tiny_assets_makes_nothing(tmp_path, monkeypatch):
    import pipeline.demo.assets as assets
    from pipeline.config import load_config

    monkeypatch.setattr(assets, "TINY_ROOT", tmp_path / "assets" / "tiny")
    assets.ensure_config_assets(load_config(REPO_ROOT / "configs" / "demo.yaml"), echo=pytest.fail)
    assert not (tmp_path / "assets").exists()


# ----------------------------------------------------------------------------- slider training
def test_every_shipped_config_trains_sliders_at_its_own_scale():
    from pipeline.config import load_config

    for config in CONFIGS:
        raw = yaml.safe_load(config.read_text())
        assert "slider_training" in raw, f"{config.name}: no slider_training section"
    tiny = load_config(TINY_CONFIG)
    st = tiny.slider_training
    # The 64 px toy model, not the paper's 400 iterations of 16 latents at 512 px on a GPU.
    assert st.resolution == tiny.generator.resolution == 64
    assert st.batch_size == 1 and st.iterations <= 50 and st.max_denoise_steps <= 10
    assert st.resources.num_gpus == 0 and st.dtype == "float32"
    paper = load_config(REPO_ROOT / "configs" / "cns_bench.yaml").slider_training
    assert (paper.iterations, paper.resolution, paper.batch_size) == (400, 512, 16)


def test_train_sliders_on_the_tiny_config_prints_progress_inside_a_slider(tiny_assets, tmp_path, monkeypatch, capsys):
    import pipeline.train.sliders as sliders

    monkeypatch.setattr(sliders, "ITERATION_REPORT_S", 0.0)  # every iteration reports
    store = tmp_path / "sliders"
    code = main(["train-sliders", str(TINY_CONFIG), "--output", str(store), "--runner", "local", "--iterations", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "[cnsbench] slider painting_style/001_goldfish: 1/2 iterations (50%)" in out
    assert "iterations/s, ETA 0:00:" in out
    assert "sliders: 4 pairs, 4 trained, 0 skipped (done), 0 failed" in out
    for shift in ("painting_style", "heavy_snow"):
        for c in (1, 22):
            meta = json.loads((store / shift / f"{c:03d}.json").read_text())
            assert (meta["iterations"], meta["resolution"], meta["batch_size"]) == (2, 64, 1)
            assert (store / shift / f"{c:03d}.safetensors").is_file()


# ----------------------------------------------------------------------------- quiet terminal
def test_class_tokens_are_installed_without_the_embedding_notice(tiny_assets, monkeypatch):
    """Resizing the text encoder's table for the class tokens skips transformers' mean/covariance
    initialisation (the rows are overwritten) and its notice."""
    import torch
    import transformers.modeling_utils as mu

    from pipeline.config import load_config
    from pipeline.models import diffusion

    notices: list[str] = []
    monkeypatch.setattr(mu.logger, "warning_once", lambda msg, *a, **k: notices.append(str(msg)))
    cfg = load_config(TINY_CONFIG)
    pipe = diffusion.load_pipeline(cfg.generator.model, torch.float32, "cpu")
    rows = pipe.text_encoder.get_input_embeddings().weight.shape[0]
    tokens = diffusion.install_class_tokens(pipe, cfg.generator.class_tokens, [1, 22], cfg.benchmark.label_space)
    assert not [n for n in notices if "new embeddings" in n]
    table = pipe.text_encoder.get_input_embeddings().weight
    assert table.shape[0] == rows + 2 == len(pipe.tokenizer)
    for c in (1, 22):
        saved = next(iter(torch.load(Path(cfg.generator.class_tokens.path) / f"{c}.bin").values()))
        assert torch.equal(table[pipe.tokenizer.convert_tokens_to_ids(tokens[c])], saved)


def test_native_stderr_noise_is_dropped_and_everything_else_kept(capfd, monkeypatch):
    from pipeline.runtime import progress
    noise = (
        b"[2026-11-25 18:04:44,323 E 10240 10240] core_worker.cc:2465: Actor with class name: "
        b"'MapWorker(MapBatches(GenerateStage))' and ID: 'bf93' has constructor arguments in the "
        b"object store and max_restarts > 0. If the arguments ... are lost, the actor restart will fail.\n"
    )
    monkeypatch.setattr(progress, "_VERBOSE", False)
    with progress.native_stderr_filtered():
        os.write(2, b"kept 1\n" + noise + b"kept 2\nkept 3 (no newline)")
    assert capfd.readouterr().err == "kept 1\nkept 2\nkept 3 (no newline)"
    monkeypatch.setattr(progress, "_VERBOSE", True)  # cnsbench -v shows everything
    with progress.native_stderr_filtered():
        os.write(2, noise)
    assert capfd.readouterr().err == noise.decode()


@pytest.mark.parametrize("quiet, notices, index", [
    ("quiet_local_ray", "LOCAL_RAY_NOTICES", 0), ("quiet_local_ray", "LOCAL_RAY_NOTICES", 1),
    ("quiet_ray_data", "RAY_DATA_TASK_ERRORS", 0), ("quiet_ray_data", "RAY_DATA_TASK_ERRORS", 1),
    ("quiet_ray_data", "RAY_DATA_TASK_ERRORS", 2),
], ids=["token_auth", "starvation", "task_error", "user_code", "stack_trace"])
def test_rays_notices_show_only_with_verbose(quiet, notices, index, monkeypatch, caplog):
    """Token authentication stays on, the cluster is sized for every pool, a stage's error is
    re-raised by the executor (one line for a user's error, the actor's traceback for a bug):
    Ray's notices saying so need -v; other messages of the same loggers still show."""
    import logging

    from pipeline.runtime import progress
    import ray  # noqa: F401  (Ray's own logging set-up, as in a build)

    name, start = getattr(progress, notices)[index]
    logger = logging.getLogger(name)
    monkeypatch.setattr(logger, "handlers", [caplog.handler])  # whether or not Ray's loggers propagate
    notice = start + " ... (the rest of Ray's message)"
    other = "Token authentication is disabled for this Ray cluster. Anyone with network access ..."
    monkeypatch.setattr(progress, "_VERBOSE", False)
    getattr(progress, quiet)()
    with caplog.at_level(logging.WARNING):
        logger.warning(notice)
        logger.warning(other)
    shown = {r.getMessage() for r in caplog.records}
    assert shown == {other}
    caplog.clear()
    monkeypatch.setattr(progress, "_VERBOSE", True)
    getattr(progress, quiet)()
    with caplog.at_level(logging.WARNING):
        logger.warning(notice)
    assert {r.getMessage() for r in caplog.records} == {notice}


def test_model_libraries_progress_bars_are_off_without_verbose(monkeypatch):
    from pipeline.runtime import progress
    for name in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(progress, "_VERBOSE", True)
    progress.set_verbose(False)
    assert os.environ["TQDM_DISABLE"] == os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    from diffusers.utils import logging as diffusers_logging

    was = diffusers_logging.is_progress_bar_enabled()
    try:
        diffusers_logging.enable_progress_bar()
        monkeypatch.setattr(progress, "_VERBOSE", True)
        progress.quiet_model_libraries()
        assert diffusers_logging.is_progress_bar_enabled()  # -v: diffusers shows its bars
        monkeypatch.setattr(progress, "_VERBOSE", False)
        progress.quiet_model_libraries()
        assert not diffusers_logging.is_progress_bar_enabled()
    finally:
        (diffusers_logging.enable_progress_bar if was else diffusers_logging.disable_progress_bar)()


def test_the_command_line_starts_without_the_model_libraries():
    """`cnsbench --help`, `status`, `jobs` and `submit` load no model library: the parser of every
    command imports torch, diffusers, timm, open_clip and Ray only when a command runs that needs
    them (a fresh process, as a shell's is)."""
    import subprocess
    import sys

    snippet = ("import sys\nfrom pipeline.cli import make_parser\nmake_parser()\n"
               "print(sorted(m for m in ('torch', 'diffusers', 'timm', 'open_clip', 'transformers', 'peft', 'ray')"
               " if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout
