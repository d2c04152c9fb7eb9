"""Config loading: typed values, readable errors naming key paths, hashing."""

from __future__ import annotations

import textwrap

import pytest

from pipeline.config import REFERENCE_SCALES, ConfigError, config_hash, load_config, parse_config

MINIMAL = {
    "benchmark": {"classes": [22, "goldfish"], "seeds": "1..3", "shifts": ["painting_style"]},
    "classifiers": [{"name": "r50", "model": "resnet50.a1_in1k"}],
}


def test_defaults_match_reference():
    cfg = parse_config(MINIMAL)
    g, f = cfg.generator, cfg.filter
    assert cfg.benchmark.classes == [22, 1]
    assert cfg.benchmark.seeds == [1, 2, 3]
    assert cfg.benchmark.scales == REFERENCE_SCALES
    assert (g.steps, g.guidance_scale, g.lora_timestep_threshold, g.image_size) == (50, 7.5, 750, 256)
    assert g.prompt == "a picture of a {token}"
    assert g.negative_prompt == "blurry,text,caption,lowquality,lowresolution,low res,grainy,ugly"
    assert f.min_pass == 2
    assert f.thresholds.clip_text == pytest.approx(28.7394449)
    assert f.thresholds.dino_image == pytest.approx(0.781161878)


def _err(raw) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(raw, source="x.yaml")
    return str(info.value)


def test_unknown_key_names_path_and_allowed_keys():
    msg = _err({**MINIMAL, "generator": {"stepz": 10}})
    assert "generator.stepz" in msg and "unknown key" in msg
    assert "steps" in msg and "guidance_scale" in msg


def test_bad_values_name_key_and_value():
    msg = _err({**MINIMAL, "generator": {"steps": 0, "dtype": "float8"}})
    assert "generator.steps" in msg and "(got 0)" in msg
    assert "generator.dtype" in msg and "'bfloat16'" in msg  # the allowed values are listed
    msg = _err({**MINIMAL, "resources": {"classify": {"num_gpus": -1}}})
    assert "resources.classify.num_gpus" in msg


def test_benchmark_validation():
    assert "include 0" in _err({**MINIMAL, "benchmark": {**MINIMAL["benchmark"], "scales": [0.5, 1.0]}})
    assert "ascending" in _err({**MINIMAL, "benchmark": {**MINIMAL["benchmark"], "scales": [0, 2, 1]}})
    msg = _err({**MINIMAL, "benchmark": {**MINIMAL["benchmark"], "classes": ["bald eagel"]}})
    assert "classes[0]" in msg and "'bald eagle'" in msg
    assert "0..999" in _err({**MINIMAL, "benchmark": {**MINIMAL["benchmark"], "classes": [1000]}})
    assert "Painting" in _err({**MINIMAL, "benchmark": {**MINIMAL["benchmark"], "shifts": ["Painting"]}})


def test_classifier_names_unique():
    raw = {**MINIMAL, "classifiers": [{"name": "a", "model": "resnet18"}, {"name": "a", "model": "resnet50"}]}
    assert "unique" in _err(raw)


def test_yaml_relative_paths_and_hash(tmp_path):
    (tmp_path / "cfg").mkdir()
    p = tmp_path / "cfg" / "b.yaml"
    p.write_text(
        textwrap.dedent(
            """
            benchmark: {classes: [1], seeds: [1], shifts: [heavy_snow]}
            generator: {model: ../models/sd2, slider_store: ./sliders}
            classifiers: [{name: r18, model: resnet18, checkpoint: ../w/r18.pt}]
            resources: {generate: {pool_size: 2}}
            """
        )
    )
    cfg = load_config(p)
    assert cfg.generator.model == str((tmp_path / "models" / "sd2").resolve())
    assert cfg.generator.slider_store == str((tmp_path / "cfg" / "sliders").resolve())
    assert cfg.classifiers[0].checkpoint == str((tmp_path / "w" / "r18.pt").resolve())
    other = parse_config({**cfg.model_dump(mode="json"), "resources": {"generate": {"pool_size": 8}}})
    assert config_hash(other) == config_hash(cfg)  # resources never change outputs
    changed = parse_config({**cfg.model_dump(mode="json"), "generator": {**cfg.generator.model_dump(), "steps": 20}})
    assert config_hash(changed) != config_hash(cfg)


def test_load_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("benchmark: [unclosed")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)


def test_custom_label_space(tmp_path):
    names = tmp_path / "digits.json"
    names.write_text('["zero", "one", "two"]')
    raw = {**MINIMAL, "benchmark": {**MINIMAL["benchmark"], "labels": str(names), "classes": ["two", 0]}}
    cfg = parse_config(raw)
    assert cfg.benchmark.classes == [2, 0] and cfg.benchmark.class_name(2) == "two"
    raw["benchmark"]["classes"] = [3]
    assert "0..2" in _err(raw)
