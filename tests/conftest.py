"""Shared fixtures: offline environment, tiny random-weight models built once per session."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One OpenMP thread per process: tests start several processes (Ray workers, builds in
# subprocesses) on a 2-core machine, and oversubscribed OpenMP threads spin-wait each other
# into slowdowns of 10x and more.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402


# `./scripts/test` runs the suite on parallel workers (pytest-xdist): every module is one
# unit of work, so its module fixtures are built once, and modules that share an expensive
# fixture of their worker form one unit.  Units start longest first (measured with
# --durations on a 2-core machine), so no worker is left with a long module at the end;
# modules not listed follow in file order.  The modules that build on the test worker's own
# Ray (the ``ray_session`` fixture) form one unit, "ray": one Ray start for all of them
# instead of one per module (about 20 CPU-seconds each), and never two of their builds at
# once.  The demo world's modules share one build of the whole run (``demo_world``, made by
# the first worker to ask while the others wait), so they are units of their own, spread
# over the workers; they alternate with modules that do not need it, so that a worker
# arriving while the build is made has other work.  The module that starts a Ray cluster of
# its own (test_cluster) comes after the long in-process ones: two Ray builds at once on
# two cores start their actors many times slower than one.
LONGEST_FIRST = (
    "ray",
    "test_card_world",
    "test_corruption_world",
    "test_python_docs",
    "test_ximagenet_world",
    "test_refine_demo",
    "test_cluster",
    "test_autoscale",
    "test_imagenet_d_world",
    "test_world",
    "test_imagenet_e_world",
    "test_api_models",
    "test_rehearsal",
    "test_families_plugin",
    "test_chaos",
    "test_object_storage",
    "test_resume",
    "test_stopping",
    "test_hostile_round2",
    "test_evaluate",
    "test_refine",
    "test_report_demo",
)
SHARED_UNITS = {
    "test_build_e2e": "ray", "test_bench_smoke": "ray", "test_classify_groups": "ray", "test_serve": "ray",
    "test_train_sliders": "ray", "test_api_models_ray": "ray",
}


def _unit(nodeid: str) -> str:
    stem = Path(nodeid.split("::")[0]).stem
    return SHARED_UNITS.get(stem, stem)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Hand out whole units (above) in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    config.option.loadscopereorder = False
    return UnitScheduling(config, log)


def pytest_configure(config):
    for tier, what in (("unit", "no Ray, no build, no subprocess (tests/tiers.py)"),
                       ("integration", "in-process builds, the session's tiny and demo builds"),
                       ("cluster", "Ray, clusters, the worlds' builds, the benches, the browser")):
        config.addinivalue_line("markers", f"{tier}: {what}")


def pytest_itemcollected(item):
    """Mark every test with its tier (tests/tiers.py), before ``-m`` selects among them."""
    import tiers

    tier = tiers.infer(item)
    item.stash[TIER] = tier
    item.user_properties.append(("tier", tier))  # in the JUnit report (scripts/suite_profile.py)
    if item.get_closest_marker(tier) is None:
        item.add_marker(tier)


TIER = pytest.StashKey[str]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """In the unit tier, ``ray.init``, ``OutputRun.claim`` and subprocess builds fail naming the
    test: through its set-up (module and session fixtures made for it too), call and teardown."""
    if item.stash.get(TIER, None) != "unit":
        yield
        return
    import tiers

    with tiers.guard(item.nodeid):
        yield


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """The units' order (after ``-m`` deselected: what Ray's stop waits for is among the selected)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_unit(item.nodeid), len(rank)))  # stable: file order otherwise
    # Whether a later test of the same unit uses this worker's Ray: it stays up until then.
    later = set()
    for item in reversed(items):
        unit = _unit(item.nodeid)
        item.stash[RAY_LATER] = unit in later
        if RAY_FIXTURES & set(item.fixturenames):
            later.add(unit)
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


