"""The Python API over the session's demo build: ``cnsbench.open_output`` and the loaders of the ecosystem.

``import cnsbench`` stays light; a :class:`Benchmark` gives the output's tables, the
report's numbers and its images, and reads the same kept samples, labels and scales as
``datasets`` (``hf_dataset``, ``load_dataset`` through the output's dataset card) and
``webdataset`` over the shards.  Bad input raises ``CnsbenchError`` with the command line's
message.  The demo build is read-only here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset
import pytest

import cnsbench

from pipeline.errors import CnsbenchError

REPO = Path(__file__).resolve().parents[1]


def test_import_is_light_and_names_are_lazy():
    code = ("import cnsbench, sys; cnsbench.open_output; cnsbench.build; cnsbench.refine; cnsbench.leaderboard; "
            "cnsbench.evaluate; cnsbench.card; cnsbench.Benchmark; cnsbench.CnsbenchError; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        cnsbench.nothing  # noqa: B018
    assert cnsbench.CnsbenchError is CnsbenchError and issubclass(CnsbenchError, ValueError)
    assert set(cnsbench.__all__) == {"__version__", "open_output", "Benchmark", "build", "evaluate", "refine", "card",
                                     "leaderboard", "CnsbenchError"}


def test_a_users_pipeline_py_does_not_shadow_the_package(tmp_path):
    """A user's own ``pipeline.py`` in the working folder (a common name) is not the implementation."""
    (tmp_path / "pipeline.py").write_text("")
    code = ("import cnsbench, sys; cnsbench.open_output; cnsbench.evaluate; assert 'torch' not in sys.modules; "
            "import pipeline.api.output; print(sys.modules['pipeline'].__file__)")
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(REPO / "pipeline" / "__init__.py")


def test_pipeline_names_no_api_and_swaps_no_module_class():
    import ast

    source = (REPO / "pipeline" / "__init__.py").read_text()
    tree = ast.parse(source)
    assigned = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert not (assigned | defined) & {"open_output", "Benchmark", "build", "evaluate", "refine", "card",
                                        "leaderboard", "CnsbenchError", "_API", "__getattr__"}
    assert "__class__" not in source
    import pipeline.card

    assert isinstance(pipeline.card, type(pipeline))  # the subpackage, nothing else


