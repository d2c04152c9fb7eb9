"""``cnsbench refine``: the bisection's rule, one round on the tiny config, reuse, and bad input.

The tiny config's random-weight classifiers are wrong at scale 0 everywhere (nothing to
refine), so the module adds a classifier of its own to the tiny build: a TorchScript model
that answers goldfish when an image's mean brightness is on one side of a threshold and
bald eagle otherwise, the threshold chosen from the build's own images so that a goldfish
trajectory is right at scale 0 and wrong at a later grid scale.  The test then knows what
the classifier says of every refinement image, and checks the bisection against it.
"""

from __future__ import annotations

import io
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from buildproc import build_here, tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GOLDFISH, EAGLE = 1, 22


def brightness(data: bytes) -> float:
    from PIL import Image

    return float(np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float64).mean() / 255.0)


def bright_model(path: Path, threshold: float, sign: float) -> None:
    """Goldfish when ``sign * (mean brightness - threshold) > 0``, else bald eagle (1000 logits)."""
    import torch

    class Bright(torch.nn.Module):
        def __init__(self, t: float, s: float) -> None:
            super().__init__()
            self.t, self.s = t, s

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            score = self.s * (x.mean(dim=(1, 2, 3)) - self.t)
            logits = torch.zeros(x.shape[0], 1000, dtype=x.dtype, device=x.device)
            logits[:, 1] = score * 100.0
            logits[:, 22] = -score * 100.0
            return logits

    torch.jit.save(torch.jit.script(Bright(threshold, sign)), str(path),
                   _extra_files={"preprocess.json": json.dumps({"input_size": [3, 64, 64]})})


def says_goldfish(b: float, threshold: float, sign: float) -> bool:
    return sign * (b - threshold) > 0


def tables(out: Path) -> tuple[pd.DataFrame, dict[str, float]]:
    """The samples of an output and each sample's brightness."""
    from pipeline.aggregate.images import ImageReader
    from pipeline.io.store import OutputStore
    from pipeline.io.tables import load_samples

    store = OutputStore(str(out))
    samples = load_samples(store)
    images = ImageReader(store, samples).many(list(samples["sample_id"]))
    return samples, {sid: brightness(b) for sid, b in images.items()}


