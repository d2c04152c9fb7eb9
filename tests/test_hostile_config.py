"""Configs that would fail hours into a build (or exhaust memory) are refused by `validate`."""

from __future__ import annotations

import os
import time

import pytest
from hostile import tiny_cfg_path

from pipeline.cli import main
from pipeline.config import ConfigError, load_config


def set_key(path: str, value):
    def mutate(raw):
        node = raw
        keys = path.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value

    return mutate


def validate(tmp_path, capsys, mutate) -> tuple[int, str, float]:
    cfg = tiny_cfg_path(tmp_path, mutate, name="c.yaml")
    start = time.perf_counter()
    rc = main(["validate", str(cfg)])
    return rc, capsys.readouterr().err, time.perf_counter() - start


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("benchmark.scales", [0, 0.0001, 1], "closer than 0.001"),
        ("benchmark.scales", [0, 0.5, 0.5004], "closer than 0.001"),
        ("benchmark.seeds", "0..9999999999", "at most 1000000"),
        ("benchmark.scales", [0, float("nan")], "benchmark.scales"),
        ("benchmark.scales", [0, 1e9], "outside"),
        ("filter.thresholds.clip_text", float("nan"), "filter.thresholds.clip_text"),
        ("generator.guidance_scale", float("inf"), "generator.guidance_scale"),
        ("generator.options", {"x": float("nan")}, "generator.options.x"),
        ("generator.prompt", "a picture of a {tokn}", "unknown field {tokn}"),
        ("generator.prompt", "a picture of a {token:>>>}", "generator.prompt"),
        ("generator.shift_prompt", "{token} in {0}", "positional field"),
        ("filter.class_prompt", "a photo of a {class_name", "filter.class_prompt"),
        ("generator.slider_pattern", "../{shift}/{class_id}.safetensors", "leaves its root"),
        ("generator.slider_pattern", "/abs/{shift}.safetensors", "absolute path"),
        ("generator.slider_pattern", "{shift}/{class_id:03s}.safetensors", "bad format specification"),
        ("slider_training.positive_prompt", "{token}, {style}", "unknown field {style}"),
        ("generator.resolution", 1_000_000, "generator.resolution"),
        ("generator.image_size", 10**9, "generator.image_size"),
        ("output.trajectories_per_shard", 10**9, "output.trajectories_per_shard"),
        ("resources.generate.batch_size", 10**9, "resources.generate.batch_size"),
    ],
)
def test_bad_values_are_refused_fast(tmp_path, capsys, key, value, needle):
    rc, err, seconds = validate(tmp_path, capsys, set_key(key, value))
    assert rc == 2, err
    assert needle in err and "Traceback" not in err
    assert seconds < 10


def test_zero_shot_templates_are_checked(tmp_path, capsys):
    def mutate(raw):
        raw["classifiers"][2]["templates"] = ["a photo of a {c}", "a {cls}"]

    rc, err, _ = validate(tmp_path, capsys, mutate)
    assert rc == 2 and "classifiers[2].templates" in err and "{cls}" in err


def write_yaml(tmp_path, text: str):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    return p


def test_yaml_alias_bomb_is_refused_before_expansion(tmp_path, capsys):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 12):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 9)}]")
    path = write_yaml(tmp_path, "\n".join(lines) + "\nbenchmark: {classes: [1], seeds: [1], shifts: [x]}\n")
    start = time.perf_counter()
    assert main(["validate", str(path)]) == 2
    assert "alias" in capsys.readouterr().err
    assert time.perf_counter() - start < 10


def test_recursive_and_deep_yaml_is_refused(tmp_path, capsys):
    path = write_yaml(tmp_path, "a: &a [*a]\n")
    with pytest.raises(ConfigError, match="nested deeper"):
        load_config(path)
    path = write_yaml(tmp_path, "a: " + "[" * 5000 + "]" * 5000 + "\n")
    assert main(["validate", str(path)]) == 2
    assert "bad.yaml" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["- 1\n- 2\n", "benchmark: 2024-01-01\n", "benchmark: {classes: [1], seeds: [1], shifts: [x], scales: [0, .nan]}\n"])
def test_odd_yaml_values_exit_2(tmp_path, capsys, text):
    assert main(["validate", str(write_yaml(tmp_path, text))]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "Traceback" not in err


def test_config_path_of_the_wrong_kind(tmp_path, capsys):
    for argv in (["validate", str(tmp_path)], ["validate", str(tmp_path / "missing.yaml")]):
        assert main(argv) == 2
        assert str(tmp_path) in capsys.readouterr().err


@pytest.mark.parametrize("make, said", [
    (lambda p: os.mkfifo(p), "is a FIFO (named pipe), not a regular file"),
    (lambda p: os.symlink("/dev/zero", p), "(a symlink to /dev/zero) is a character device, not a regular file"),
    (lambda p: p.mkdir(), "is a directory, not a regular file"),
])
def test_a_config_path_that_is_not_a_regular_file_says_what_it_is(tmp_path, capsys, make, said):
    """E3: never "config file not found" for a FIFO or a link to /dev/zero (nor read them)."""
    path = tmp_path / "c.yaml"
    make(path)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"config file {path}" in err and said in err and "not found" not in err, err
    assert main(["validate", str(tmp_path / "missing.yaml")]) == 2
    assert f"config file not found: {tmp_path / 'missing.yaml'}" in capsys.readouterr().err


def test_good_config_still_loads(tmp_path):
    cfg = load_config(tiny_cfg_path(tmp_path, set_key("benchmark.seeds", "1..3")))
    assert cfg.benchmark.seeds == [1, 2, 3]
