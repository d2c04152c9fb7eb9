"""A shared benchmark serves many readers: evaluations only read it and refer to its images.

On a copy of the session's demo build made read-only by a bind mount (``tests/shared_bench.py``;
root ignores file modes), from the shell and from Python: two ``cnsbench evaluate`` of
different classifiers at once into two outputs, a model held in memory evaluated, refined and
carded, a configured classifier the same way.  The benchmark's bytes are the same afterwards;
each evaluation output holds no image of its own and gives its classifier the benchmark
report's own rows.  The same on object storage (moto); the bad input of ``evaluate`` on a
synthetic output of the demo's plan (``synthetic_demo``), since it is refused before a model runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from shared_bench import read_only_mount_works, run_read_only, tree_digest

import cnsbench
from pipeline.errors import CnsbenchError

REPO = Path(__file__).resolve().parents[1]
PRE = {"resize": 32, "crop": 32, "interpolation": "bilinear", "mean": [0.5] * 3, "std": [0.5] * 3}
ENV = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
CLI = [sys.executable, "-m", "pipeline.cli"]

needs_ro = pytest.mark.skipif(not read_only_mount_works(), reason="no read-only bind mount here (unshare -m, mount)")


@pytest.fixture()
def bench(demo_world, tmp_path) -> Path:
    out = tmp_path / "bench"
    shutil.copytree(demo_world, out)
    return out


def size_of(root: Path, without: str = "") -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not (without and without in p.parts))


def report_rows(root: Path, table: str, classifier: str) -> pd.DataFrame:
    rows = pd.read_csv(root / "report" / table)
    return rows[rows["classifier"] == classifier].reset_index(drop=True)


@pytest.mark.slow
@needs_ro
def test_two_evaluations_at_once_of_a_read_only_benchmark_refer_to_its_images(bench, tmp_path):
    before = tree_digest(bench)
    outs = {name: tmp_path / f"ev-{name}" for name in ("cnn", "linear")}
    runs = [" ".join([*CLI, "evaluate", str(bench), "--output", str(out), "--classifiers", name, "--runner", "local"])
            + f" > {tmp_path}/{name}.log 2>&1" for name, out in outs.items()]
    script = (f"mount --bind -o ro {bench} {bench} || exit 9; {runs[0]} & a=$!; {runs[1]} & b=$!; "
              "wait $a; ra=$?; wait $b; rb=$?; exit $((ra | rb))")
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", script], env=ENV,
                          capture_output=True, text=True, timeout=1500)
    logs = {n: (tmp_path / f"{n}.log").read_text() for n in outs}
    assert done.returncode == 0, (done.stderr, logs)
    assert tree_digest(bench) == before
    for name, out in outs.items():
        for table in ("accuracy.csv", "failure_points.csv"):
            pd.testing.assert_frame_equal(report_rows(out, table, name), report_rows(bench, table, name))
        assert not list(out.rglob("*.tar"))  # the benchmark's images, referred to
        assert size_of(out, without="report") < size_of(bench) / 4
        opened = cnsbench.open_output(out)
        assert opened.classifiers == [name] and len(opened.predictions()) == len(opened.samples())
        sid = opened.samples()["sample_id"].iloc[0]
        assert opened.image(sid).size == cnsbench.open_output(bench).image(sid).size

    # the two evaluation outputs side by side (their images read through the benchmark)
    from pipeline.cli import main

    assert main(["compare", str(outs["cnn"]), str(outs["linear"]), "--output", str(tmp_path / "cmp"), "--image-check", "0"]) == 0
    assert (tmp_path / "cmp" / "compare.json").is_file()

    # refine and card of the configured classifier on its evaluation output, and a card against the
    # benchmark itself: read as it is, and refined in the card's own output; the benchmark still read-only
    ev = outs["cnn"]
    for argv in (["refine", str(ev), "--classifier", "cnn", "--rounds", "1", "--runner", "local"],
                 ["card", "cnn", "--suite", str(ev), "--output", str(tmp_path / "card-cnn"), "--runner", "local"],
                 ["card", "linear", "--suite", str(bench), "--output", str(tmp_path / "card-linear"), "--runner", "local"],
                 ["card", "cnn", "--suite", str(bench), "--output", str(tmp_path / "card-cnn-refined"), "--refine", "1",
                  "--runner", "local"]):
        done = run_read_only(bench, [*CLI, *argv], env=ENV, timeout=1500)
        assert done.returncode == 0, done.stderr[-3000:]
    assert (ev / "refine" / "failure_points_refined.csv").is_file() and (tmp_path / "card-cnn" / "card.json").is_file()
    assert tree_digest(bench) == before
    linear = json.loads((tmp_path / "card-linear" / "card.json").read_text())["benchmarks"][0]
    assert linear["output"] == str(bench) and not (tmp_path / "card-linear" / "outputs").exists()  # held: only read
    refined_card = tmp_path / "card-cnn-refined"
    own = refined_card / "outputs" / "cns"  # refinement writes: into the card's own output, never the benchmark
    entry = json.loads((refined_card / "card.json").read_text())["benchmarks"][0]
    assert entry["output"] == str(own) and (own / "refine" / "failure_points_refined.csv").is_file()
    assert not list((own / "images").glob("*.tar"))
    plain = json.loads((tmp_path / "card-cnn" / "card.json").read_text())["benchmarks"][0]
    assert entry["value"] == plain["value"]  # the same classifier on the same images


MODEL = '''
import sys, torch, cnsbench
from pathlib import Path
from torch import nn

class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, stride=2)
        self.head = nn.Linear(4 * 15 * 15, 10)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).flatten(1))

bench, work = Path(sys.argv[1]), Path(sys.argv[2])  # pathlib paths, as str ones
PRE = {pre!r}
model = SmallCNN()
quiet = lambda m: None
cnsbench.evaluate(model, bench, output=work / "ev", name="mine", preprocess=PRE, echo=quiet)
cnsbench.refine("mine", work / "ev", rounds=1, models={{"mine": model}}, echo=quiet)
cnsbench.card(model, work / "ev", output=work / "card", name="mine", preprocess=PRE, echo=quiet)
cnsbench.card(model, bench, output=work / "card-bench", name="mine", preprocess=PRE, echo=quiet)
cnsbench.evaluate("linear", str(bench), output=str(work / "ev-linear"), echo=quiet)
cnsbench.card("linear", str(work / "ev-linear"), output=str(work / "card-linear"), echo=quiet)
# the same model as a new one from the shell: exported, carded against the benchmark itself
import subprocess
from pipeline.models.exported import export_classifier

export_classifier(model, str(work / "mine.pt2"), {{"input_size": [3, 32, 32], "mean": PRE["mean"], "std": PRE["std"],
                                                   "interpolation": "bilinear"}})
shell = subprocess.run([sys.executable, "-m", "pipeline.cli", "card", "--model-kind", "exported", "--model", "mine",
                        "--checkpoint", str(work / "mine.pt2"), "--name", "mine-pt2", "--suite", str(bench),
                        "--output", str(work / "card-pt2"), "--runner", "local"], capture_output=True, text=True)
assert shell.returncode == 0, shell.stderr[-3000:]
print("done")
'''


@pytest.mark.slow
@needs_ro
def test_a_model_in_memory_and_a_configured_one_from_python_against_a_read_only_benchmark(bench, tmp_path):
    before = tree_digest(bench)
    script = tmp_path / "walk.py"
    script.write_text(textwrap.dedent(MODEL.format(pre=PRE)))
    done = run_read_only(bench, [sys.executable, str(script), str(bench), str(tmp_path)], env=ENV, timeout=1500)
    assert done.returncode == 0 and done.stdout.strip().endswith("done"), done.stderr[-3000:]
    assert "Loading weights" not in done.stderr and "it/s]" not in done.stderr  # no library's own bar without -v
    assert tree_digest(bench) == before
    ev = cnsbench.open_output(tmp_path / "ev")
    assert ev.classifiers == ["mine"] and not list((tmp_path / "ev" / "images").glob("*.tar"))  # refine/ makes its own
    refined = pd.read_csv(tmp_path / "ev" / "refine" / "failure_points_refined.csv")
    assert set(refined["classifier"]) == {"mine"}
    for card in ("card", "card-linear"):
        assert (tmp_path / card / "card.json").is_file()
    # the card against the benchmark itself: the model scored into the card's own output, the same numbers
    on_ev, on_bench = (json.loads((tmp_path / c / "card.json").read_text())["benchmarks"][0] for c in ("card", "card-bench"))
    assert on_bench["output"] == str(tmp_path / "card-bench" / "outputs" / "cns")
    assert on_bench["value"] == on_ev["value"]
    pt2 = json.loads((tmp_path / "card-pt2" / "card.json").read_text())["benchmarks"][0]  # the shell's new model
    assert pt2["output"] == str(tmp_path / "card-pt2" / "outputs" / "cns")
    assert pt2["value"] == pytest.approx(on_bench["value"], abs=1e-6)
    assert not list((tmp_path / "card-bench" / "outputs").rglob("*.tar"))
    pd.testing.assert_frame_equal(report_rows(tmp_path / "ev-linear", "accuracy.csv", "linear"),
                                  report_rows(bench, "accuracy.csv", "linear"))


@pytest.mark.slow
def test_an_evaluation_of_a_benchmark_on_object_storage_only_reads_it(demo_world, tmp_path):
    pytest.importorskip("s3fs")
    import fsspec
    from s3server import s3_environment

    with s3_environment("bench", "work"):
        fs = fsspec.filesystem("s3")
        for path in sorted(Path(demo_world).rglob("*")):
            if path.is_file():
                fs.pipe(f"bench/demo/{path.relative_to(demo_world).as_posix()}", path.read_bytes())

        def digest() -> dict[str, bytes]:
            return {p: fs.cat_file(p) for p in sorted(fs.find("bench/demo"))}

        before = digest()
        cnsbench.evaluate("cnn", "s3://bench/demo", output="s3://work/ev", echo=lambda m: None)
        fs.invalidate_cache()
        assert digest() == before
        assert not [p for p in fs.find("work/ev") if p.endswith(".tar")]
        local = tmp_path / "ev"
        fs.get("work/ev/report", str(local / "report"), recursive=True)
        for table in ("accuracy.csv", "failure_points.csv"):
            pd.testing.assert_frame_equal(report_rows(local, table, "cnn"), report_rows(Path(demo_world), table, "cnn"))
        opened = cnsbench.open_output("s3://work/ev")
        assert opened.image(opened.samples()["sample_id"].iloc[0]).size[0] > 0
        from pipeline.io.digest import output_digest

        mine, theirs = output_digest("s3://work/ev"), output_digest(str(demo_world))  # the images referred to
        assert mine["images"] == theirs["images"] and mine["samples"] == theirs["samples"]

        # refine in the evaluation output; cards against the benchmark: a configured classifier read as it
        # is, a model held in memory scored into the card's own output; the benchmark's bytes unchanged
        quiet = lambda m: None  # noqa: E731
        cnsbench.refine("cnn", "s3://work/ev", rounds=1, echo=quiet)
        cnsbench.card("cnn", "s3://bench/demo", output="s3://work/card-cnn", echo=quiet)
        cnsbench.card(_small_cnn(), "s3://bench/demo", output="s3://work/card-mine", name="mine", preprocess=PRE,
                      echo=quiet)
        fs.invalidate_cache()
        assert digest() == before
        assert fs.exists("work/ev/refine/failure_points_refined.csv")
        cnn = json.loads(fs.cat_file("work/card-cnn/card.json"))["benchmarks"][0]
        held = json.loads(fs.cat_file("work/card-mine/card.json"))["benchmarks"][0]
        assert cnn["output"] == "s3://bench/demo" and held["output"] == "s3://work/card-mine/outputs/cns"
        assert not [p for p in fs.find("work/card-mine") if p.endswith(".tar")]


def _small_cnn():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 15 * 15, 10))


class Tiny:
    """A callable from a batch to logits (no name, no preprocess given)."""

    def __call__(self, x):
        import torch

        return torch.zeros(x.shape[0], 10)


def test_bad_input_is_refused_naming_it_and_nothing_is_written(synthetic_demo, tmp_path):
    """On a synthetic output of the demo's plan: every refusal comes before a model runs."""
    bench = Path(synthetic_demo)
    before = tree_digest(bench)
    ev = tmp_path / "ev"
    cases = [
        (dict(classifiers="cnn", source=bench, output=bench / "inside"), r"inside the source"),
        (dict(classifiers="cnn", source=bench, output=bench), r"^output .* is the source itself.*in_place=True"),
        (dict(classifiers="nope", source=bench, output=ev), r"classifiers: \['nope'\] not in the config"),
        (dict(classifiers=Tiny(), source=bench, output=ev, preprocess=PRE), r"needs name="),
        (dict(classifiers=Tiny(), source=bench, output=ev, name="t"), r"'t'.*needs preprocess="),
        (dict(classifiers="cnn", source=tmp_path / "nothing", output=ev), r"no built benchmark"),
        (dict(classifiers="cnn", source=bench, output=ev, runner="nonsense"), r"^runner: "),
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    cases.append((dict(classifiers="cnn", source=empty, output=ev, config=REPO / "configs" / "demo.yaml"),
                  r"no .*(images|layout|shards)|not .*layout|cannot tell"))
    for kwargs, message in cases:
        args = kwargs.pop("classifiers"), kwargs.pop("source")
        with pytest.raises(CnsbenchError, match=message):
            cnsbench.evaluate(*args, echo=lambda m: None, **kwargs)
        assert not ev.exists() and not (bench / "inside").exists()
    assert tree_digest(bench) == before


def test_the_shell_says_the_same_with_exit_2(synthetic_demo, tmp_path, capsys):
    from pipeline.cli import main

    assert main(["evaluate", str(synthetic_demo), "--output", str(synthetic_demo), "--classifiers", "cnn"]) == 2
    assert "--in-place" in capsys.readouterr().err


def test_an_evaluation_output_is_a_source_and_has_the_benchmarks_digest(demo_world, tmp_path):
    """An evaluation output read as a source gives the images it refers to (with the benchmark's
    keep decisions): evaluating another of the benchmark's classifiers from it gives that
    classifier's report rows, and `cnsbench digest` follows the references to the same images."""
    from pipeline.cli import main
    from pipeline.io.digest import output_digest

    quiet = lambda m: None  # noqa: E731
    first, second = tmp_path / "ev1", tmp_path / "ev2"
    cnsbench.evaluate("cnn", demo_world, output=first, echo=quiet)
    cnsbench.evaluate("linear", first, output=second, echo=quiet)  # a name of the benchmark's config
    assert json.loads((second / "images.json").read_text())["images"] == str(demo_world)  # the images' holder
    for table in ("accuracy.csv", "failure_points.csv"):
        pd.testing.assert_frame_equal(report_rows(second, table, "linear"), report_rows(Path(demo_world), table, "linear"))
    bench, ev = output_digest(str(demo_world)), output_digest(str(second))
    assert ev["images"] == bench["images"] and ev["samples"] == bench["samples"]
    assert ev["predictions"] != bench["predictions"]  # linear's only
    assert main(["digest", str(first)]) == 0
