"""docs/python.md runs: every ```python block, in order, on a copy of the session's demo build (slow).

The page defines a small CNN for the demo world's classes, evaluates it in memory, reads its
failure points, refines them, makes its card and a leaderboard, loads the benchmark as
datasets, and exports the same module with ``torch.export``.  Then the command line's card
of that archive (``cnsbench card --model-kind exported``) must give the same accuracy drops,
failure points and headline values as the Python calls, to 1e-6.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "python.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks() -> list[str]:
    return BLOCK.findall(DOC.read_text(encoding="utf-8"))


def test_the_page_has_its_walk_and_every_block_compiles():
    blocks = python_blocks()
    text = "\n".join(blocks)
    assert "import cnsbench" in text and "import pipeline\n" not in text
    for call in ("cnsbench.open_output(", "cnsbench.evaluate(", ".failure_points(", "cnsbench.refine(", "cnsbench.card(",
                 "cnsbench.leaderboard(", ".torch_dataset(", ".hf_dataset(", "datasets.load_dataset(", "export_classifier("):
        assert call in text, f"docs/python.md lost its {call} step"
    for i, block in enumerate(blocks):
        compile(block, f"{DOC}: python block {i + 1}", "exec")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "docs/python.md" in readme


@pytest.mark.slow
@pytest.mark.skipif(not (REPO / "assets" / "world" / "world.json").is_file(), reason="assets/world not trained")
def test_the_page_runs_and_the_exported_model_scores_the_same(demo_world, tmp_path, monkeypatch):
    import cnsbench
    from pipeline.cli import main
    from shared_bench import tree_digest

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))  # load_dataset's cache, not the home folder's
    shutil.copytree(demo_world, tmp_path / "runs" / "demo")  # the page reads runs/demo
    before = tree_digest("runs/demo")
    namespace: dict = {"__name__": "python_doc"}
    for i, block in enumerate(python_blocks()):
        exec(compile(block, f"{DOC}: python block {i + 1}", "exec"), namespace)  # noqa: S102 (our own docs)
    refined = pd.read_csv(tmp_path / "runs" / "small-cnn" / "refine" / "failure_points_refined.csv")
    assert set(refined["classifier"]) == {"small-cnn"} and (refined["status"] == "refined").any()

    assert main(["card", "--model-kind", "exported", "--model", "small-cnn", "--checkpoint", "runs/small-cnn.pt2",
                 "--name", "small-cnn-pt2", "--suite", "runs/small-cnn", "--output", "runs/cards/small-cnn-pt2",
                 "--runner", "local"]) == 0
    assert tree_digest("runs/demo") == before  # the walk only read the benchmark
    # the card only read runs/small-cnn: the exported model's predictions are in the card's own output
    bench = cnsbench.open_output("runs/small-cnn")
    own = cnsbench.open_output("runs/cards/small-cnn-pt2/outputs/cns")
    assert bench.classifiers == ["small-cnn"] and own.classifiers == ["small-cnn-pt2"]
    summary = pd.concat([pd.DataFrame(o.metrics()["summary"]) for o in (bench, own)]).set_index("classifier")
    drops = [c for c in summary.columns if c.startswith("acc_drop_") or c in ("fp_avg", "accuracy_scale0")]
    np.testing.assert_allclose(summary.loc["small-cnn-pt2", drops].astype(float),
                               summary.loc["small-cnn", drops].astype(float), atol=1e-6)
    py, cli = (o.failure_points(n).set_index("trajectory_id")["failure_point"]
               for o, n in ((bench, "small-cnn"), (own, "small-cnn-pt2")))
    assert len(py) > 0 and set(py.index) == set(cli.index)
    np.testing.assert_allclose(cli.loc[py.index].to_numpy(float), py.to_numpy(float), atol=1e-6)

    cards = {n: json.loads((tmp_path / "runs" / "cards" / n / "card.json").read_text()) for n in ("small-cnn", "small-cnn-pt2")}
    (a,), (b,) = cards["small-cnn"]["benchmarks"], cards["small-cnn-pt2"]["benchmarks"]
    assert a["metric"] == b["metric"] and a["value"] == pytest.approx(b["value"], abs=1e-6)
