"""Robustness cards without building a world: suites, validation, models, the exported kind,
the headline metrics on synthetic tables against the report's functions, the leaderboard."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
WORLD = REPO / "assets" / "world"
needs_world = pytest.mark.skipif(not (WORLD / "world.json").is_file(), reason="assets/world not trained")


# --------------------------------------------------------------------------- suites
def test_shipped_suites_name_the_world_configs_and_the_releases():
    from pipeline.card.suite import load_suite

    world = load_suite(REPO / "configs" / "suite_world.yaml")
    configs = {b.name: Path(b.config).name for b in world.benchmarks}
    assert configs == {"cns": "demo.yaml", "corruptions": "world_corruptions.yaml", "imagenet_d": "world_imagenet_d.yaml",
                       "ximagenet": "world_ximagenet.yaml", "imagenet_e": "world_imagenet_e.yaml"}
    assert {b.family for b in world.benchmarks} == {"cns", "corruptions", "imagenet_d", "ximagenet", "imagenet_e"}
    assert all(b.kind == "build" and b.output.endswith(f"runs/suite_world/{b.name}") for b in world.benchmarks)
    release = load_suite(REPO / "configs" / "suite_release.yaml")
    assert [b.kind for b in release.benchmarks] == ["release"] * 5
    assert [b.entry.protocol for b in release.benchmarks] == ["cns", "imagenet_c", "imagenet_d", "ximagenet", "imagenet_e"]
    # The hash is what the suite says, not where its outputs go.
    assert load_suite(REPO / "configs" / "suite_world.yaml", outputs="/elsewhere").hash == world.hash
    assert world.hash != release.hash


def test_validate_release_suite_lists_every_missing_path(capsys):
    from pipeline.cli import main

    assert main(["validate", str(REPO / "configs" / "suite_release.yaml")]) == 2
    out = capsys.readouterr().out
    for name in ("CNS-Bench", "ImageNet-C", "ImageNet-D", "XIMAGENET-12", "ImageNet-E"):
        assert f"releases/{name}: not found" in out, out
    assert "5 problem(s)" in out


@needs_world
def test_validate_world_suite(capsys):
    from pipeline.cli import main

    assert main(["validate", str(REPO / "configs" / "suite_world.yaml")]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "suite" in out and "world" in out and "all benchmarks ready" in out


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, said",
    [
        ("suite: s\nbenchmarks: [{name: a, family: cns, confg: x.yaml}]\n", "benchmarks[0].confg: unknown key"),
        ("suite: s\nbenchmarks: [{name: a, family: cnss, config: x.yaml}]\n", "benchmarks[0].family"),
        ("suite: s\noutputs: o\nbenchmarks: [{name: a, family: cns, config: x.yaml}, {name: a, family: cns, config: y.yaml}]\n",
         "benchmark names repeat: ['a']"),
        ("suite: s\nbenchmarks: [{name: a, family: cns, release: /r}]\n", "a release entry needs `config`"),
        ("suite: s\nbenchmarks: [{name: a, family: cns, config: x.yaml}]\n", "has no `output` and the suite no `outputs`"),
    ],
)
def test_a_malformed_suite_is_refused_naming_the_key(tmp_path, capsys, text, said):
    from pipeline.cli import main

    suite = _write(tmp_path / "suite.yaml", text)
    assert main(["validate", str(suite)]) == 2
    assert said in capsys.readouterr().err


@needs_world
def test_validate_names_a_stated_protocol_and_baseline_that_do_not_hold(tmp_path, capsys):
    from pipeline.cli import main

    suite = _write(tmp_path / "suite.yaml", f"""
suite: bad
baseline: cnn
outputs: {tmp_path}/out
benchmarks:
  - {{name: cns, family: cns, config: {REPO}/configs/demo.yaml, protocol: cns}}
  - {{name: c, family: corruptions, config: {REPO}/configs/world_corruptions.yaml}}
  - {{name: old, family: cns, output: {tmp_path}/nothing}}
