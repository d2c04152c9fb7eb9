"""Shared fixtures: offline environment, tiny random-weight models built once per session."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One OpenMP thread per process: tests start several processes (Ray workers, builds in
# subprocesses) on a 2-core machine, and oversubscribed OpenMP threads spin-wait each other
# into slowdowns of 10x and more.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:
        has_gpu = False
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_sd(tmp_path_factory):
    """A tiny SD2-shaped diffusers model directory with random weights."""
    from pipeline.demo.tiny_sd import build_sd2

    return str(build_sd2(tmp_path_factory.mktemp("sd2") / "model", size="tiny"))


@pytest.fixture(scope="session")
def tiny_world(tiny_sd, tmp_path_factory):
    """Class tokens (ti_folder layout) and random non-zero sliders for classes 1, 22 and shifts a/b."""
    import torch
    from diffusers import UNet2DConditionModel

    from pipeline.labels import label_space
    from pipeline.models.diffusion import ti_token
    from pipeline.models.lora import random_slider, save_slider_file

    root = tmp_path_factory.mktemp("world")
    tokens = root / "tokens"
    tokens.mkdir()
    gen = torch.Generator().manual_seed(0)
    for c in (1, 22):
        torch.save({ti_token(c, label_space().name(c)): torch.randn(32, generator=gen)}, tokens / f"{c}.bin")
    unet = UNet2DConditionModel.from_pretrained(tiny_sd, subfolder="unet")
    store = root / "sliders"
    for i, shift in enumerate(("shift_a", "shift_b")):
        for c in (1, 22):
            state = random_slider(unet, seed=100 * i + c, std=0.3)
            save_slider_file(state, str(store / shift / f"{c:03d}.safetensors"))
    return {"model": tiny_sd, "tokens": str(tokens), "sliders": str(store), "classes": [1, 22], "shifts": ["shift_a", "shift_b"]}


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for every test that needs Ray (started on first use, stopped at the end).

    Four logical CPUs and one logical GPU, so the GPU scheduling path runs here; models
    fall back to the CPU.  Tests must not shut it down: Serve tests call
    ``serve.shutdown()`` only.
    """
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=4,
            num_gpus=1,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}},
        )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def demo_world(tmp_path_factory, ray_session):
    """One ``cnsbench demo`` build (configs/demo.yaml on the session's Ray), shared read-only
    by the world, report and digest tests; a test that changes an output copies it first."""
    from pipeline.checkout import REPO_ROOT
    from pipeline.cli import main

    if not (REPO_ROOT / "assets" / "world" / "world.json").is_file():
        pytest.skip("the shipped world (assets/world) is missing")
    out = tmp_path_factory.mktemp("demo-world") / "out"
    assert main(["demo", "--output", str(out)]) == 0
    return out