def _start_ray():
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",  # this worker's own Ray, never another test worker's
            num_cpus=4,
            num_gpus=1,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}},
        )
    return ray


@pytest.fixture(scope="module")
def ray_session():
    """The test worker's local Ray, for every test that needs Ray (started on first use).

    Four logical CPUs and one logical GPU, so the GPU scheduling path runs here; models
    fall back to the CPU.  Tests must not shut it down (Serve tests call
    ``serve.shutdown()`` only); it is stopped after the last test of its unit that uses it
    (``pytest_runtest_teardown``): an idle Ray costs a few percent of a core.
    """
    yield _start_ray()


RAY_FIXTURES = {"ray_session"}
RAY_LATER = pytest.StashKey[bool]()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Stop this worker's Ray (started by ``ray_session`` or by a build on the default runner)
    at a module's end unless a later test of the same unit, or the next module, uses it."""
    import sys

    if nextitem is not None and (
        nextitem.module is item.module or item.stash.get(RAY_LATER, False) or RAY_FIXTURES & set(nextitem.fixturenames)
    ):
        return
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def tiny_reference(tmp_path_factory) -> Path:
    """One uninterrupted in-process build of the tests' tiny config (``buildproc.tiny_config``
    with its defaults), shared read-only by every test worker: what killed, resumed and
    cluster builds of that config must equal.  A test that changes it copies it."""
    from buildproc import shared_build, tiny_config

    return shared_build(tmp_path_factory, "tiny-reference", tiny_config)[1]


@pytest.fixture(scope="session")
def demo_world(tmp_path_factory):
    """One ``cnsbench demo`` build (configs/demo.yaml) per test run, shared read-only by the
    world, report, card, API and digest tests of every test worker (``buildproc.shared_output``:
    the first worker to ask builds it, the others wait for it); a test that changes an
    output copies it first.

    It runs in process (``--runner local``): a Ray build of the world costs about 1.6x
    the CPU, and a build's output does not depend on the runner (ids and seeds come from
    coordinates, and each stage computes with its ``num_cpus`` torch threads under both,
    tests/test_runner_threads.py); Ray's shards equal in-process ones in
    tests/test_cluster.py, and the default runner, Ray, builds the tiny config in
    tests/test_build_e2e.py."""
    from buildproc import shared_output

    from pipeline.cli import main
    from pipeline.runtime.checkout import REPO_ROOT

    if not (REPO_ROOT / "assets" / "world" / "world.json").is_file():
        pytest.skip("the shipped world (assets/world) is missing")

    def make(_, out: Path) -> None:
        assert main(["demo", "--runner", "local", "--output", str(out)]) == 0

    return shared_output(tmp_path_factory, "demo-world", make)[1]


@pytest.fixture(scope="module")
def synthetic_demo(tmp_path_factory) -> Path:
    """A committed output of configs/demo.yaml's whole plan (360 images of 8x8 made-up pixels,
    made-up scores and predictions) written by the real write stage in a fraction of a second
    (``hostile.synthetic_output``): for the tests of a function that needs an output to point
    at (the API's and commands' argument checks, refusals before any write) but none of the
    demo world's pixels or models, so they are unit tests.  Read-only: a test that changes it
    copies it first.  What needs the real world's images or numbers uses the session's demo build."""
    from hostile import synthetic_output

    from pipeline.runtime.checkout import REPO_ROOT

    out = tmp_path_factory.mktemp("synthetic-demo") / "out"
    synthetic_output(out, REPO_ROOT / "configs" / "demo.yaml", per_shard=4)  # the config's trajectories_per_shard
    return out


@pytest.fixture(scope="module")
def tiny_assets_one_thread(one_torch_thread):
    """The tiny config's assets built (once per checkout), and one torch thread for the module."""
    from pipeline.demo.assets import ensure_tiny_assets

    ensure_tiny_assets()
    yield


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module's tiny models: they gain nothing from more, and on a busy
    2-core machine OpenMP threads spinning against other processes make each op ~100x slower.
    A module asks for it with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
