"""Model files never run code, and an output's predictions are tied to the weights that made them.

A ``.pt2`` archive may hold tensors only: a weight switched to a pickle whose ``__reduce__``
calls ``eval``, an opaque constant, AOTInductor code or pickled sample inputs are refused
before anything is loaded, and the payload never runs.  A classifier whose weights change
under the same name is refused naming it, never given the old predictions.  Special files
(FIFOs, ``/dev/zero``) are refused without being read.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import threading
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINEAR = REPO / "assets" / "world" / "classifiers" / "linear.pt2"
needs_linear = pytest.mark.skipif(not LINEAR.is_file(), reason="assets/world not trained")


class _Payload:
    """Pickles to a call of ``eval`` that leaves a file behind: proof that it ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (eval, (f"open({self.marker!r}, 'w').write('ran')",))


def craft(dst: Path, marker: Path, how: str) -> Path:
    """The shipped linear.pt2 with one thing changed (``how``) to carry a code-running payload."""
    payload = pickle.dumps(_Payload(marker))
    with zipfile.ZipFile(LINEAR) as zin, zipfile.ZipFile(dst, "w") as zout:
        top = zin.namelist()[0].split("/", 1)[0]
        for info in zin.infolist():
            data = zin.read(info)
            rel = info.filename.split("/", 1)[1]
            if how == "pickled_weight":
                if rel == "data/weights/model_weights_config.json":
                    cfg = json.loads(data)
                    cfg["config"]["fc.bias"]["use_pickle"] = True
                    data = json.dumps(cfg).encode()
                elif rel == "data/weights/weight_1":
                    data = payload
            elif how == "opaque_constant" and rel == "data/constants/model_constants_config.json":
                data = json.dumps({"config": {"c": {"path_name": "opaque_0", "is_param": False, "use_pickle": True}}}).encode()
            elif how == "sample_inputs" and rel.startswith("data/sample_inputs/"):
                data = payload
            if how == "no_program" and rel.startswith("models/"):
                continue
            zout.writestr(info, data)
        if how == "opaque_constant":
            zout.writestr(f"{top}/data/constants/opaque_0", payload)
        if how == "aoti":
            zout.writestr(f"{top}/data/aotinductor/model/model.so", b"\x7fELF")
    return dst


@needs_linear
@pytest.mark.parametrize("how, said", [
    ("pickled_weight", "'fc.bias' is stored pickled"),
    ("opaque_constant", "'c' is stored pickled"),
    ("aoti", "compiled code (AOTInductor)"),
    ("sample_inputs", "does not load as tensors only"),
    ("no_program", "holds no exported program"),
])
def test_a_crafted_archive_is_refused_before_anything_loads(tmp_path, how, said):
    from pipeline.models import pt2_check

    marker = tmp_path / "RAN"
    evil = craft(tmp_path / "evil.pt2", marker, how)
    with pytest.raises(pt2_check.UnsafeArchive) as err:
        pt2_check.load_checked(evil.read_bytes(), str(evil))
    assert str(evil) in str(err.value) and said in str(err.value)
    assert not marker.exists()


@needs_linear
def test_the_shipped_archive_loads_and_a_crafted_one_would_run_code_in_torch(tmp_path):
    """The check passes the shipped file, and the crafted file is what the check is for:
    torch.export.load alone runs its payload."""
    import torch

    from pipeline.models import pt2_check

    from pipeline.models.stored_preprocess import archive_preprocess

    size = json.loads(archive_preprocess(str(LINEAR)))["input_size"]
    program = pt2_check.load_checked(LINEAR.read_bytes(), str(LINEAR))
    assert program.module()(torch.zeros(2, *size)).shape[0] == 2
    marker = tmp_path / "RAN"
    evil = craft(tmp_path / "evil.pt2", marker, "pickled_weight")
    try:
        torch.export.load(str(evil))
    except Exception:
        pass
    assert marker.read_text() == "ran"