def custom(raw: dict) -> None:
    # Each classifier's own preprocessing (the brightness model sees its 64 px input as is),
    # not the cns protocol's 224 px crop of ImageNet-normalised pixels.
    raw["protocol"] = "custom"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny build with the brightness classifier ``bright`` added, and its threshold."""
    root = tmp_path_factory.mktemp("refine")
    cfg = tiny_config(root, mutate=custom)
    out = root / "out"
    assert build_here(cfg, out) == 0
    samples, light = tables(out)
    samples["b"] = samples["sample_id"].map(light)
    best = None
    for _, traj in samples[samples["class_id"] == GOLDFISH].groupby("trajectory_id"):
        traj = traj.sort_values("scale")
        b0, later = traj["b"].iloc[0], traj["b"].iloc[1:]
        for sign, far in ((1.0, later.min()), (-1.0, later.max())):
            gap = sign * (b0 - far)
            if gap > 0 and (best is None or gap > best[0]):
                best = (gap, (b0 + far) / 2, sign)
    assert best is not None, "no goldfish trajectory changes brightness along its scales"
    gap, threshold, sign = best
    bright_model(root / "bright.pt", threshold, sign)

    def add(raw):
        custom(raw)
        raw["classifiers"].append({"name": "bright", "kind": "torchscript", "model": "brightness",
                                   "checkpoint": str(root / "bright.pt")})

    cfg = tiny_config(root, mutate=add, name="tiny-bright.yaml")
    assert build_here(cfg, out) == 0  # only the new classifier runs, on the committed images
    return {"root": root, "out": out, "threshold": threshold, "sign": sign, "gap": gap, "config": cfg}


def refine_cli(*argv: str) -> int:
    from pipeline.cli import main

    return main(["refine", *argv])


# --------------------------------------------------------------------------- the rule
def test_walk_bisects_and_steps_around_rejected_midpoints():
    from pipeline.refine import walk

    # Nothing judged yet: the first probe is the midpoint.
    assert walk(1.0, 1.5, 3, {}).next == 1.25
    # Right at 1.25, wrong at 1.375: (1.25, 1.375] after two rounds, the third probe next.
    w = walk(1.0, 1.5, 3, {1250: True, 1375: False})
    assert (w.low, w.high, w.rounds, w.next) == (1.25, 1.375, 2, 1.3125)
    # The filter rejected 1.25: the round is spent, the lower half's midpoint comes next.
    w = walk(1.0, 1.5, 3, {1250: None})
    assert (w.low, w.high, w.rounds, w.rejected, w.next) == (1.0, 1.5, 1, [1.25], 1.125)
    # ... and the upper half's when that was rejected too; none left after the third.
    assert walk(1.0, 1.5, 3, {1250: None, 1125: None}).next == 1.375
    w = walk(1.0, 1.5, 5, {1250: None, 1125: None, 1375: None})
    assert (w.next, w.rounds, w.high) == (None, 3, 1.5)
    # Rounds cap the walk; the outputs' resolution (thousandths) ends it too.
    assert walk(1.0, 1.5, 1, {1250: False}).next is None
    assert walk(1.0, 1.001, 3, {}).next is None


# --------------------------------------------------------------------------- one round
def test_one_round_on_the_tiny_build(world):
    from pipeline.analyses.refined import read_refined
    from pipeline.io.store import OutputStore
    from pipeline.refine import refine

    out = world["out"]
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*")
              if p.is_file() and p.parts[len(out.parts)] in ("samples", "predictions", "images", "manifest")}
    fp_before = (out / "report" / "failure_points.csv").read_text()
    summary = refine(str(out), "bright", rounds=1, runner="local", echo=lambda m: None)
    table = read_refined(OutputStore(str(out)))
    mine = table[table["classifier"] == "bright"]
    refined = mine[mine["status"] == "refined"]
    assert summary.refined == len(refined) >= 1
    assert summary.points_made == len(refined) and summary.points_reused == 0
    # One round: every refined interval is half its grid interval and holds the refined point.
    grid_step = 0.5
    assert np.allclose(refined["interval_high"] - refined["interval_low"], grid_step / 2)
    assert (refined["rounds"] == 1).all()
    assert (refined["refined_fp"] == refined["interval_high"]).all()
    assert set(mine["status"]) <= {"refined", "never_failed", "failed_at_0"}
    # Each midpoint's verdict is the classifier's on the committed refinement image.
    points, light = tables(out / "refine")
    for row in refined.itertuples():
        mid = row.grid_fp - grid_step / 2
        pt = points[(points["shift"] == row.shift) & (points["class_id"] == row.class_id)
                     & (points["seed"] == row.seed) & np.isclose(points["scale"], mid)]
        assert len(pt) == 1
        if not bool(pt["kept"].iloc[0]):
            assert row.rejected == 1 and row.refined_fp == row.grid_fp
            continue
        right = says_goldfish(light[pt["sample_id"].iloc[0]], world["threshold"], world["sign"]) == (row.class_id == GOLDFISH)
        assert row.refined_fp == (row.grid_fp if right else mid)
    # The grid is untouched: its shards, and its failure points in the report again.
    after = {p: (out / p).read_bytes() for p in before}
    assert after == before
    assert (out / "report" / "failure_points.csv").read_text() == fp_before
    assert (out / "report" / "failure_points_refined.csv").is_file()
    dist = pd.read_csv(out / "report" / "fp_refined_distribution.csv")
    cum = dist[(dist["classifier"] == "bright") & (dist["shift"] == "all") & (dist["kind"] == "refined")]
    failed = (mine["refined_fp"] >= 0).sum()  # never-failed ones have none
    assert cum["fp_count"].sum() == failed and np.isclose(cum["fp_ratio_cumulative"].iloc[-1], failed / len(mine))
    # The card's CNS entry: the mean refined failure point over the failed trajectories, with an interval.
    from pipeline.aggregate.images import ImageReader
    from pipeline.aggregate.run import load_output_config, load_sound_tables
    from pipeline.card.headline import Tables, refined_values

    store = OutputStore(str(out))
    samples, preds, _ = load_sound_tables(store, ["bright"])
    (value,) = refined_values(Tables(load_output_config(store), samples, preds, "bright", None, ImageReader(store, samples)))
    failing = mine["refined_fp"].dropna()  # every failed trajectory, as the grid's fp_avg counts them
    assert value.metric == "fp_avg_refined" and np.isclose(value.value, failing.mean())
    assert value.ci_low <= value.value <= value.ci_high

    # Run again: nothing to make, the same refined failure points.
    again = refine(str(out), "bright", rounds=1, runner="local", echo=lambda m: None)
    assert again.points_made == 0 and again.points_reused == summary.points_made
    table2 = read_refined(OutputStore(str(out)))
    pd.testing.assert_frame_equal(table2[table2["classifier"] == "bright"].reset_index(drop=True),
                                  mine.reset_index(drop=True))


# --------------------------------------------------------------------------- bad input
@pytest.mark.unit  # refine_cli runs the command, which refuses before its claim (the unit tier's guard checks it)
def test_bad_input_exits_2_naming_it(tmp_path, capsys):
    """Every refusal comes before the output's claim: on a synthetic output of the tiny config
    (``hostile.synthetic_output``: the write stage, made-up pixels, every classifier right at
    the first two scales and wrong from the third, so every trajectory has a pair to bisect)."""
    from hostile import synthetic_output

    out = tmp_path / "out"
    cfg = tiny_config(tmp_path, mutate=custom)
    synthetic_output(out, cfg)
    first = json.loads((out / "config.json").read_text())["config"]["classifiers"][0]["name"]
    assert refine_cli(str(out), "--classifier", "nope", "--runner", "local") == 2
    assert "unknown classifier 'nope'" in capsys.readouterr().err
    for rounds in ("0", "9"):
        assert refine_cli(str(out), "--classifier", first, "--rounds", rounds, "--runner", "local") == 2
        assert "--rounds" in capsys.readouterr().err

    # A classifier the config names but no shard has predictions of.
    lacking = tmp_path / "lacking"
    shutil.copytree(out, lacking)
    marker = json.loads((lacking / "config.json").read_text())
    extra = dict(marker["config"]["classifiers"][0], name="later")
    marker["config"]["classifiers"].append(extra)
    (lacking / "config.json").write_text(json.dumps(marker))
    assert refine_cli(str(lacking), "--classifier", "later", "--runner", "local") == 2
    assert "no predictions of 'later'" in capsys.readouterr().err

    # A config whose generator is gone cannot make the midpoints.
    gone = tmp_path / "gone"
    shutil.copytree(out, gone)
    marker = json.loads((gone / "config.json").read_text())
    marker["config"]["generator"]["model"] = str(tmp_path / "no-such-model")
    (gone / "config.json").write_text(json.dumps(marker))
    assert refine_cli(str(gone), "--classifier", first, "--runner", "local") == 2
    err = capsys.readouterr().err
    assert "cannot regenerate its images" in err and "no-such-model" in err


@pytest.mark.unit  # the claim refuses (its own check): nothing runs after it (the unit tier's guard checks it)
def test_an_output_being_built_is_refused_by_the_lease(tmp_path, capsys):
    from hostile import synthetic_output

    from pipeline.io.lease import hold_lease

    out = tmp_path / "out"
    synthetic_output(out, tiny_config(tmp_path, mutate=custom))
    first = json.loads((out / "config.json").read_text())["config"]["classifiers"][0]["name"]
    with hold_lease(str(out), "build"):
        assert refine_cli(str(out), "--classifier", first, "--runner", "local") == 2
    assert "one writer per output" in capsys.readouterr().err


# --------------------------------------------------------------------------- the points' sampler
def test_points_continue_the_units_prefix_as_the_build_makes_them(tmp_path):
    """A point made from the unit's (cached) prefix is the build sampler's image at that
    scale, up to one level where a different batch sums in a different order; made again
    from the cache, it is the same image; the cached prefix's UNet steps are not spent again."""
    import torch

    from pipeline.config import load_config
    from pipeline.families.slider import shared_sampler
    from pipeline.stages.refine_sampling import PrefixCache, generate_points

    cfg = load_config(str(tiny_config(tmp_path)))
    sampler = shared_sampler(cfg, "slider", "cpu", torch.float32)
    class_id, shifts = int(cfg.benchmark.classes[0]), list(cfg.benchmark.shifts)
    group = sampler.generate_group(class_id, 1, shifts, [0.0, 0.5, 1.25])
    cache, points = PrefixCache(), [(shifts[0], 1.25), (shifts[1], 0.5)]
    first, evals, _ = generate_points(sampler, class_id, 1, points, cache)
    again, evals_again, _ = generate_points(sampler, class_id, 1, points, cache)
    for p in points:
        made = np.asarray(first[p], dtype=int)
        assert np.abs(made - np.asarray(group.image(*p), dtype=int)).max() <= 1
        assert (made == np.asarray(again[p], dtype=int)).all()
    assert (cache.hits, cache.misses) == (1, 1)
    window_steps = sum(int(t) <= cfg.generator.lora_timestep_threshold for t in sampler._timesteps().timesteps)
    assert evals_again == 2 * 2 * window_steps  # two points, CFG: no prefix step
    assert evals > evals_again