""")
    assert main(["validate", str(suite)]) == 2
    out = capsys.readouterr().out
    assert "benchmarks[0] (cns).protocol: 'cns', but the benchmark is evaluated with the 'custom' protocol" in out
    assert "the suite's baseline 'cnn' differs from aggregate.analyses[corruption_error].baseline 'linear'" in out
    assert f"benchmarks[2] (old).output: {tmp_path}/nothing: no cnsbench output there" in out


# --------------------------------------------------------------------------- models
@needs_world
def test_exported_linear_equals_its_torchscript_form():
    """The shipped torch.export program of the world's linear classifier: the same logits as
    its TorchScript file, its preprocessing read from the archive without loading it."""
    from PIL import Image

    from pipeline.card.model import own_preprocess
    from pipeline.config import ClassifierSpec, load_config
    from pipeline.models.classifiers import TorchScriptClassifier
    from pipeline.models.exported import ExportedClassifier

    cfg = load_config(REPO / "configs" / "demo.yaml")
    spec = ClassifierSpec(name="lx", kind="exported", model="linear-softmax-regression",
                          checkpoint=str(WORLD / "classifiers" / "linear.pt2"))
    assert own_preprocess(spec) == {"resize_to": [3, 32, 32], "interpolation": "bilinear", "mean": [0.5] * 3, "std": [0.5] * 3}
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(5)]
    exported = ExportedClassifier(spec, "cpu", cfg.benchmark.label_space)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        scripted = TorchScriptClassifier(cfg.classifiers[0], "cpu", cfg.benchmark.label_space)
    assert exported.out_to_label == list(range(10))
    assert np.array_equal(exported.predict(images).numpy(), scripted.predict(images).numpy())
    assert exported.predict(images[:1]).shape == (1, 10)
    assert WORLD.joinpath("classifiers", "linear.pt2").stat().st_size < 100_000


def test_exported_kind_round_trip_and_errors(tmp_path):
    import torch

    from pipeline.config import ClassifierSpec
    from pipeline.models.exported import ExportedClassifier, export_classifier

    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8 * 8, 3))
    path = export_classifier(net, str(tmp_path / "grey.pt2"), {"input_size": [1, 8, 8], "mean": [0.5], "std": [0.25]})
    spec = ClassifierSpec(name="g", kind="exported", model="grey", checkpoint=path, label_map={0: 0, 1: 1, 2: 2})
    clf = ExportedClassifier(spec, "cpu")
    from PIL import Image

    x = clf.predict([Image.new("RGB", (16, 16), (255, 255, 255))])
    want = net(torch.full((1, 1, 8, 8), (1.0 - 0.5) / 0.25))
    assert torch.allclose(x, want, atol=1e-6) and clf.preprocess_cfg["input_size"] == [1, 8, 8]
    over = spec.model_copy(update={"model_kwargs": {"std": [0.0]}})
    with pytest.raises(ValueError, match=r"model_kwargs.std: std must be a list of non-zero numbers"):
        ExportedClassifier(over, "cpu")
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a readable model archive"):
        ExportedClassifier(spec.model_copy(update={"checkpoint": str(junk)}), "cpu")
    with pytest.raises(FileNotFoundError, match="checkpoint file not found"):
        ExportedClassifier(spec.model_copy(update={"checkpoint": str(tmp_path / "none.pt2")}), "cpu")


@needs_world
def test_the_model_from_a_file_inline_or_by_name(tmp_path):
    from pipeline.card.model import identity, resolve_model
    from pipeline.card.suite import load_suite
    from pipeline.config import ConfigError

    suite = load_suite(REPO / "configs" / "suite_world.yaml")
    loaders = [b.load_config for b in suite.benchmarks]
    named = resolve_model("linear", configs=loaders)
    assert (named.name, named.kind, Path(named.checkpoint).name) == ("linear", "torchscript", "linear.torchscript.pt")
    inline = resolve_model("linear-softmax-regression", kind="exported", checkpoint=str(WORLD / "classifiers" / "linear.pt2"),
                           name="linear-exported")
    assert inline.name == "linear-exported" and Path(inline.checkpoint).is_absolute()
    entry = _write(tmp_path / "m.yaml", "name: lx\nkind: exported\nmodel: lin\ncheckpoint: ../../../" +
                   str((WORLD / "classifiers" / "linear.pt2").relative_to(REPO)) + "\n")
    (tmp_path / "a" / "b").mkdir(parents=True)
    moved = (tmp_path / "a" / "b" / "m.yaml")
    moved.write_text(entry.read_text().replace("../../../", str(REPO) + "/"))
    from_file = resolve_model(str(moved))
    assert from_file.checkpoint == str(WORLD / "classifiers" / "linear.pt2")
    ident = identity(from_file)
    import hashlib

    assert ident["weights_sha256"] == hashlib.sha256((WORLD / "classifiers" / "linear.pt2").read_bytes()).hexdigest()
    assert ident["preprocess"]["resize_to"] == [3, 32, 32]
    with pytest.raises(ConfigError, match="go with --model-kind"):
        resolve_model("x", checkpoint="y")
    with pytest.raises(ConfigError, match="invalid model entry"):
        resolve_model(str(_write(tmp_path / "bad.yaml", "kind: timm\nmodel: resnet18\nname: 'a b'\n")))


# --------------------------------------------------------------------------- headline metrics
def _config(families=None, scales=(0, 1, 2)):
    from pipeline.config import parse_config

    raw = {
        "protocol": "custom",
        "benchmark": {"name": "t", "labels": ["a", "b", "c"], "classes": ["a", "b", "c"], "seeds": [1, 2, 3, 4],
                      "shifts": ["s1", "s2"], "scales": list(scales)},
        "generator": {"kind": "slider", "model": "/m", "slider_store": "/s", "class_tokens": {"kind": "ti_folder", "path": "/t"}},
        "filter": {"kind": "none"},
        "classifiers": [{"name": "m", "kind": "timm", "model": "resnet18"}, {"name": "b", "kind": "timm", "model": "resnet18"}],
        "aggregate": {"bootstrap": {"resamples": 300, "seed": 3}},
    }
    if families:
        raw["families"] = families
    return parse_config(raw)


def _tables(shifts, scales, rng, p_correct):
    rows, preds = [], []
    for shift in shifts:
        for cls in range(3):
            for seed in range(1, 5):
                tid = f"{shift}/{cls:03d}/seed_{seed:04d}"
                for s in scales:
                    sid = f"{tid}_scale_{round(s * 1000):04d}"
                    rows.append({"sample_id": sid, "trajectory_id": tid, "class_id": cls, "seed": seed, "shift": shift,
                                 "scale": float(s), "kept": True, "shard": "x", "key": sid})
                    for clf, p in p_correct.items():
                        preds.append({"sample_id": sid, "classifier": clf, "correct": bool(rng.random() < p(s))})
    return pd.DataFrame(rows), pd.DataFrame(preds)


def test_cns_headline_is_the_reports_summary_with_its_intervals():
    from pipeline.aggregate import bootstrap
    from pipeline.aggregate.metrics import compute_metrics
    from pipeline.card.headline import Tables, cns

    cfg = _config()
    samples, preds = _tables(["s1", "s2"], [0, 1, 2], np.random.default_rng(1),
                             {"m": lambda s: 0.9 - 0.3 * s, "b": lambda s: 0.8 - 0.1 * s})
    h = cns(Tables(cfg, samples, preds, "m"))
    m = compute_metrics(samples, preds, [0.0, 1.0, 2.0], 3.0)  # the report: every classifier at once
    iv = bootstrap.intervals(samples, preds, m, resamples=300, seed=3)
    summ, ci = m.summary.set_index("classifier"), iv.summary.set_index("classifier")
    assert h.value == summ.at["m", "acc_drop_2000"]
    assert (h.ci_low, h.ci_high) == (ci.at["m", "acc_drop_2000_ci_low"], ci.at["m", "acc_drop_2000_ci_high"])
    fp = {d.key["scale"]: d for d in h.details if d.metric == "fp_ratio"}
    table = m.failure_point_table.query("classifier == 'm' and shift == 'all'").set_index("scale")
    assert [fp[s].value for s in (0.0, 1.0, 2.0)] == table["fp_ratio"].tolist()
    assert h.higher_is_better is False and h.n_units == 24


def test_corruption_headline_is_corruption_error_normalised_by_the_baseline():
    from pipeline.analyses.corruption import corruption_table, severity_errors
    from pipeline.card.headline import Tables, corruptions

    cfg = _config(families=[{"kind": "corruption", "shifts": ["gaussian_noise", "fog"], "scales": [0, 1, 2, 3, 4, 5]}])
    samples, preds = _tables(["gaussian_noise", "fog"], range(6), np.random.default_rng(2),
                             {"m": lambda s: 0.95 - 0.15 * s, "b": lambda s: 0.9 - 0.1 * s})
    h = corruptions(Tables(cfg, samples, preds, "m", "b"))
    table = corruption_table(severity_errors(samples, preds, ["gaussian_noise", "fog"]), "b")
    mine = table[table["classifier"] == "m"].set_index("corruption")
    assert h.metric == "mce" and h.value == pytest.approx(mine.at["mean", "ce_baseline"], abs=0)
    ce = {d.key["corruption"]: d for d in h.details if d.metric == "ce"}
    assert ce["fog"].value == mine.at["fog", "ce_baseline"]
    assert h.ci_low < h.value < h.ci_high
    rel = next(d for d in h.details if d.metric == "relative_mce")
    assert rel.value == mine.at["mean", "relative_ce_baseline"]
    # the baseline itself: mCE 1 exactly, on every resample
    own = corruptions(Tables(cfg, samples, preds, "b", "b"))
    assert own.value == 1.0 and own.ci_low == 1.0 == own.ci_high


def test_imagenet_d_headline_is_accuracy_per_nuisance():
    from pipeline.aggregate.metrics import accuracy_table
    from pipeline.card.headline import Tables, imagenet_d

    cfg = _config(scales=(0, 1))
    samples, preds = _tables(["s1", "s2"], [0, 1], np.random.default_rng(3), {"m": lambda s: 0.9 - 0.5 * s})
    h = imagenet_d(Tables(cfg, samples, preds, "m"))
    acc = accuracy_table(samples, preds, [0.0, 1.0]).query("scale == 1.0").set_index("shift")["accuracy"]
    assert {d.key["nuisance"]: d.value for d in h.details} == acc.to_dict()
    assert h.value == pytest.approx(acc.mean(), abs=1e-15) and h.ci_low <= h.value <= h.ci_high


def test_robustness_score_resamples_are_the_score_at_unit_weights(monkeypatch):
    """With every unit drawn once, the resampled mu, C(i) and S are the analysis' own."""
    from pipeline.aggregate import bootstrap
    from pipeline.analyses.robustness_score import robustness_score
    from pipeline.card import headline

    rng = np.random.default_rng(4)
    rows = []
    for cls in range(3):
        for seed in range(1, 5):
            for sc in ("a", "b", "c"):
                rows.append({"classifier": "m", "shift": sc, "scale": 0.0, "class_id": cls, "seed": seed, "correct": cls + seed > 2})
                rows.append({"classifier": "m", "shift": sc, "scale": 1.0, "class_id": cls, "seed": seed,
                             "correct": bool(rng.random() < 0.6)})
    df = pd.DataFrame(rows)
    monkeypatch.setattr(bootstrap, "resample_counts", lambda strata, n, rng: np.ones((n, len(strata))))
    t = headline.Tables(_config(), pd.DataFrame(), pd.DataFrame(), "m")
    row = pd.Series({"var_inner_table": 0.01})
    draws, n = headline._score_bootstrap(t, df, ["a", "b", "c"], {"a": 1.0, "b": 1.0, "c": 1.0}, None, "table", row)
    orig = df[df["scale"] == 0].drop_duplicates(["class_id", "seed"])["correct"].mean()
    cross = [df[(df["shift"] == sc) & (df["scale"] == 1.0)]["correct"].mean() for sc in "abc"]
    want = robustness_score(cross, [0.0, 0.0, 0.0], orig, 0.0, "table")["var_cross"]
    assert n == 12 and np.allclose(draws["mu"], orig) and np.allclose(draws["C"], cross)
    assert np.allclose(draws["score"], 1.0 - (want + 0.01))


