"""Bad input fails early with a message that names what is wrong and where."""

from __future__ import annotations

import shutil

import pytest
from buildproc import tiny_config

from pipeline.cli import main


def write(tmp_path, mutate) -> str:
    return str(tiny_config(tmp_path, mutate, name="c.yaml"))


def test_unknown_key(tmp_path, capsys):
    path = write(tmp_path, lambda r: r["generator"].update(stepps=3))
    assert main(["validate", path]) == 2
    err = capsys.readouterr().err
    assert "generator.stepps" in err and "allowed keys" in err


def test_unknown_classifier_lists_close_names(tmp_path, capsys):
    def mutate(r):
        r["classifiers"] = [{"name": "x", "model": "convnext_tiyn.fb_in1k"}]

    assert main(["validate", write(tmp_path, mutate)]) == 2
    out = capsys.readouterr().out
    assert "classifiers[0] (x).model" in out and "convnext_tiny" in out


@pytest.mark.integration  # the build claims its output before its checks refuse it
def test_missing_model_and_sliders_listed_before_generation(tmp_path, capsys):
    from pipeline.demo.assets import ensure_tiny_assets

    root = ensure_tiny_assets()
    store = tmp_path / "sliders"
    shutil.copytree(root / "sliders", store)
    (store / "heavy_snow" / "001.safetensors").unlink()
    (store / "painting_style" / "022.safetensors").unlink()

    def mutate(r):
        r["generator"]["slider_store"] = str(store)
        r["generator"]["model"] = str(tmp_path / "no-such-model")

    path = write(tmp_path, mutate)
    out_dir = tmp_path / "out"
    assert main(["build", path, "--output", str(out_dir), "--runner", "local"]) == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err
    assert "heavy_snow/001.safetensors" in err and "painting_style/022.safetensors" in err
    assert "3 problem(s)" in err
    assert not (out_dir / "manifest").exists()  # nothing was generated


def test_ls_lists_registries(capsys):
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    assert "slider" in out and "ooc4" in out and "open_clip_zeroshot" in out


def test_max_gpus_with_the_local_runner_is_refused(tmp_path, capsys):
    """--max-gpus sizes Ray's actor pools: with --runner local it is refused (exit 2, one line,
    nothing written)."""
    from pipeline.cli import TINY_CONFIG

    out = tmp_path / "out"
    assert main(["build", str(TINY_CONFIG), "--output", str(out), "--runner", "local", "--max-gpus", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cnsbench build: error: --max-gpus does not apply with --runner local") and "\n" not in err
    assert not out.exists()