# --------------------------------------------------------------------------- kill -9
@pytest.mark.slow
def test_killed_refinement_resumes_to_the_same_result(world, tmp_path):
    """kill -9 between a refinement shard's files and its manifest; the next run cleans the
    uncommitted files, keeps what was committed and ends with the uninterrupted run's table."""
    from buildproc import ForkedBuild, env_with

    from pipeline.analyses.refined import read_refined
    from pipeline.io.store import OutputStore

    def fresh(name: str) -> Path:
        out = tmp_path / name
        shutil.copytree(world["out"], out)
        shutil.rmtree(out / "refine", ignore_errors=True)  # another test's refinement
        return out

    argv = ["--classifier", "bright", "--rounds", "2", "--runner", "local"]
    whole, killed = fresh("whole"), fresh("killed")
    assert refine_cli(str(whole), *argv) == 0
    faults = tmp_path / "faults"
    faults.mkdir()
    proc = ForkedBuild(["refine", str(killed), *argv], tmp_path / "refine.log",
                       env=env_with(CNSBENCH_FAULT_INJECT="write:before_manifest:*:pause", CNSBENCH_FAULT_DIR=str(faults)))
    try:
        for _ in range(1200):
            if list(faults.glob("paused-*")) or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert list(faults.glob("paused-*")), (tmp_path / "refine.log").read_text()[-2000:]
    finally:
        proc.kill()
        proc.wait()
    assert list((killed / "refine" / "images").glob("*.tar")) and not list((killed / "refine" / "manifest").glob("*.json"))
    assert refine_cli(str(killed), *argv) == 0
    pd.testing.assert_frame_equal(read_refined(OutputStore(str(killed))), read_refined(OutputStore(str(whole))))
    committed = {rel for m in OutputStore(str(killed / "refine")).manifests() for rel in m.files}
    on_disk = {str(p.relative_to(killed / "refine")) for d in ("images", "samples", "predictions")
               for p in (killed / "refine" / d).glob("*")}
    assert on_disk == committed


