"""scripts/suite_profile.py: the suite's seconds per module, and the machine's CPU beside them."""

from __future__ import annotations

from pathlib import Path

import pytest
from scriptload import load_script

ROOT = Path(__file__).resolve().parents[1]


def _load():
    return load_script("scripts/suite_profile.py", "suite_profile")


def test_seconds_per_module_add_up_from_the_junit_report(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="test_one" time="1.5"/>'
        '<testcase classname="tests.test_a.TestGroup" name="test_two" time="0.25"/>'
        '<testcase classname="tmp.test_run_0.test_b" name="test_three" time="2.0"/>'
        "</testsuite></testsuites>")
    assert dict(_load().by_module(report)) == {"test_a": 1.75, "test_b": 2.0}


def test_seconds_per_tier_come_from_each_test_s_tier_property(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="one" time="1.5">'
        '<properties><property name="tier" value="unit"/></properties></testcase>'
        '<testcase classname="tests.test_a" name="two" time="0.25">'
        '<properties><property name="tier" value="unit"/></properties></testcase>'
        '<testcase classname="tests.test_b" name="three" time="2.0">'
        '<properties><property name="tier" value="cluster"/></properties></testcase>'
        '<testcase classname="tests.test_c" name="four" time="1.0"/>'
        "</testsuite></testsuites>")
    assert _load().by_tier(report) == {"unit": {"tests": 2, "seconds": 1.8}, "cluster": {"tests": 1, "seconds": 2.0},
                                       "unknown": {"tests": 1, "seconds": 1.0}}


# It runs ./scripts/test (a pytest in a subprocess, and the virtual environment's set-up).
@pytest.mark.integration
def test_a_run_reports_its_module_and_the_machine_s_cpu(tmp_path, capsys):
    test = tmp_path / "test_sleeper.py"
    test.write_text("import time\n\ndef test_sleeps():\n    time.sleep(0.3)\n")
    out = _load().main([str(test), "-n", "0"])
    assert out["pytest_exit"] == 0 and set(out["by_module"]) == {"test_sleeper"}
    assert 0.3 <= out["worker_s"] <= out["wall_s"]
    assert 0 < out["busy_share"] <= 1 and out["busy_cpu_s"] > 0
