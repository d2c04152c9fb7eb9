"""Hostile cards and card folders (issue 49): special files where a card is read, folders
of user files given as `--output`, another model's card, crafted values that would re-rank
every model, damaged files in a card folder, and suite paths.

Everything runs in process without a model or Ray: cards are written by hand, and a card
run has its outputs faked (:func:`fake_card_run`: ``prepare``, the model's identity and
the entry's numbers replaced), so the folder handling of ``cnsbench card`` runs for real.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hostile import foreign_directory, nested_json, tree_digest

from pipeline.cli import main

REPO = Path(__file__).resolve().parents[1]
# Unit tests, said outright: `cnsbench card` runs here with its benchmarks' outputs faked
# (``fake_card_run``), which the tier's patterns read as a card run on real outputs.
pytestmark = pytest.mark.unit
FAMILY_METRIC = {"cns": "accuracy_drop", "corruptions": "mce", "imagenet_d": "accuracy", "ximagenet": "robustness_score",
                 "imagenet_e": "mean_drop_published"}
HIGHER = {"cns": False, "corruptions": False, "imagenet_d": True, "ximagenet": True, "imagenet_e": False}


# --------------------------------------------------------------------------- builders
def entry(name: str, value: Any, family: str = "cns", low: Any = None, high: Any = None) -> dict[str, Any]:
    """One benchmark entry of a card, as `cnsbench card` writes it."""
    return {
        "benchmark": name, "family": family, "metric": FAMILY_METRIC[family], "value": value,
        "ci_low": value if low is None else low, "ci_high": value if high is None else high,
        "higher_is_better": HIGHER[family], "description": "d", "protocol": "custom",
        "protocol_detail": {"name": "custom", "original": "docs/protocol.md", "accuracy": "", "metric": ""},
        "config_hash": "c" * 64, "benchmark_hash": f"{name}-h", "images_digest": f"{name}-i", "output": f"/o/{name}",
        "preprocess": "model", "n_units": 4, "ci": {"level": 0.95, "resamples": 10, "seed": 0}, "left_out_shards": [],
        "details": [{"metric": "accuracy_clean", "value": 0.9, "ci_low": None, "ci_high": None, "key": {}}],
    }


def card_doc(model: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"card": 1, "model": {"name": model, "kind": "timm", "model": model, "weights": [], "weights_sha256": None,
                                 "preprocess": "model"},
            "suite": {"name": "s", "file": "/s.yaml", "hash": "h" * 64, "baseline": None,
                      "benchmarks": [e["benchmark"] for e in entries]},
            "benchmarks": entries, "cnsbench": "0", "created": "now"}


def write_card(root: Path, model: str, doc: Any) -> Path:
    folder = root / model
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "card.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return folder


def three_cards(root: Path, family: str = "cns") -> list[Path]:
    return [write_card(root, m, card_doc(m, [entry("x", v, family), entry("y", 1 - v, family)]))
            for m, v in (("a", 0.1), ("b", 0.3), ("c", 0.2))]


def folder_of(path: Path, files: dict[str, str]) -> tuple[Path, str]:
    """A new folder holding ``files`` (name -> text), and its tree digest."""
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    return path, tree_digest(path)


def leaderboard(*cards: Path, out: Path) -> int:
    return main(["leaderboard", *map(str, cards), "--output", str(out)])


def suite_file(tmp: Path, text: str) -> Path:
    p = tmp / "suite.yaml"
    p.write_text(text)
    return p


@pytest.fixture
def fake_card_run(tmp_path, monkeypatch):
    """`cnsbench card MODEL --suite SUITE` in process with its outputs faked: each benchmark
    is "prepared" without touching any output, and its entry is ``VALUES[model]``."""
    from pipeline.card import make
    from pipeline.card.outputs import Prepared

    values = {"m1": 0.1, "m2": 0.2}
    suite = suite_file(tmp_path, f"suite: s\noutputs: {tmp_path}/outputs\nbenchmarks:\n"
                       "  - {name: x, family: cns, output: /nowhere/x}\n  - {name: y, family: cns, output: /nowhere/y}\n")

    def prepare(b, model, **kw):
        return Prepared(b, b.output, None, "c" * 64, model, {"name": "custom"}, "none")

    def compute_entry(p, suite, echo):
        return {k: v for k, v in entry(p.benchmark.name, values[p.model.name]).items()
                if k not in ("benchmark_hash", "images_digest")}

    def identity(spec):
        return {"name": spec.name, "kind": spec.kind, "model": spec.model, "entry": {}, "weights": [],
                "weights_sha256": None, "preprocess": "model"}

    monkeypatch.setattr(make, "prepare", prepare)
    monkeypatch.setattr(make, "compute_entry", compute_entry)
    monkeypatch.setattr(make, "identity", identity)
    monkeypatch.setattr(make, "images_digest", lambda store: "i" * 64)
    monkeypatch.setattr(make, "benchmark_hash", lambda cfg: "b" * 64)

    def run(model: str, out: Path, *extra: str) -> int:
        return main(["card", model, "--model-kind", "timm", "--suite", str(suite), "--output", str(out), *extra])

    return run


# --------------------------------------------------------------------------- 3. special files
@pytest.mark.timeout(60)  # the hang this guards against: opening a FIFO blocks until a writer comes
def test_leaderboard_refuses_a_fifo_card_naming_it(tmp_path, capsys):
    a, b, _ = three_cards(tmp_path)
    (b / "card.json").unlink()
    os.mkfifo(b / "card.json")
    out = tmp_path / "lb"
    assert leaderboard(a, b, out=out) == 2
    err = capsys.readouterr().err
    assert f"{b}/card.json" in err and "FIFO" in err and "Traceback" not in err
    assert not out.exists()
    fifo = tmp_path / "fifo-card"  # the FIFO named as the card itself
    os.mkfifo(fifo)
    assert leaderboard(a, fifo, out=out) == 2
    err = capsys.readouterr().err
    assert str(fifo) in err and "FIFO" in err


def test_leaderboard_refuses_a_card_that_is_a_symlink_to_a_device(tmp_path, capsys):
    a, b, _ = three_cards(tmp_path)
    (b / "card.json").unlink()
    (b / "card.json").symlink_to("/dev/zero")
    assert leaderboard(a, b, out=tmp_path / "lb") == 2
    err = capsys.readouterr().err
    assert f"{b}/card.json" in err and "/dev/zero" in err and "character device" in err


def test_an_oversized_card_is_refused_before_it_is_read(tmp_path, capsys, monkeypatch):
    from pipeline.card import schema

    monkeypatch.setattr(schema, "CARD_LIMIT", 1000)
    a, b, _ = three_cards(tmp_path)
    assert leaderboard(a, b, out=tmp_path / "lb") == 2
    err = capsys.readouterr().err
    assert f"{a}/card.json" in err and "at most 1000" in err


# --------------------------------------------------------------------------- 4. folders claimed by a marker
def test_leaderboard_into_a_folder_of_user_files_changes_nothing(tmp_path, capsys):
    cards = three_cards(tmp_path)
    out, before = folder_of(tmp_path / "mine", {"leaderboard.csv": "my,own,table\n", "index.html": "<h1>my page</h1>"})
    assert leaderboard(*cards, out=out) == 2
    err = capsys.readouterr().err
    assert "holds no leaderboard" in err and "leaderboard.csv" in err and "nothing was changed" in err
    assert tree_digest(out) == before


def test_leaderboard_marker_is_checked_and_its_own_folder_reused(tmp_path, capsys):
    cards = three_cards(tmp_path)
    out = tmp_path / "lb"
    assert leaderboard(*cards, out=out) == 0
    assert json.loads((out / "cnsbench-leaderboard.json").read_text())["cnsbench"] == "leaderboard"
    assert leaderboard(*cards[:2], out=out) == 0  # an earlier leaderboard's folder: replaced
    assert set(json.loads((out / "cnsbench-leaderboard.json").read_text())["models"]) == {"a", "b"}
    fake, before = folder_of(tmp_path / "fake", {"cnsbench-leaderboard.json": '{"cnsbench": "compare"}', "index.html": "theirs"})
    assert leaderboard(*cards, out=fake) == 2
    assert "not a cnsbench leaderboard marker" in capsys.readouterr().err and tree_digest(fake) == before


def test_card_into_a_folder_of_user_files_changes_nothing(tmp_path, fake_card_run, capsys):
    out = tmp_path / "theirs"
    foreign_directory(out)
    (out / "benchmarks").mkdir()
    (out / "benchmarks" / "x.json").write_text('{"mine": 1}')  # a name a card writes
    before = tree_digest(out)
    assert fake_card_run("m1", out) == 2
    err = capsys.readouterr().err
    assert "holds no card" in err and "benchmarks" in err and "nothing was changed" in err
    assert tree_digest(out) == before
    user = tmp_path / "user-card-json"  # a user's file named card.json is not a card
    user.mkdir()
    (user / "card.json").write_text('{"title": "my card"}')
    before = tree_digest(user)
    assert fake_card_run("m1", user) == 2
    err = capsys.readouterr().err
    assert f"{user}/card.json" in err and "card: missing" in err and tree_digest(user) == before


def test_a_card_is_not_written_over_another_models_card_without_force(tmp_path, fake_card_run, capsys):
    out = tmp_path / "card"
    assert fake_card_run("m1", out) == 0
    assert (out / "cnsbench-card.json").is_file()
    before = tree_digest(out)
    assert fake_card_run("m2", out) == 2
    err = capsys.readouterr().err
    assert "'m1'" in err and "--force" in err and tree_digest(out) == before
    assert fake_card_run("m1", out) == 0 and tree_digest(out) == before  # its own folder: up to date, untouched
    assert fake_card_run("m2", out, "--force") == 0
    card = json.loads((out / "card.json").read_text())
    assert card["model"]["name"] == "m2" and [b["value"] for b in card["benchmarks"]] == [0.2, 0.2]
    assert json.loads((out / "cnsbench-card.json").read_text())["model"] == "m2"


@pytest.mark.parametrize("text,said", [("[]", "not a cnsbench card marker"), ('{"cnsbench": "compare"}', "not a cnsbench card marker"),
                                       (nested_json(5000), "nest")])
def test_a_damaged_card_marker_is_refused_naming_it(tmp_path, fake_card_run, capsys, text, said):
    out = tmp_path / "card"
    assert fake_card_run("m1", out) == 0
    (out / "cnsbench-card.json").write_text(text)
    before = tree_digest(out)
    capsys.readouterr()
    assert fake_card_run("m1", out, "--force") == 2
    err = capsys.readouterr().err
    assert f"{out}/cnsbench-card.json" in err and said in err and tree_digest(out) == before


def test_a_card_made_before_markers_is_still_its_models(tmp_path, fake_card_run, capsys):
    out = tmp_path / "card"
    assert fake_card_run("m1", out) == 0
    (out / "cnsbench-card.json").unlink()
    assert fake_card_run("m1", out) == 0
    assert fake_card_run("m2", out) == 2 and "'m1'" in capsys.readouterr().err


# --------------------------------------------------------------------------- 6. cards read strictly
@pytest.mark.parametrize("mutate,key", [
    (lambda c: c["benchmarks"][0].update(value="0.05"), "benchmarks[0].value"),
    (lambda c: c["benchmarks"][0].update(value=True), "benchmarks[0].value"),
    (lambda c: c["benchmarks"][0].update(value=[1, 2]), "benchmarks[0].value"),
    (lambda c: c["benchmarks"][1].update(ci_high="high"), "benchmarks[1].ci_high"),
    (lambda c: c.update(suite=["s"]), "suite"),
    (lambda c: c.update(model="a"), "model"),
    (lambda c: c["model"].pop("name"), "model.name"),
    (lambda c: c["benchmarks"][0].pop("value"), "benchmarks[0].value"),
    (lambda c: c.update(benchmarks=c["benchmarks"] + [c["benchmarks"][0]]), "benchmarks[2].benchmark"),
    (lambda c: c["benchmarks"][0].update(higher_is_better=True), "benchmarks[0].higher_is_better"),
    (lambda c: c["benchmarks"][0].update(family="cnn"), "benchmarks[0].family"),
    (lambda c: c["benchmarks"][0].update(ci_low=0.9, ci_high=0.1), "benchmarks[0].ci_low"),
    # A8b: a value outside its own interval would rank first
    (lambda c: c["benchmarks"][0].update(value=-5.0, ci_low=0.074, ci_high=0.233), "benchmarks[0].value"),
    (lambda c: c["benchmarks"][1].update(value=0.9, ci_low=0.074, ci_high=0.233), "benchmarks[1].value"),
    (lambda c: c["benchmarks"][0]["details"][0].update(value=2.0, ci_low=0.8, ci_high=0.95),
     "benchmarks[0].details[0].value"),
])
def test_a_crafted_card_is_refused_naming_the_file_and_the_key(tmp_path, capsys, mutate, key):
    a, b, c = three_cards(tmp_path)
    doc = json.loads((b / "card.json").read_text())
    mutate(doc)
    (b / "card.json").write_text(json.dumps(doc))
    assert leaderboard(a, b, c, out=tmp_path / "lb") == 2
    err = capsys.readouterr().err
    assert f"{b}/card.json: {key}:" in err, err
    assert "Traceback" not in err and not (tmp_path / "lb").exists()


@pytest.mark.parametrize("text,said", [("[]", "not a card"), (nested_json(500), "nest"), ('{"card": 1', "JSON")])
def test_a_card_that_is_not_an_object_is_refused_naming_it(tmp_path, capsys, text, said):
    a, b, _ = three_cards(tmp_path)
    (b / "card.json").write_text(text)
    assert leaderboard(a, b, out=tmp_path / "lb") == 2
    err = capsys.readouterr().err
    assert f"{b}/card.json" in err and said in err


def test_a_flipped_direction_or_a_second_listing_cannot_re_rank_the_others(tmp_path, capsys):
    """The direction of each metric is its definition: a leaderboard of honest cards ranks
    lower drops first, whatever a card says (it is refused); a benchmark is ranked once."""
    import pandas as pd

    cards = three_cards(tmp_path / "honest")
    assert leaderboard(*cards, out=tmp_path / "lb") == 0
    x = pd.read_csv(tmp_path / "lb" / "leaderboard.csv").query("benchmark == 'x'").set_index("model")
    assert x["rank"].to_dict() == {"a": 1, "c": 2, "b": 3} and not x["higher_is_better"].any()
    up = three_cards(tmp_path / "up", family="imagenet_d")  # accuracy: higher is better
    assert leaderboard(*up, out=tmp_path / "lb-up") == 0
    x = pd.read_csv(tmp_path / "lb-up" / "leaderboard.csv").query("benchmark == 'x'").set_index("model")
    assert x["rank"].to_dict() == {"b": 1, "c": 2, "a": 3} and x["higher_is_better"].all()


def test_a_damaged_kept_entry_is_refused_on_the_next_card_naming_it(tmp_path, fake_card_run, capsys):
    out = tmp_path / "card"
    assert fake_card_run("m1", out) == 0
    kept = out / "benchmarks" / "y.json"
    good = json.loads(kept.read_text())
    for text, said in (("[]", "must be an object"), (nested_json(5000), "nest"),
                       (json.dumps({**good, "value": "0.1"}), "<entry>.value"),
                       (json.dumps({**good, "key": [good["key"]]}), "key: must be an object")):
        kept.write_text(text)
        capsys.readouterr()
        assert fake_card_run("m1", out) == 2, text[:40]
        err = capsys.readouterr().err
        assert f"{kept}" in err and said in err and "remove the file" in err, (text[:40], err)
        assert "Traceback" not in err
    kept.unlink()
    os.mkfifo(kept)
    assert fake_card_run("m1", out) == 2
    assert "FIFO" in capsys.readouterr().err
    kept.unlink()
    assert fake_card_run("m1", out) == 0  # removed: computed again


@pytest.mark.parametrize("text", ["[]", nested_json(5000), '{"card": 1, "model": "m1"}'])
def test_a_damaged_card_json_is_refused_on_the_next_card_naming_it(tmp_path, fake_card_run, capsys, text):
    out = tmp_path / "card"
    assert fake_card_run("m1", out) == 0
    (out / "card.json").write_text(text)
    capsys.readouterr()
    assert fake_card_run("m1", out) == 2
    err = capsys.readouterr().err
    assert f"{out}/card.json" in err and "Traceback" not in err


# --------------------------------------------------------------------------- suite paths
def test_an_empty_outputs_folder_is_refused(tmp_path, fake_card_run, capsys):
    from pipeline.card.suite import load_suite
    from pipeline.config import ConfigError

    suite = suite_file(tmp_path, "suite: s\nbenchmarks: [{name: cns, family: cns, config: tiny.yaml}]\n")
    with pytest.raises(ConfigError, match="--outputs is empty"):
        load_suite(suite, "")
    assert fake_card_run("m1", tmp_path / "card", "--outputs", "") == 2
    assert "--outputs is empty" in capsys.readouterr().err and not (tmp_path / "card").exists()
    suite.write_text("suite: s\noutputs: ''\nbenchmarks: [{name: cns, family: cns, config: tiny.yaml}]\n")
    with pytest.raises(ConfigError, match="outputs"):
        load_suite(suite)


def test_validate_refuses_two_entries_making_one_output_differently(tmp_path, capsys):
    tiny = REPO / "configs" / "tiny.yaml"
    suite = suite_file(tmp_path, f"""suite: s