# --------------------------------------------------------------------------- reuse
def test_a_second_classifier_classifies_the_points_it_finds(world, tmp_path):
    """The same model under a second name needs exactly the first one's points: it classifies
    them (the reclassify stage adds its predictions to the refinement shards) and makes none."""
    from pipeline.analyses.refined import read_refined
    from pipeline.io.store import OutputStore
    from pipeline.refine import refine

    out = tmp_path / "out"
    shutil.copytree(world["out"], out)
    shutil.rmtree(out / "refine", ignore_errors=True)
    first = refine(str(out), "bright", rounds=2, runner="local", echo=lambda m: None)

    def twin(raw):
        custom(raw)
        for name in ("bright", "bright-twin"):
            raw["classifiers"].append({"name": name, "kind": "torchscript", "model": "brightness",
                                       "checkpoint": str(world["root"] / "bright.pt")})

    assert build_here(tiny_config(tmp_path, mutate=twin, name="twin.yaml"), out) == 0
    shards = sorted(p.name for p in (out / "refine" / "manifest").glob("*.json"))
    second = refine(str(out), "bright-twin", rounds=2, runner="local", echo=lambda m: None)
    assert first.points_made > 0
    assert (second.points_made, second.points_reused) == (0, first.points_made)
    assert sorted(p.name for p in (out / "refine" / "manifest").glob("*.json")) == shards  # nothing generated
    table = read_refined(OutputStore(str(out)))
    mine = table[table["classifier"] == "bright"].drop(columns="classifier").reset_index(drop=True)
    twin_rows = table[table["classifier"] == "bright-twin"].drop(columns="classifier").reset_index(drop=True)
    pd.testing.assert_frame_equal(mine, twin_rows)


