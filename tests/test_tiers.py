"""The suite's tiers (tests/tiers.py): what a test uses chooses its tier, and the unit tier's guard."""

from __future__ import annotations

import re
import subprocess
import sys

import conftest
import hostile
import pytest
import tiers

# Said outright: this module's sources name ray.init, which inspection counts as cluster.
pytestmark = pytest.mark.unit


def test_the_guard_fails_a_ray_init_in_the_unit_tier_naming_the_test(request):
    import ray

    with pytest.raises(tiers.TierError, match=re.escape(request.node.nodeid) + ".*ray.init"):
        ray.init(address="local", num_cpus=1, include_dashboard=False)
    assert not ray.is_initialized()


@pytest.fixture(scope="module")
def ray_init_in_a_module_fixture() -> str:
    """What a module fixture of a unit test gets from ``ray.init``: the guard's message."""
    import ray

    try:
        ray.init(address="local", num_cpus=1, include_dashboard=False)
    except tiers.TierError as refused:
        return str(refused)
    ray.shutdown()
    return "ray.init started Ray"


def test_the_guard_covers_the_fixtures_made_for_a_unit_test(ray_init_in_a_module_fixture, request):
    assert ray_init_in_a_module_fixture.startswith(request.node.nodeid + " is a unit test")


def test_the_guard_fails_a_claim_of_an_output_and_a_subprocess_build(request, tmp_path):
    from pipeline.output_run import OutputRun

    ran = []
    with pytest.raises(tiers.TierError, match=re.escape(request.node.nodeid) + ".*OutputRun.claim"):
        with OutputRun.claim(str(tmp_path / "out"), "build"):
            ran.append(True)
    assert not ran  # the run's block never starts
    # A claim the output's own checks refuse raises their error (the checks' unit tests).
    (tmp_path / "file").write_text("not an output")
    with pytest.raises(Exception) as refused:
        with OutputRun.claim(str(tmp_path / "file"), "build"):
            ran.append(True)
    assert not isinstance(refused.value, tiers.TierError) and not ran
    with pytest.raises(tiers.TierError, match="pipeline.cli build"):
        subprocess.run([sys.executable, "-m", "pipeline.cli", "build", "x.yaml"])
    # Other subprocesses (a tool's version, a short snippet) are allowed.
    assert subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True).stdout == "1\n"


def test_the_guard_puts_back_what_it_replaced():
    import ray

    from pipeline.output_run import OutputRun

    def patched():
        return ray.init, OutputRun.__dict__["claim"], subprocess.Popen.__init__

    before = patched()
    with tiers.guard("tests/x.py::test_x"):
        assert patched()[0] is not before[0] and patched()[2] is not before[2]
    assert patched() == before


def _builds(tmp_path):
    from buildproc import build_here

    return build_here(tmp_path / "tiny.yaml", tmp_path / "out")


def test_fixtures_and_helpers_choose_the_tier():
    assert tiers.TIERS[tiers._tier_of(conftest.ray_session)] == "cluster"
    assert tiers.TIERS[tiers._tier_of(conftest.demo_world)] == "integration"
    assert tiers.TIERS[tiers._tier_of(conftest.tiny_reference)] == "integration"
    assert tiers.TIERS[tiers._tier_of(conftest.tiny_sd)] == "integration"
    # A synthetic output written by the write stage, no build: unit.
    assert tiers.TIERS[tiers._tier_of(hostile.built)] == "unit"
    # A module's own helper that builds makes its callers integration.
    assert tiers.TIERS[tiers._tier_of(_builds)] == "integration"


def test_collected_tests_carry_their_tier(request):
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.stash[conftest.TIER] == "unit"
