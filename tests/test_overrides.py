"""``--set key.path=value``: parsed as YAML, merged before validation, errors naming the key."""

from __future__ import annotations

import json

import pytest

from pipeline.output_run import IncompatibleOutput, check_compatible, write_config
from pipeline.runtime.checkout import TINY_CONFIG
from pipeline.cli import main
from pipeline.config import ConfigError, config_hash, load_config
from pipeline.config.overrides import apply_overrides, parse_key
from pipeline.io.store import OutputStore


def test_key_paths():
    assert parse_key("generator.steps") == ["generator", "steps"]
    assert parse_key("classifiers[0].model_kwargs.a") == ["classifiers", 0, "model_kwargs", "a"]
    assert parse_key("classifiers.1.name") == ["classifiers", 1, "name"]
    for bad in ("", "a..b", "0.a", "a[x]", "a b"):
        with pytest.raises(ConfigError, match="--set"):
            parse_key(bad)


def test_values_are_yaml_and_applied_in_order():
    raw = {"benchmark": {"classes": [1, 22]}, "classifiers": [{"name": "a"}, {"name": "b"}]}
    out = apply_overrides(
        raw,
        ["benchmark.classes=[2]", "generator.steps=3", "classifiers[1].name=c", "classifiers.0.model_kwargs={x: 1.5}",
         "generator.steps=4", "generator.dtype=bfloat16"],
    )
    assert out["benchmark"]["classes"] == [2]
    assert out["generator"] == {"steps": 4, "dtype": "bfloat16"}  # a section the file left out is started
    assert [c["name"] for c in out["classifiers"]] == ["a", "c"]
    assert out["classifiers"][0]["model_kwargs"] == {"x": 1.5}
    assert raw["benchmark"]["classes"] == [1, 22]  # the file's mapping is not changed


def test_overrides_are_validated_and_recorded():
    cfg = load_config(TINY_CONFIG, sets=["generator.steps=3", "benchmark.classes=[22]", "classifiers[0].preprocess=model"])
    assert cfg.generator.steps == 3 and cfg.benchmark.classes == [22]
    assert cfg.classifiers[0].preprocess == "model"
    assert config_hash(cfg) != config_hash(load_config(TINY_CONFIG))


@pytest.mark.parametrize(
    "item, named",
    [
        ("generator.steps=abc", "generator.steps"),
        ("nosuch.key=1", "nosuch"),
        ("generator.stepz=1", "generator.stepz"),
        ("classifiers[7].name=x", "classifiers[7]"),
        ("generator.steps.x=1", "generator.steps"),
        ("benchmark.classes=[1, 2", "benchmark.classes"),
        ("generator.steps", "generator.steps"),
    ],
)
def test_bad_override_exits_2_naming_it(item, named, capsys):
    assert main(["validate", str(TINY_CONFIG), "--set", item]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err


def test_build_refuses_a_bad_value_before_doing_anything(tmp_path, capsys):
    out = tmp_path / "x"
    assert main(["build", str(TINY_CONFIG), "--set", "generator.steps=abc", "--output", str(out)]) == 2
    assert "generator.steps" in capsys.readouterr().err
    assert not out.exists()


def test_every_config_command_takes_set():
    from pipeline.cli import make_parser

    parser = make_parser()
    for argv in (
        ["validate", "c.yaml"],
        ["build", "c.yaml"],
        ["evaluate", "src", "--output", "o"],
        ["train-sliders", "c.yaml"],
        ["submit", "c.yaml", "--output", "s3://b/p"],
        ["demo"],
    ):
        args = parser.parse_args([*argv, "--set", "a.b=1", "--set", "c=[2]"])
        assert args.sets == ["a.b=1", "c=[2]"], argv


def test_changed_set_is_a_changed_config_on_resume(tmp_path):
    store = OutputStore(str(tmp_path / "out"))
    write_config(store, load_config(TINY_CONFIG, sets=["generator.steps=3"]))
    recorded = json.loads((tmp_path / "out" / "config.json").read_text())["config"]
    assert recorded["generator"]["steps"] == 3  # the output's resolved config records the override
    assert check_compatible(store, load_config(TINY_CONFIG, sets=["generator.steps=3"])) is not None
    with pytest.raises(IncompatibleOutput, match="generator.steps: 3 -> 4"):
        check_compatible(store, load_config(TINY_CONFIG, sets=["generator.steps=4"]))


def test_submit_passes_overrides_to_the_job():
    from pipeline.runtime.jobs import build_entrypoint

    cmd = build_entrypoint("configs/tiny.yaml", "s3://b/p", sets=["benchmark.classes=[2, 3]"])
    assert cmd.endswith("'--set=benchmark.classes=[2, 3]'")


def test_plus_equals_appends_to_a_list_and_paths_resolve_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = {"benchmark": {"seeds": [1]}, "classifiers": [{"name": "a"}]}
    out = apply_overrides(raw, [
        "classifiers+={name: mine, kind: exported, checkpoint: ./mine.pt2, label_map: ../map.json}",
        "benchmark.seeds+=[7, 8]", "benchmark.classes+=3",
    ])
    assert [c["name"] for c in out["classifiers"]] == ["a", "mine"]
    assert out["classifiers"][1]["checkpoint"] == str(tmp_path / "mine.pt2")  # nested paths: against the current folder
    assert out["classifiers"][1]["label_map"] == str(tmp_path.parent / "map.json")
    assert out["benchmark"]["seeds"] == [1, 7, 8] and out["benchmark"]["classes"] == [3]
    assert raw["classifiers"] == [{"name": "a"}]
    with pytest.raises(ConfigError, match=r"--set classifiers\[0\]\.name\+=.*not a list"):
        apply_overrides(raw, ["classifiers[0].name+=x"])


def test_plus_equals_adds_a_classifier_to_a_config_file():
    cfg = load_config(TINY_CONFIG, sets=["classifiers+={name: extra, kind: timm, model: resnet18}"])
    names = [c.name for c in cfg.classifiers]
    assert names[-1] == "extra" and len(names) == len(load_config(TINY_CONFIG).classifiers) + 1