# --------------------------------------------------------------------------- leaderboard
def _card(tmp_path: Path, model: str, values: dict[str, tuple[float, float, float]], **suite) -> Path:
    folder = tmp_path / model
    folder.mkdir()
    benchmarks = [
        {"benchmark": b, "family": "cns", "metric": "accuracy_drop", "value": v, "ci_low": lo, "ci_high": hi,
         "higher_is_better": False, "protocol": "custom", "config_hash": "c" * 64, "benchmark_hash": f"{b}-h",
         "images_digest": f"{b}-i"}
        for b, (v, lo, hi) in values.items()
    ]
    card = {"card": 1, "model": {"name": model, "weights_sha256": None},
            "suite": {"name": "s", "hash": "h" * 64, "baseline": None, **suite}, "benchmarks": benchmarks}
    (folder / "card.json").write_text(json.dumps(card))
    return folder


def test_leaderboard_ranks_with_intervals_and_correlates_benchmarks(tmp_path, capsys):
    from pipeline.cli import main

    cards = [
        _card(tmp_path, "a", {"x": (0.10, 0.05, 0.15), "y": (0.20, 0.10, 0.30)}),
        _card(tmp_path, "b", {"x": (0.30, 0.25, 0.35), "y": (0.50, 0.40, 0.60)}),
        _card(tmp_path, "c", {"x": (0.12, 0.02, 0.22), "y": (0.60, 0.55, 0.65)}),
    ]
    out = tmp_path / "lb"
    assert main(["leaderboard", *map(str, cards), "--output", str(out)]) == 0
    table = pd.read_csv(out / "leaderboard.csv")
    x = table[table["benchmark"] == "x"].set_index("model")
    assert x["rank"].to_dict() == {"a": 1, "c": 2, "b": 3}  # lower drop ranks first
    assert x["tier"].to_dict() == {"a": 1, "c": 1, "b": 3}  # b's interval is beaten by both others
    lines = (out / "leaderboard.csv").read_text().splitlines()
    assert lines[1].startswith("a,x,") and ",False,1,1,custom," in lines[1]  # ranks and tiers as whole numbers
    assert "<td>1.0000</td>" not in (out / "index.html").read_text().split("Rank correlation")[0]
    corr = pd.read_csv(out / "correlations.csv")
    assert corr[["benchmark_a", "benchmark_b", "n_models"]].values.tolist() == [["x", "y", 3]]
    assert corr["spearman_rho"].item() == pytest.approx(0.5) and corr["kendall_tau"].item() == pytest.approx(1 / 3)
    # three models: every one of the 6 orderings is at least as far from 0 as 0.5 (or 1/3)
    assert corr["spearman_p"].item() == 1.0 and corr["kendall_p"].item() == 1.0
    assert "Rank correlation between benchmarks" in (out / "index.html").read_text()