def test_a_point_that_fails_is_reported_and_made_by_the_next_run(world, tmp_path, monkeypatch):
    from pipeline.analyses.refined import read_refined
    from pipeline.io.store import OutputStore
    from pipeline.refine import refine
    from pipeline.stages import refine_sampling

    out = tmp_path / "out"
    shutil.copytree(world["out"], out)
    shutil.rmtree(out / "refine", ignore_errors=True)
    made = refine_sampling.generate_points

    def broken(sampler, class_id, seed, points, *args):
        if any(scale < 0.5 or 1.0 < scale < 1.5 or 2.0 < scale for _, scale in points):
            raise RuntimeError("no memory left")
        return made(sampler, class_id, seed, points, *args)

    monkeypatch.setattr(refine_sampling, "generate_points", broken)
    first = refine(str(out), "bright", rounds=1, runner="local", echo=lambda m: None)
    monkeypatch.setattr(refine_sampling, "generate_points", made)
    failures = list((out / "refine" / "failures").glob("*.parquet"))
    table = read_refined(OutputStore(str(out)))
    refined = table[table["status"] == "refined"]
    assert first.failed == len(refined[refined["rounds"] == 0]) > 0 and failures
    assert refine_cli(str(out), "--classifier", "bright", "--rounds", "1", "--runner", "local") == 0
    table = read_refined(OutputStore(str(out)))
    assert (table.loc[table["status"] == "refined", "rounds"] == 1).all()


# --------------------------------------------------------------------------- all classifiers at once
def test_classifiers_refined_together_equal_each_alone_with_fewer_points(world, tmp_path):
    """``--classifier all`` refines every classifier in one run, round by round, a point that
    several need made once: each classifier's rows are those it gets refined alone (in an
    output of its own), and the run makes fewer points than the lone runs together."""
    from pipeline.analyses.refined import read_refined
    from pipeline.io.store import OutputStore
    from pipeline.refine import refine

    base = tmp_path / "base"
    shutil.copytree(world["out"], base)
    shutil.rmtree(base / "refine", ignore_errors=True)
    # A second threshold a quarter of the gap over: the same trajectory fails, at other points.
    bright_model(tmp_path / "dim.pt", world["threshold"] + world["sign"] * world["gap"] / 4, world["sign"])

    def three(raw):
        custom(raw)
        for name, path in (("bright", world["root"] / "bright.pt"), ("bright-twin", world["root"] / "bright.pt"),
                           ("bright-dim", tmp_path / "dim.pt")):
            raw["classifiers"].append({"name": name, "kind": "torchscript", "model": "brightness", "checkpoint": str(path)})

    assert build_here(tiny_config(tmp_path, mutate=three, name="three.yaml"), base) == 0
    names = ["bright", "bright-twin", "bright-dim"]
    alone = {}
    for name in names:
        out = tmp_path / f"alone-{name}"
        shutil.copytree(base, out)
        s = refine(str(out), name, rounds=2, runner="local", echo=lambda m: None)
        assert s.points_reused == 0
        alone[name] = (s, read_refined(OutputStore(str(out))))
    together = tmp_path / "together"
    shutil.copytree(base, together)
    assert refine_cli(str(together), "--classifier", "all", "--rounds", "2", "--runner", "local") == 0
    table = read_refined(OutputStore(str(together)))
    assert set(table["classifier"]) >= set(names)
    for name in names:
        mine = table[table["classifier"] == name].reset_index(drop=True)
        assert (mine["status"] == "refined").any(), name
        pd.testing.assert_frame_equal(mine, alone[name][1].reset_index(drop=True))
    made = len(list(OutputStore(str(together / "refine")).manifests()))
    assert made >= 1
    points = sum(len(m.trajectories) for m in OutputStore(str(together / "refine")).manifests())
    assert points < sum(s.points_made for s, _ in alone.values())  # the twin's points are the same points
    assert points >= max(s.points_made for s, _ in alone.values())

    # A comma list is the same run for those classifiers; an unknown name in it is refused.
    assert refine_cli(str(together), "--classifier", "bright,nope", "--runner", "local") == 2


# --------------------------------------------------------------------------- damaged, partial, not a build
def _unrefined_copy(world, tmp_path, name: str) -> Path:
    out = tmp_path / name
    shutil.copytree(world["out"], out)
    shutil.rmtree(out / "refine", ignore_errors=True)
    return out