def test_the_stub_names_every_export_with_its_signature():
    import ast
    import inspect

    stub = ast.parse((REPO / "cnsbench" / "__init__.pyi").read_text())
    named = {a.asname or a.name for n in stub.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert named == set(cnsbench.__all__) - {"__version__"}
    assert list(inspect.signature(cnsbench.evaluate).parameters)[:3] == ["classifiers", "source", "output"]
    assert inspect.signature(cnsbench.evaluate).parameters["output"].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.fixture(scope="module")
def bench(demo_world):
    return cnsbench.open_output(demo_world)


@pytest.fixture()
def synthetic_bench(synthetic_demo):
    """The demo's plan with made-up pixels and scores: for the argument checks, which need no real build."""
    return cnsbench.open_output(synthetic_demo)


def test_samples_predictions_and_report_numbers(bench, demo_world):
    samples = bench.samples()
    stored = pd.read_parquet(demo_world / "samples")  # plain pandas and pyarrow read the tables
    assert pyarrow.dataset.dataset(demo_world / "predictions").count_rows() == len(bench.predictions())
    assert len(samples) == len(stored) == samples["sample_id"].nunique()
    assert list(samples.columns[:9]) == ["sample_id", "trajectory_id", "class_id", "class_name", "seed", "shift",
                                         "scale", "kept", "complete"]
    metrics = bench.metrics()
    assert metrics == json.loads((demo_world / "report" / "metrics.json").read_text())
    counts = metrics["counts"]
    assert samples["trajectory_id"][samples["complete"]].nunique() == counts["n_trajectories_complete"]
    assert int(samples["kept"].sum()) == counts["n_kept"]

    preds = bench.predictions()
    assert set(preds["classifier"]) == set(bench.classifiers)
    assert len(preds) == len(samples) * len(bench.classifiers)
    one = preds.iloc[0]
    row = samples.set_index("sample_id").loc[one["sample_id"]]
    assert (one["shift"], one["scale"], one["class_id"]) == (row["shift"], row["scale"], row["class_id"])

    fps = bench.failure_points("linear")
    assert set(fps["trajectory_id"]) == set(samples["trajectory_id"][samples["complete"]])
    # the report's failure-point distribution, recounted from the per-trajectory points
    table = pd.read_csv(demo_world / "report" / "failure_points.csv")
    mine = table[(table["classifier"] == "linear") & (table["shift"] == "all")]
    for scale, count in zip(mine["scale"], mine["fp_count"]):
        assert int(np.isclose(fps["failure_point"], scale).sum()) == count
    summary = {r["classifier"]: r for r in metrics["summary"] if r.get("shift", "all") == "all"}
    assert fps["failure_point"].mean() == pytest.approx(summary["linear"]["fp_avg"], nan_ok=True)


def test_image_and_torch_dataset(bench):
    samples = bench.samples()
    kept = samples[samples["kept"]]
    img = bench.image(kept["sample_id"].iloc[0])
    assert img.mode == "RGB" and img.size[0] > 0
    ds = bench.torch_dataset(transform=np.asarray)
    assert len(ds) == len(kept)
    image, label, meta = ds[3]
    assert image.ndim == 3 and label == kept["class_id"].iloc[3] and meta["sample_id"] == kept["sample_id"].iloc[3]
    assert np.array_equal(image, np.asarray(bench.image(meta["sample_id"])))
    assert len(bench.torch_dataset(kept_only=False)) == len(samples)


def test_hf_dataset_and_webdataset_read_the_kept_samples(bench, demo_world):
    datasets = pytest.importorskip("datasets")
    wds = pytest.importorskip("webdataset")
    kept = bench.samples().query("kept")
    expect = {(s, int(c), float(x)) for s, c, x in zip(kept["sample_id"], kept["class_id"], kept["scale"])}

    ds = bench.hf_dataset()
    assert isinstance(ds.features["image"], datasets.Image) and len(ds) == len(kept)
    assert {(s, c, x) for s, c, x in zip(ds["sample_id"], ds["label"], ds["scale"])} == expect
    assert ds[0]["image"].size == bench.image(ds[0]["sample_id"]).size

    shards = sorted(str(p) for p in (demo_world / "images").glob("shard-*.tar"))
    found = set()
    for sample in wds.WebDataset(shards, shardshuffle=False).decode("pil"):
        meta = sample["json"]  # the documented keys: <sample_id>.png and <sample_id>.json
        assert sample["__key__"] == meta["sample_id"] and sample["png"].mode == "RGB"
        if meta["kept"]:
            found.add((meta["sample_id"], meta["label"], meta["scale"]))
    assert found == expect


def test_evaluate_says_which_trajectories_its_metrics_count(demo_world):
    from pipeline.cli.evaluate import counted_line

    counts = json.loads((demo_world / "report" / "metrics.json").read_text())["counts"]
    line = counted_line(str(demo_world), filtered=False)
    assert f"count {counts['n_trajectories_complete']} of {counts['n_trajectories_total']} trajectories" in line
    assert "without --filter a built benchmark's own keep decisions" in line


def test_hf_dataset_without_datasets_names_the_extra(synthetic_bench, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if it were not installed
    with pytest.raises(CnsbenchError, match=r"cnsbench\[datasets\]"):
        synthetic_bench.hf_dataset()


def test_load_dataset_reads_the_outputs_dataset_card(demo_world, tmp_path):
    datasets = pytest.importorskip("datasets")
    samples = datasets.load_dataset(str(demo_world), cache_dir=str(tmp_path))  # the default config: samples
    (split,) = samples.values()
    stored = pd.read_parquet(demo_world / "samples")
    assert sorted(split["sample_id"]) == sorted(stored["sample_id"])
    preds = datasets.load_dataset(str(demo_world), "predictions", cache_dir=str(tmp_path))
    assert sum(len(s) for s in preds.values()) == len(pd.read_parquet(demo_world / "predictions"))


def test_bad_paths_get_the_command_lines_message(tmp_path, capsys):
    from pipeline.cli import main

    missing = tmp_path / "nothing"
    with pytest.raises(CnsbenchError) as err:
        cnsbench.open_output(missing)
    assert main(["aggregate", str(missing)]) == 2
    assert capsys.readouterr().err.strip() == f"cnsbench aggregate: error: {err.value}"

    card = tmp_path / "card"
    card.mkdir()
    (card / "cnsbench-card.json").write_text('{"cnsbench": "card", "model": "m"}')
    with pytest.raises(CnsbenchError, match="robustness card's folder"):
        cnsbench.open_output(card)
    with pytest.raises(CnsbenchError, match="path is empty"):
        cnsbench.open_output("")


def test_unknown_sample_and_classifier_are_named(synthetic_bench):
    with pytest.raises(CnsbenchError, match="no sample 'nope'"):
        synthetic_bench.image("nope")
    with pytest.raises(CnsbenchError, match="no classifier 'nope'.*linear"):
        synthetic_bench.failure_points("nope")