def test_leaderboard_refuses_cards_of_another_suite_or_output(tmp_path, capsys):
    from pipeline.cli import main

    a = _card(tmp_path, "a", {"x": (0.1, 0.0, 0.2)})
    other = _card(tmp_path, "o", {"x": (0.2, 0.1, 0.3)}, hash="9" * 64, name="t")
    assert main(["leaderboard", str(a), str(other), "--output", str(tmp_path / "lb")]) == 2
    err = capsys.readouterr().err
    assert "suite.hash" in err and "suite.name" in err and not (tmp_path / "lb").exists()
    moved = _card(tmp_path, "m", {"x": (0.2, 0.1, 0.3)})
    data = json.loads((moved / "card.json").read_text())
    data["benchmarks"][0]["images_digest"] = "rebuilt"
    (moved / "card.json").write_text(json.dumps(data))
    assert main(["leaderboard", str(a), str(moved), "--output", str(tmp_path / "lb")]) == 2
    assert "benchmarks.x.images_digest" in capsys.readouterr().err
    assert main(["leaderboard", str(a), str(tmp_path / "nothing"), "--output", str(tmp_path / "lb")]) == 2
    assert "no card here" in capsys.readouterr().err


# --------------------------------------------------------------------------- bench/card.py
def test_bench_card_at_its_smallest(tiny_reference, tmp_path):
    """bench/card.py on a one-benchmark suite of an existing output: a card and a leaderboard,
    each a command of its own, timed."""
    import importlib.util
    import shutil

    out = tmp_path / "tiny"
    shutil.copytree(tiny_reference, out)
    suite = _write(tmp_path / "suite.yaml", f"suite: t\nbenchmarks: [{{name: cns, family: cns, output: {out}}}]\n")
    spec = importlib.util.spec_from_file_location("bench_card", REPO / "bench" / "card.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    work = tmp_path / "work"
    res = bench.main(["--suite", str(suite), "--models", "tiny-resnet", "--work", str(work), "--phases", "built", "--json"])
    steps = res["built"]["steps"]
    assert [s["step"] for s in steps] == ["card tiny-resnet", "leaderboard"]
    assert all(s["wall_s"] > 0 and s["cpu_s"] > 0 for s in steps) and res["built"]["wall_s"] >= steps[0]["wall_s"]
    card = json.loads((work / "cards" / "tiny-resnet" / "card.json").read_text())
    assert card["benchmarks"][0]["metric"] == "accuracy_drop" and (work / "leaderboard" / "leaderboard.csv").is_file()


# --------------------------------------------------------------------------- a released dataset
def _imagenet_c(root: Path) -> Path:
    """A few images in the ImageNet-C release's layout, <corruption>/<severity>/<wnid>/*.JPEG."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for wnid in ("n01443537", "n01614925"):  # goldfish, bald eagle: classes of configs/tiny.yaml
        for i in range(2):
            img = rng.integers(0, 255, (224, 224, 3), dtype=np.uint8)
            for cor in ("gaussian_noise", "fog"):
                for sev in range(1, 6):
                    d = root / cor / str(sev) / wnid
                    d.mkdir(parents=True, exist_ok=True)
                    Image.fromarray(np.clip(img.astype(int) + 20 * sev, 0, 255).astype(np.uint8)).save(
                        d / f"ILSVRC2012_val_{i:08d}.JPEG", "JPEG", quality=85)
    return root


def test_a_release_is_evaluated_once_under_its_protocol_then_given_each_model(tmp_path, capsys):
    """The first card evaluates the release with its model and the baseline under ImageNet-C's
    protocol; the next adds its model to the committed shards with the same protocol; each
    card's mCE is its report's."""
    from pipeline.cli import main
    from pipeline.demo.assets import ensure_tiny_assets

    ensure_tiny_assets()
    release = _imagenet_c(tmp_path / "ImageNet-C")
    suite = _write(tmp_path / "suite.yaml", f"""
suite: rel
baseline: tiny-resnet
outputs: {tmp_path}/outputs
benchmarks:
  - {{name: c, family: corruptions, release: {release}, source_kind: imagenet_c, protocol: imagenet_c,
     config: {REPO}/configs/tiny.yaml, sets: [aggregate.plots=false, aggregate.strips.count=0]}}
""")
    assert main(["validate", str(suite)]) == 0, capsys.readouterr().out
    for model in ("tiny-vit", "tiny-clip-zs"):
        assert main(["card", model, "--suite", str(suite), "--output", str(tmp_path / model), "--runner", "local"]) == 0
    out = tmp_path / "outputs" / "c"
    cfg = json.loads((out / "config.json").read_text())["config"]
    assert [c["name"] for c in cfg["classifiers"]] == ["tiny-resnet", "tiny-vit", "tiny-clip-zs"]
    crop_only = {"resize": 256, "crop": 224, "interpolation": "bilinear", "mean": [0.485, 0.456, 0.406],
                 "std": [0.229, 0.224, 0.225], "shifted_crop_only": True}
    assert cfg["classifiers"][1]["preprocess"] == crop_only  # test.py's input, as evaluate gives it
    protocol = next(a for a in cfg["aggregate"]["analyses"] if isinstance(a, dict) and a["name"] == "release_protocol")
    assert set(protocol["classifiers"]) == {"tiny-resnet", "tiny-vit", "tiny-clip-zs"}
    ce = pd.read_csv(out / "report" / "corruption_error.csv").set_index(["classifier", "corruption"])
    for model in ("tiny-vit", "tiny-clip-zs"):
        entry = json.loads((tmp_path / model / "card.json").read_text())["benchmarks"][0]
        assert entry["protocol"] == "imagenet_c" and entry["metric"] == "mce"
        want = ce.at[(model, "mean"), "ce_baseline"]
        assert (entry["value"] is None) if pd.isna(want) else entry["value"] == pytest.approx(want, abs=1e-12), (model, want, entry["value"])

    # The release's output as an output entry is only read: a new model (tiny-vit's entry under
    # another name) is scored into the card's own output with the release's protocol inputs and
    # the suite's baseline, so its mCE is tiny-vit's.
    import yaml

    vit = next(c for c in yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())["classifiers"] if c["name"] == "tiny-vit")
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump({**vit, "name": "tiny-vit-again",
                                     "checkpoint": str(REPO / "assets" / "tiny" / "classifiers" / "tiny_vit_2.pth")}))
    reader = _write(tmp_path / "reader.yaml", f"""
suite: reader
baseline: tiny-resnet
benchmarks:
  - {{name: c, family: corruptions, output: {out}, protocol: imagenet_c}}
""")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert main(["card", str(again), "--suite", str(reader), "--output", str(tmp_path / "again"), "--runner", "local"]) == 0
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    own = tmp_path / "again" / "outputs" / "c"
    mine = json.loads((own / "config.json").read_text())["config"]
    assert [c["name"] for c in mine["classifiers"]] == ["tiny-resnet", "tiny-vit-again"]
    assert mine["classifiers"][1]["preprocess"] == crop_only
    entry = json.loads((tmp_path / "again" / "card.json").read_text())["benchmarks"][0]
    assert entry["output"] == str(own) and entry["protocol"] == "imagenet_c"
    vit_entry = json.loads((tmp_path / "tiny-vit" / "card.json").read_text())["benchmarks"][0]
    assert entry["value"] is not None and entry["value"] == pytest.approx(vit_entry["value"], abs=1e-12)


@pytest.mark.parametrize("x,y,rho,p_rho,tau,p_tau", [
    ([1, 2, 3], [1, 2, 3], 1.0, 2 / 6, 1.0, 2 / 6),  # identity and reversal of 3! orderings reach |1|
    # a tie: 2 of 6 orderings are [1, 1, 3] (doubling the one-sided share, permutation_test's default, would say 2/3)
    ([1, 1, 3], [1, 1, 3], 1.0, 2 / 6, 1.0, 2 / 6),
    ([1, 3, 2], [1, 2, 3], 0.5, 1.0, 1 / 3, 1.0),
    # six models, two swaps: scipy's exact Kendall p (0.13611) and permutation_test's Spearman p (42 of 720)
    ([1, 2, 3, 4, 5, 6], [2, 1, 4, 3, 6, 5], 29 / 35, 42 / 720, 0.6, 0.1361111111111111),
])
def test_rank_association_p_values_are_exact_for_few_models(x, y, rho, p_rho, tau, p_tau):
    from pipeline.card.leaderboard import rank_association

    got = rank_association(np.array(x, float), np.array(y, float))
    assert got == pytest.approx((rho, p_rho, tau, p_tau))


# The world's leaderboard (docs/card.md, "The world's leaderboard"): each model's headline on
# each benchmark, and the rank correlations the exact enumeration gave before permutation_test.
WORLD_VALUES = {  # benchmark: (family, {model: value})
    "cns": ("cns", {"linear": 0.152, "cnn": 0.578, "vit": 0.267, "clip-zs": 0.078}),
    "corruptions": ("corruptions", {"linear": 1.0, "cnn": 10.77, "vit": 3.60, "clip-zs": 6.24}),
    "imagenet_d": ("imagenet_d", {"linear": 0.728, "cnn": 0.772, "vit": 0.767, "clip-zs": 0.994}),
    "ximagenet": ("ximagenet", {"linear": 0.964, "cnn": 0.921, "vit": 0.956, "clip-zs": 0.925}),
    "imagenet_e": ("imagenet_e", {"linear": 0.460, "cnn": 0.510, "vit": 0.460, "clip-zs": 0.560}),
}
WORLD_CORRELATIONS = [  # rho, p, tau, p
    ("cns", "corruptions", 0.4, 0.75, 1 / 3, 0.75),
    ("cns", "imagenet_d", 0.2, 11 / 12, 0.0, 1.0),
    ("cns", "ximagenet", 0.4, 0.75, 1 / 3, 0.75),
    ("cns", "imagenet_e", -0.316227766017, 2 / 3, -0.182574185835, 1.0),
    ("corruptions", "imagenet_d", -0.8, 1 / 3, -2 / 3, 1 / 3),
    ("corruptions", "ximagenet", 1.0, 1 / 12, 1.0, 1 / 12),
    ("corruptions", "imagenet_e", 0.737864787373, 1 / 3, 0.547722557505, 0.5),
    ("imagenet_d", "ximagenet", -0.8, 1 / 3, -2 / 3, 1 / 3),
    ("imagenet_d", "imagenet_e", -0.948683298051, 1 / 6, -0.912870929175, 1 / 6),
    ("ximagenet", "imagenet_e", 0.737864787373, 1 / 3, 0.547722557505, 0.5),
]


def test_the_worlds_leaderboard_gives_the_same_rank_correlations(tmp_path):
    from pipeline.card.leaderboard import rank_correlations, rank_table

    metric = {"cns": "accuracy_drop", "corruptions": "mce", "imagenet_d": "accuracy", "ximagenet": "robustness_score",
              "imagenet_e": "mean_drop_published"}
    cards = [
        {"model": {"name": m, "weights_sha256": None}, "_location": m, "benchmarks": [
            {"benchmark": b, "family": f, "metric": metric[f], "value": v[m], "ci_low": v[m], "ci_high": v[m],
             "protocol": "custom"} for b, (f, v) in WORLD_VALUES.items()]}
        for m in ("linear", "cnn", "vit", "clip-zs")
    ]
    table = rank_table(cards)
    assert table[table["benchmark"] == "imagenet_e"].set_index("model")["rank"].to_dict() == {
        "linear": 1, "vit": 1, "cnn": 3, "clip-zs": 4}  # a tie shares the smaller rank
    got = rank_correlations(table)
    assert got[["benchmark_a", "benchmark_b"]].values.tolist() == [[a, b] for a, b, *_ in WORLD_CORRELATIONS]
    assert (got["n_models"] == 4).all()
    want = np.array([row[2:] for row in WORLD_CORRELATIONS])
    assert got[["spearman_rho", "spearman_p", "kendall_tau", "kendall_p"]].to_numpy() == pytest.approx(want, abs=1e-9)


def test_rank_association_is_exact_at_nine_models():
    """Nine models: every one of the 9! pairings counted (checked against an enumeration here
    and, for Kendall without ties, scipy's exact distribution); with ties too."""
    import itertools
    import math

    from scipy import stats

    from pipeline.card.leaderboard import rank_association

    orders = np.array(list(itertools.permutations(range(9))))
    for x, y in (
        (np.arange(1.0, 10.0), np.array([2, 1, 4, 3, 6, 5, 8, 7, 9.0])),
        (np.array([1, 2, 2, 4, 5, 6, 7, 7, 9.0]), np.array([3, 1, 2, 5, 4, 9, 6, 8, 7.0])),
    ):
        rho, p_rho, tau, p_tau = rank_association(x, y)
        rx, ry = stats.rankdata(x), stats.rankdata(y)
        cx, cy = rx - rx.mean(), ry - ry.mean()
        all_rho = (cy[orders] @ cx) / np.sqrt((cx @ cx) * (cy @ cy))
        i, j = np.triu_indices(9, 1)
        sx = np.sign(x[i] - x[j])
        yo = y[orders]
        pairs = len(i)
        denom = np.sqrt((pairs - (sx == 0).sum()) * (pairs - (np.sign(y[i] - y[j]) == 0).sum()))
        all_tau = (np.sign(yo[:, i] - yo[:, j]) @ sx) / denom
        assert rho == pytest.approx(stats.spearmanr(x, y).statistic) and tau == pytest.approx(stats.kendalltau(x, y).statistic)
        assert p_rho == np.mean(np.abs(all_rho) >= abs(rho) - 1e-12)
        assert p_tau == np.mean(np.abs(all_tau) >= abs(tau) - 1e-12)
        assert (p_rho * math.factorial(9)) == pytest.approx(round(p_rho * math.factorial(9)))  # a count of pairings
        if len(set(x)) == len(set(y)) == 9:
            assert p_tau == pytest.approx(stats.kendalltau(x, y, method="exact").pvalue)


def test_leaderboard_carries_clean_accuracy_and_ranks_failure_points_refined_where_every_card_has_one(tmp_path):
    from pipeline.cli import main

    def details(clean: float, grid: float, refined: float | None) -> list[dict]:
        out = [{"metric": "accuracy_clean", "value": clean, "key": {"scale": 0.0}},
               {"metric": "fp_avg", "value": grid, "ci_low": grid - 0.1, "ci_high": grid + 0.1, "key": {}}]
        if refined is not None:
            out.append({"metric": "fp_avg_refined", "value": refined, "ci_low": refined - 0.05,
                        "ci_high": refined + 0.05, "key": {"rounds": 3, "interval_width": 0.0625}})
        return out

    # x: every card refined (ranked by refined: b fails latest); y: c lacks one (ranked by grid).
    spec = {"a": {"x": (0.9, 1.0, 1.3), "y": (0.8, 1.5, 1.2)}, "b": {"x": (0.7, 1.5, 1.9), "y": (0.6, 1.0, 1.9)},
            "c": {"x": (0.95, 2.0, 1.1), "y": (0.5, 2.0, None)}}
    cards = []
    for model, per in spec.items():
        folder = _card(tmp_path, model, {b: (0.1, 0.05, 0.15) for b in per})
        card = json.loads((folder / "card.json").read_text())
        for b in card["benchmarks"]:
            b["details"] = details(*per[b["benchmark"]])
        (folder / "card.json").write_text(json.dumps(card))
        cards.append(folder)
    out = tmp_path / "lb"
    assert main(["leaderboard", *map(str, cards), "--output", str(out)]) == 0
    table = pd.read_csv(out / "leaderboard.csv")
    x = table[table["benchmark"] == "x"].set_index("model")
    y = table[table["benchmark"] == "y"].set_index("model")
    assert x["clean_accuracy"].to_dict() == {"a": 0.9, "b": 0.7, "c": 0.95}
    assert set(x["failure_point_basis"]) == {"refined"} and set(y["failure_point_basis"]) == {"grid"}
    assert x["failure_point"].to_dict() == {"a": 1.3, "b": 1.9, "c": 1.1}
    assert x["failure_point_rank"].to_dict() == {"b": 1, "a": 2, "c": 3}
    assert y["failure_point"].to_dict() == {"a": 1.5, "b": 1.0, "c": 2.0}
    assert y["failure_point_rank"].to_dict() == {"c": 1, "a": 2, "b": 3}
    page = (out / "index.html").read_text()
    assert "failure points: refined (every card of this benchmark has one)" in page
    assert "not every card of this benchmark has a refined one" in page and "clean_accuracy" in page


def _toy_headline(t):
    """Stands for a new family's headline function, named by its ``CardHeadline``."""
    return ("toy headline of", t)


def test_the_card_benchmarks_and_their_headlines_come_from_the_families(monkeypatch):
    """The shipped families give the five benchmarks, each dispatched to its function; a family
    registered alone adds its own benchmark to suites, cards and the dispatch."""
    from pipeline import registry
    from pipeline.card import headline as H
    from pipeline.card.schema import higher_is_better, metrics
    from pipeline.card.suite import BenchmarkEntry, card_benchmarks
    from pipeline.families.base import CardHeadline, Family

    assert metrics() == {"cns": {"accuracy_drop": False}, "corruptions": {"mce": False},
                         "imagenet_d": {"accuracy": True}, "ximagenet": {"robustness_score": True},
                         "imagenet_e": {"mean_drop_published": False, "mean_drop_all_levels": False,
                                        "mean_drop": False}}
    assert {b: h.function for b, h in card_benchmarks().items()} == {
        b: f"pipeline.card.headline:{b}" for b in ("cns", "corruptions", "imagenet_d", "ximagenet", "imagenet_e")}

    toy = type("ToyFamily", (Family,), {"kind": "toy", "headline": CardHeadline(
        "toy", f"{__name__}:_toy_headline", {"toy_score": True})})
    monkeypatch.setattr(sys.modules[__name__], "ToyFamily", toy, raising=False)
    monkeypatch.setitem(registry.FAMILIES._entries, "toy", (f"{__name__}:ToyFamily", "test"))
    assert BenchmarkEntry(name="t", family="toy", output="/o").family == "toy"
    assert H.headline("toy", "tables") == ("toy headline of", "tables") and higher_is_better("toy", "toy_score")
    with pytest.raises(ValueError, match="unknown card benchmark 'cnss'"):
        BenchmarkEntry(name="t", family="cnss", output="/o")
    # A second family declaring the same benchmark differently is refused, naming both.
    other = type("OtherToy", (Family,), {"kind": "toy2", "headline": CardHeadline("toy", f"{__name__}:_toy_headline")})
    monkeypatch.setattr(sys.modules[__name__], "OtherToy", other, raising=False)
    monkeypatch.setitem(registry.FAMILIES._entries, "toy2", (f"{__name__}:OtherToy", "test"))
    with pytest.raises(registry.PluginError, match="'toy' and 'toy2'"):
        card_benchmarks()