def test_a_damaged_build_shard_is_refused_naming_it_and_left_for_the_build(world, tmp_path, capsys):
    out = _unrefined_copy(world, tmp_path, "damaged")
    manifest = json.loads(sorted((out / "manifest").glob("*.json"))[0].read_text())
    tar = out / next(f for f in manifest["files"] if f.endswith(".tar"))
    tar.write_bytes(tar.read_bytes()[:100])  # truncated
    assert refine_cli(str(out), "--classifier", "bright", "--runner", "local") == 2
    captured = capsys.readouterr()
    assert manifest["shard"] in captured.err and "run `cnsbench build` on it first" in captured.err
    assert "regenerating" not in captured.out + captured.err
    assert tar.is_file() and len(tar.read_bytes()) == 100  # nothing moved: the build regenerates it
    assert not (out / "refine").exists()


def test_a_partial_build_is_refined_with_a_line_and_marked_stale_once_completed(world, tmp_path, capsys):
    from pipeline.analyses.refined import read_refined
    from pipeline.io.store import OutputStore

    out = _unrefined_copy(world, tmp_path, "partial")
    manifests = sorted((out / "manifest").glob("*.json"))
    gone = json.loads(manifests[-1].read_text())  # a build killed before its last shard committed
    manifests[-1].unlink()
    for rel in gone["files"]:
        (out / rel).unlink()
    missing = len(gone["trajectories"])
    assert refine_cli(str(out), "--classifier", "bright", "--rounds", "1", "--runner", "local") == 0
    text = capsys.readouterr().out
    assert f"partial build: {missing} of its 8 planned trajectories are missing" in text
    table = read_refined(OutputStore(str(out)))
    assert table["trajectory_id"].nunique() == 8 - missing
    metrics = json.loads((out / "report" / "metrics.json").read_text())
    assert "refined_failure_points" in json.dumps(metrics) and '"stale": []' in json.dumps(metrics)

    # The build completed: the refined section is marked stale, the card leaves it out.
    assert build_here(world["config"], out) == 0
    section = (out / "report" / "index.html").read_text()
    assert "Stale for bright" in section and f"{missing} not refined" in section
    metrics = json.loads((out / "report" / "metrics.json").read_text())
    assert '"stale": ["bright"]' in json.dumps(metrics)
    # Refined again: whole, not stale.
    assert refine_cli(str(out), "--classifier", "bright", "--rounds", "1", "--runner", "local") == 0
    assert "partial build" not in capsys.readouterr().out
    assert read_refined(OutputStore(str(out)))["trajectory_id"].nunique() == 8
    assert "Stale for" not in (out / "report" / "index.html").read_text()

    # The refinement store, or any folder that is not a build output, is no target.
    assert refine_cli(str(out / "refine"), "--classifier", "bright", "--runner", "local") == 2
    err = capsys.readouterr().err
    assert "refinement store" in err and f"refine {out}" in err
    assert not (out / "refine" / "refine").exists()
    assert build_here(world["config"], out / "refine") == 2
    err = capsys.readouterr().err
    assert "lies inside the cnsbench output" in err and "--new-version" not in err
    assert not (out / "refine" / "previous").exists()
    (tmp_path / "empty").mkdir()
    assert refine_cli(str(tmp_path / "empty"), "--classifier", "bright", "--runner", "local") == 2
    assert "config.json not found" in capsys.readouterr().err