@needs_linear
def test_card_with_a_crafted_archive_exits_2_naming_it_and_nothing_runs(tmp_path, capsys):
    from pipeline.cli import main

    marker = tmp_path / "RAN"
    evil = craft(tmp_path / "evil.pt2", marker, "pickled_weight")
    code = main(["card", "evil", "--model-kind", "exported", "--checkpoint", str(evil),
                 "--suite", str(REPO / "configs" / "suite_world.yaml"), "--output", str(tmp_path / "card"),
                 "--outputs", str(tmp_path / "outs"), "--runner", "local"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(evil) in err and "stored pickled" in err and "Traceback" not in err
    assert not marker.exists()
    assert not (tmp_path / "card" / "card.json").exists()


def test_a_zip_without_a_program_is_refused_by_the_classifier_without_traceback(tmp_path):
    from pipeline.config import ClassifierSpec
    from pipeline.models.exported import ExportedClassifier

    bad = tmp_path / "empty.pt2"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("m/extra/preprocess.json", json.dumps({"input_size": [3, 8, 8], "mean": [0, 0, 0], "std": [1, 1, 1],
                                                          "interpolation": "bilinear"}))
    spec = ClassifierSpec(name="m", kind="exported", model="m", checkpoint=str(bad))
    with pytest.raises(ValueError) as err:
        ExportedClassifier(spec, "cpu")
    assert "classifiers[m].checkpoint" in str(err.value) and "holds no exported program" in str(err.value)


# --------------------------------------------------------------------------- weights digests
def _spec(path: Path, name: str = "m"):
    from pipeline.config import ClassifierSpec

    return ClassifierSpec(name=name, kind="exported", model=name, checkpoint=str(path))


def test_a_model_whose_weights_changed_under_its_name_is_refused_naming_it(tmp_path):
    from pipeline.assets.weights import WeightsChanged, weights_digest
    from pipeline.card.outputs import check_model_weights

    ckpt = tmp_path / "m.pt2"
    ckpt.write_bytes(b"weights A")
    marker = {"config_hash": "x", "config": {}, "weights": {"m": weights_digest(_spec(ckpt))}}
    check_model_weights("OUT", marker, _spec(ckpt))  # the same weights: fine
    check_model_weights("OUT", {"config_hash": "x", "config": {}}, _spec(ckpt))  # nothing recorded: fine
    ckpt.write_bytes(b"weights B")
    with pytest.raises(WeightsChanged) as err:
        check_model_weights("OUT", marker, _spec(ckpt))
    assert "OUT" in str(err.value) and "'m'" in str(err.value) and "--name" in str(err.value)


@pytest.mark.slow
def test_a_build_records_weights_and_refuses_a_classifier_whose_file_changed(tiny_reference, tmp_path, capsys):
    """The tiny reference output records each classifier's digest.  Its predictions of
    tiny-resnet recorded as made by other bytes (as when the file at the same path was
    replaced after the build), a build that would make new trajectories (one more seed)
    is refused naming tiny-resnet, and nothing is written."""
    from buildproc import tiny_config

    from pipeline.assets.weights import file_sha256
    from pipeline.cli import main

    out = tmp_path / "out"
    shutil.copytree(tiny_reference, out)
    marker = json.loads((out / "config.json").read_text())
    resnet = next(c for c in marker["config"]["classifiers"] if c["name"] == "tiny-resnet")
    assert marker["weights"]["tiny-resnet"] == file_sha256(resnet["checkpoint"])
    assert set(marker["weights"]) == {"tiny-resnet", "tiny-vit", "tiny-clip-zs"}
    marker["weights"]["tiny-resnet"] = "0" * 64
    (out / "config.json").write_text(json.dumps(marker))
    cfg = tiny_config(tmp_path, lambda raw: raw["benchmark"].update(seeds=[1, 2, 3]))
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    assert main(["build", str(cfg), "--output", str(out), "--runner", "local"]) == 2
    err = capsys.readouterr().err
    assert "'tiny-resnet'" in err and "weights" in err and "000000000000" in err and "Traceback" not in err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_only_the_classifiers_that_run_are_checked_and_recorded(tmp_path):
    """A card adding one model to an output whose other classifier's file changed is not
    refused for it (that classifier does not run), and its record stays the old digest."""
    from pipeline.assets.weights import changed_weights, merged

    marker = {"weights": {"old": "a" * 64, "kept": "b" * 64}}
    running = {"new": "c" * 64}  # digests() of the classifiers that run
    assert changed_weights(marker, running) == []
    assert merged(marker, running) == {"old": "a" * 64, "kept": "b" * 64, "new": "c" * 64}
    assert changed_weights(marker, {"old": "d" * 64}) == [("old", "a" * 64, "d" * 64)]


# --------------------------------------------------------------------------- special files
def test_hashing_refuses_fifos_devices_and_links_to_them_without_reading(tmp_path):
    from pipeline.io.regular import NotRegularFile, dir_sha256, file_sha256, read_bounded

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    results: list[str] = []

    def attempt():
        for path in (fifo, zero):
            for fn in (file_sha256, lambda p: read_bounded(p, 1024)):
                try:
                    fn(path)
                    results.append("read")
                except NotRegularFile as err:
                    results.append(str(err))
        d = tmp_path / "dir"
        d.mkdir()
        os.mkfifo(d / "inner")
        try:
            dir_sha256(d)
        except NotRegularFile as err:
            results.append(str(err))

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "a special file was opened for reading"
    assert len(results) == 5 and "read" not in results
    assert "FIFO" in results[0] and str(fifo) in results[0]
    assert "character device" in results[2] and "/dev/zero" in results[2]
    assert "inner" in results[4]


def test_a_checkpoint_directory_holding_a_fifo_is_a_problem_not_a_hang(tmp_path):
    from pipeline.assets import weight_file_problems
    from pipeline.config import parse_config
    from pipeline.cli import TINY_CONFIG
    from pipeline.io.bounds import load_yaml

    d = tmp_path / "ckpt"
    d.mkdir()
    os.mkfifo(d / "weights.bin")
    raw = load_yaml(TINY_CONFIG)
    raw["classifiers"] = [{"name": "x", "kind": "timm", "model": "resnet10t.c3_in1k", "checkpoint": str(d)},
                          {"name": "v", "kind": "exported", "model": "v", "checkpoint": str(d / "weights.bin")}]
    problems = weight_file_problems(parse_config(raw, source="t"))
    assert len(problems) == 2
    assert problems[0].startswith("classifiers[0] (x):") and "is a directory" in problems[0]
    assert problems[1].startswith("classifiers[1] (v):") and "FIFO" in problems[1]