outputs: {tmp_path}/outputs
benchmarks:
  - {{name: a, family: cns, config: {tiny}, output: {tmp_path}/shared}}
  - {{name: b, family: cns, config: {tiny}, output: {tmp_path}/shared/, sets: ["benchmark.seeds=[5]"]}}
  - {{name: c, family: corruptions, config: {tiny}, output: {tmp_path}/shared}}
""")
    assert main(["validate", str(suite)]) == 2
    out = capsys.readouterr().out
    shared = [line for line in out.splitlines() if "share the output" in line]
    assert len(shared) == 2, out  # a and b, b and c; a and c make it alike (two families of one output)
    assert "benchmarks[0] (a) and benchmarks[1] (b)" in shared[0] and "sets" in shared[0]
    assert "benchmarks[1] (b) and benchmarks[2] (c)" in shared[1]


def test_a_refused_output_hints_at_options_card_has(tmp_path, monkeypatch, fake_card_run, capsys):
    """An output the suite's entry would change: the hint names what `card` offers, not
    `build --new-version`."""
    from pipeline.card import make
    from pipeline.config import config_hash, load_config, resolved_dict
    from pipeline.io.store import OutputStore
    from pipeline.output_run import check_compatible

    tiny = str(REPO / "configs" / "tiny.yaml")
    built = tmp_path / "built"
    built.mkdir()
    cfg = load_config(tiny)
    (built / "config.json").write_text(json.dumps({"config_hash": config_hash(cfg), "config": resolved_dict(cfg)}))
    other = load_config(tiny, sets=["output.trajectories_per_shard=3"])

    def prepare(b, model, **kw):
        check_compatible(OutputStore(str(built)), other)
        raise AssertionError("the output was accepted")

    monkeypatch.setattr(make, "prepare", prepare)
    assert fake_card_run("m1", tmp_path / "card") == 2
    err = capsys.readouterr().err
    assert "benchmarks[0] (x)" in err and "different config" in err and "trajectories_per_shard" in err
    assert "--new-version" not in err and "--outputs" in err
    foreign = tmp_path / "foreign"  # the entry's output holds someone's files: named as the entry's, not as --output
    before = foreign_directory(foreign)

    def claim(b, model, **kw):
        from pipeline.io.ownership import claim_output

        claim_output(OutputStore(str(foreign)))
        raise AssertionError("the folder was claimed")

    monkeypatch.setattr(make, "prepare", claim)
    assert fake_card_run("m1", tmp_path / "card") == 2
    err = capsys.readouterr().err
    assert f"benchmarks[0] (x): its output {foreign} is not empty" in err and "--outputs" in err
    assert "--output " not in err and tree_digest(foreign) == before