# --------------------------------------------------------------------------- cards
def test_card_refine_puts_refined_points_beside_the_grids(world, tmp_path, capsys):
    """``cnsbench card MODEL --refine R`` refines the model on the suite's CNS output; its
    entry carries the refined mean failure point beside the grid's, with intervals and the
    bisection intervals' width, as the refinement table gives them."""
    from pipeline.analyses.refined import read_refined
    from pipeline.cli import main
    from pipeline.io.store import OutputStore

    out = _unrefined_copy(world, tmp_path, "carded")
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"suite: one\nbenchmarks:\n  - {{name: cns, family: cns, output: {out}, protocol: custom}}\n")
    assert main(["card", "bright", "--suite", str(suite), "--output", str(tmp_path / "card"), "--refine", "1",
                 "--runner", "local"]) == 0
    printed = capsys.readouterr().out
    card = json.loads((tmp_path / "card" / "card.json").read_text())
    (entry,) = card["benchmarks"]
    fp = entry["failure_point"]
    own = tmp_path / "card" / "outputs" / "cns"  # refining writes: into the card's own output, never the benchmark
    assert entry["output"] == str(own) and read_refined(OutputStore(str(out))) is None
    table = read_refined(OutputStore(str(own)))
    mine = table[table["classifier"] == "bright"]
    assert fp["refined"] == pytest.approx(mine["refined_fp"].dropna().mean())
    assert fp["grid"] == pytest.approx(mine["grid_fp"].dropna().mean())
    assert fp["refined_ci_low"] <= fp["refined"] <= fp["refined_ci_high"] and fp["rounds"] == 1
    bisected = mine[mine["status"] == "refined"]
    assert fp["refined_interval_width"] == pytest.approx((bisected["interval_high"] - bisected["interval_low"]).mean())
    assert f"refined {fp['refined']:.4f}" in printed
    assert main(["card", "bright", "--suite", str(suite), "--output", str(tmp_path / "card2"), "--refine", "9",
                 "--runner", "local"]) == 2
    assert "--refine must be 1..8" in capsys.readouterr().err


# --------------------------------------------------------------------------- families
def test_each_family_declares_whether_its_scale_is_continuous():
    from pipeline.registry import FAMILIES

    declared = {k: FAMILIES.get(k).continuous_scale for k in FAMILIES.keys()}
    assert declared == {"slider": True, "prompt": False, "corruption": True, "object_edit": True,
                        "prompt_nuisance": False, "masked_scenario": True}


def test_a_build_of_a_family_without_a_continuous_scale_is_refused_naming_it(tmp_path, capsys):
    from pipeline.config import load_config
    from pipeline.io.store import OutputStore
    from pipeline.output_run import write_config
    from pipeline.runtime.checkout import REPO_ROOT

    out = tmp_path / "imagenet_d"
    out.mkdir()
    write_config(OutputStore(str(out)), load_config(str(REPO_ROOT / "configs" / "world_imagenet_d.yaml")))
    assert refine_cli(str(out), "--classifier", "all", "--runner", "local") == 2
    err = capsys.readouterr().err
    assert "family prompt_nuisance" in err and "no continuous scale" in err
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "config.yaml"]  # nothing written


def test_a_family_point_is_made_in_a_call_with_the_grids_top_scale():
    # A family may set a trajectory up for the farthest level of its call (ImageNet-E's
    # position picks the direction in which the top level's offset fits): a point is made in
    # a call at [0, scale, top], as every build's call has the top, and only [0, scale] is kept.
    from types import SimpleNamespace

    from pipeline.plan import schema
    from pipeline.stages.refine import RefineGenerateStage

    stage = RefineGenerateStage.__new__(RefineGenerateStage)
    group = SimpleNamespace(shifts=("position", "size"), scales=(0.0, 0.25, 0.5, 0.7, 1.0))
    stage.families = [(group, object())]
    calls = []

    def family_rows(unit, ctx, family, shifts, scales):
        calls.append((tuple(shifts), tuple(scales)))
        top = max(scales)
        return [schema.trajectory_row(class_id=unit.class_id, class_name=unit.class_name, seed=unit.seed, shift=sh,
                                      scales=scales, images=[f"{sh}@{s}|top {top}".encode() for s in scales],
                                      params=[{"level": s} for s in scales]) for sh in shifts]

    stage.family_rows = family_rows
    row = {"unit_id": "007_0001", "class_id": 7, "class_name": "seven", "seed": 1, "shifts": ["position", "size", "size"],
           "scales": [0.3125, 0.3125, 1.0], "references": [b"ref-p", b"ref-s", b"ref-s"]}
    out = stage.process([row])
    assert calls == [(("position", "size"), (0.0, 0.3125, 1.0)), (("size",), (0.0, 1.0))]
    assert [(r["shift"], r["scales"], r["images"]) for r in out] == [
        ("position", [0.0, 0.3125], [b"ref-p", b"position@0.3125|top 1.0"]),
        ("size", [0.0, 0.3125], [b"ref-s", b"size@0.3125|top 1.0"]),
        ("size", [0.0, 1.0], [b"ref-s", b"size@1.0|top 1.0"])]
    assert all(len(r["sample_ids"]) == len(r["params"]) == 2 for r in out)
