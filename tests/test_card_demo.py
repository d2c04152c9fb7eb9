"""Cards on the session's demo build: the suite's CNS entry uses the demo's output, and the card's exports.

After ``./scripts/demo`` a card over ``configs/suite_world.yaml`` finds the CNS benchmark in
``runs/demo`` (the entry's ``reuse``: the first existing output of the same benchmark)
instead of building it again; an output folder given as the suite is the quickest card.
The card's ``model-index.yaml`` parses back (``huggingface_hub.ModelCard``) to card.json's
values and ``unaggregated.csv`` equals the output's own report.  The demo build is
read-only here: the world's ``linear`` is already in it, so nothing is added.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from pipeline.card.suite import load_suite
from pipeline.cli import main

REPO = Path(__file__).resolve().parents[1]


def test_the_world_suite_looks_for_the_demos_output_first():
    suite = load_suite(REPO / "configs" / "suite_world.yaml")
    cns = suite.benchmarks[0]
    assert cns.name == "cns" and cns.reuse == (str(REPO / "runs" / "demo"),)
    assert all(not b.reuse for b in suite.benchmarks[1:])
    # an explicit --outputs folder is where every output goes: nothing is looked for elsewhere
    assert load_suite(REPO / "configs" / "suite_world.yaml", outputs="/elsewhere").benchmarks[0].reuse == ()


def _mtimes(out: Path) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != "lease.json"}


def test_a_card_uses_the_built_demo_instead_of_building_it(demo_world, tmp_path, capsys):
    from huggingface_hub import ModelCard

    suite = tmp_path / "suite.yaml"
    suite.write_text(f"suite: world\noutputs: {tmp_path / 'outputs'}\nbenchmarks:\n"
                     f"  - {{name: cns, family: cns, config: {REPO}/configs/demo.yaml, protocol: custom, "
                     f"reuse: [{tmp_path / 'absent'}, {demo_world}]}}\n")
    before = _mtimes(demo_world)
    assert main(["card", "linear", "--suite", str(suite), "--output", str(tmp_path / "card"), "--runner", "local"]) == 0
    assert f"using the existing output {demo_world}" in capsys.readouterr().out
    assert not (tmp_path / "outputs").exists() and _mtimes(demo_world) == before  # nothing built, nothing added
    card = json.loads((tmp_path / "card" / "card.json").read_text())
    (entry,) = card["benchmarks"]
    assert entry["output"] == str(demo_world)

    parsed = ModelCard(f"---\n{(tmp_path / 'card' / 'model-index.yaml').read_text()}---\n").data
    (result,) = parsed.eval_results
    assert (parsed.model_name, result.dataset_name, result.metric_type) == ("linear", "cns", entry["metric"])
    assert result.metric_value == pytest.approx(entry["value"]) and result.verified is False
    # no corruption benchmark: no RobustBench entry (its leaderboard ranks by corruptions_acc), and the page says so
    assert not (tmp_path / "card" / "robustbench.json").exists()
    assert "No robustbench.json: the suite has no corruption benchmark" in (tmp_path / "card" / "card.html").read_text()

    table = pd.read_csv(tmp_path / "card" / "unaggregated.csv")
    report = pd.read_csv(demo_world / "report" / "accuracy.csv")
    report = report[(report["classifier"] == "linear") & (report["shift"] != "all")]
    mine = table.set_index(["shift", "scale"])["accuracy"]
    theirs = report.set_index(["shift", "scale"])["accuracy"]
    assert len(mine) == len(theirs) and (mine.loc[theirs.index] - theirs).abs().max() < 1e-12

    # the quickest card: the output itself as the suite, one command
    assert main(["card", "linear", "--suite", str(demo_world), "--output", str(tmp_path / "quick"), "--runner", "local"]) == 0
    quick = json.loads((tmp_path / "quick" / "card.json").read_text())
    assert quick["benchmarks"][0]["value"] == entry["value"] and quick["benchmarks"][0]["output"] == str(demo_world)
    assert _mtimes(demo_world) == before

    # a model the reused output lacks: scored into the card's own output, the output only read
    import cnsbench
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    pre = {"resize": 32, "crop": 32, "interpolation": "bilinear", "mean": [0.5] * 3, "std": [0.5] * 3}
    mine = cnsbench.card(net, suite, output=tmp_path / "mine", name="mine", preprocess=pre, echo=lambda m: None)
    assert mine["benchmarks"][0]["output"] == str(tmp_path / "mine" / "outputs" / "cns")
    assert not (tmp_path / "outputs").exists() and _mtimes(demo_world) == before
