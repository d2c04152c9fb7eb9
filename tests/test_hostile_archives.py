"""Model archives are checked as torch reads them, and torch loads only what was checked.

Python's ``zipfile`` keeps the last copy of a repeated member name, torch's reader finds
one of them (and ignores case); so an archive holding ``model_weights_config.json`` twice,
one copy switching a weight to a pickle whose ``__reduce__`` runs code, could pass the check
and run the code on load.  Such an archive is refused naming the file and the member, in
either order, and so is every second spelling of a name (``./``, ``//``, a trailing slash,
another case) and bytes before the first member; a zip comment is harmless (the loader
reads an archive rebuilt from the members checked).  The payload never runs.
"""

from __future__ import annotations

import io
import json
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[1]
CLASSIFIERS = REPO / "assets" / "world" / "classifiers"
LINEAR = CLASSIFIERS / "linear.pt2"
SCRIPTED = CLASSIFIERS / "linear.torchscript.pt"
pytestmark = pytest.mark.skipif(not (LINEAR.is_file() and SCRIPTED.is_file()), reason="assets/world not trained")
WEIGHTS_CONFIG = "data/weights/model_weights_config.json"


class _Payload:
    """Pickles to a call of ``eval`` that leaves a file behind (proof that it ran) and
    returns a tensor of the bias's shape, so a load that runs it would otherwise succeed."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (eval, (f"open({self.marker!r}, 'w').write('ran') and __import__('torch').zeros(10)",))


Edit = Callable[[str, bytes], "list[tuple[str, bytes]]"]


def rewrite(src: Path, dst: Path, edit: Edit, comment: bytes = b"", prefix: bytes = b"") -> Path:
    """``src`` rewritten member by member: ``edit(rel, data)`` gives the (rel name, data)
    pairs written in its place (names below the archive's top folder)."""
    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(src) as zin, zipfile.ZipFile(buf, "w") as zout:
        warnings.simplefilter("ignore", UserWarning)  # zipfile's "Duplicate name": the point here
        top = zin.namelist()[0].split("/", 1)[0]
        for info in zin.infolist():
            for rel, data in edit(info.filename.split("/", 1)[1], zin.read(info)):
                zout.writestr(zipfile.ZipInfo(f"{top}/{rel}" if rel else f"{top}/"), data)
        zout.comment = comment
    dst.write_bytes(prefix + buf.getvalue())
    return dst


def pickled_bias(marker: Path, evil_first: bool, evil_name: str = WEIGHTS_CONFIG) -> Edit:
    """The attack: the weights config twice (one copy marks ``fc.bias`` pickled), and
    ``fc.bias``'s payload replaced by a code-running pickle."""

    def edit(rel: str, data: bytes) -> list[tuple[str, bytes]]:
        if rel == WEIGHTS_CONFIG:
            cfg = json.loads(data)
            name = cfg["config"]["fc.bias"]["path_name"]
            cfg["config"]["fc.bias"]["use_pickle"] = True
            evil = (evil_name, json.dumps(cfg).encode())
            edit.bias = name  # type: ignore[attr-defined]
            return [evil, (rel, data)] if evil_first else [(rel, data), evil]
        return [(rel, data)]

    return edit


def with_payload(edit: Edit, marker: Path) -> Edit:
    payload = pickle.dumps(_Payload(marker))

    def run(rel: str, data: bytes) -> list[tuple[str, bytes]]:
        return [(r, payload if r == "data/weights/weight_1" else d) for r, d in edit(rel, data)]

    return run


@pytest.mark.parametrize("evil_first", [True, False], ids=["evil-copy-first", "evil-copy-last"])
def test_a_repeated_weights_config_is_refused_naming_the_file_and_the_member(tmp_path, evil_first):
    from pipeline.models import pt2_check

    marker = tmp_path / "RAN"
    evil = rewrite(LINEAR, tmp_path / "evil.pt2", with_payload(pickled_bias(marker, evil_first), marker))
    with pytest.raises(pt2_check.UnsafeArchive) as err:
        pt2_check.load_checked(evil.read_bytes(), str(evil))
    assert str(evil) in str(err.value)
    assert f"holds member 'linear/{WEIGHTS_CONFIG}' twice" in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize("spelling, said", [
    (f"./{WEIGHTS_CONFIG}", "has an empty, '.' or '..' part"),
    (WEIGHTS_CONFIG.replace("weights/", "weights//"), "has an empty, '.' or '..' part"),
    (WEIGHTS_CONFIG.replace("model_weights", "Model_Weights"), "one name to torch's reader (it ignores case)"),
    (WEIGHTS_CONFIG.replace("data/", "data\\"), "holds a backslash"),
])
def test_a_second_spelling_of_a_member_name_is_refused(tmp_path, spelling, said):
    from pipeline.models import pt2_check

    marker = tmp_path / "RAN"
    evil = rewrite(LINEAR, tmp_path / "evil.pt2", with_payload(pickled_bias(marker, True, spelling), marker))
    with pytest.raises(pt2_check.UnsafeArchive) as err:
        pt2_check.load_checked(evil.read_bytes(), str(evil))
    assert str(evil) in str(err.value) and said in str(err.value)
    assert not marker.exists()


def test_a_folder_entry_is_refused(tmp_path):
    from pipeline.models import pt2_check

    def edit(rel: str, data: bytes) -> list[tuple[str, bytes]]:
        return [(rel, data), (f"{WEIGHTS_CONFIG}/", b"")] if rel == WEIGHTS_CONFIG else [(rel, data)]

    evil = rewrite(LINEAR, tmp_path / "evil.pt2", edit)
    with pytest.raises(pt2_check.UnsafeArchive, match="is a folder entry"):
        pt2_check.check_archive(evil.read_bytes(), str(evil))


def test_prepended_bytes_are_refused_and_a_zip_comment_loads_the_members_checked(tmp_path):
    import torch

    from pipeline.io import zip_archive
    from pipeline.models import pt2_check

    keep: Edit = lambda rel, data: [(rel, data)]  # noqa: E731
    prefixed = rewrite(LINEAR, tmp_path / "prefixed.pt2", keep, prefix=b"#!/bin/sh\necho hi\n")
    with pytest.raises(pt2_check.UnsafeArchive, match="bytes before the first member") as err:
        pt2_check.check_archive(prefixed.read_bytes(), str(prefixed))
    assert str(prefixed) in str(err.value)
    commented = rewrite(LINEAR, tmp_path / "commented.pt2", keep, comment=b"a comment")
    x = torch.linspace(-1, 1, 2 * 3 * 32 * 32).reshape(2, 3, 32, 32)
    shipped = pt2_check.load_checked(LINEAR.read_bytes(), str(LINEAR)).module()(x)
    loaded = pt2_check.load_checked(commented.read_bytes(), str(commented)).module()(x)
    assert torch.equal(shipped, loaded)
    # what torch's own reader lists in the rebuilt archive is exactly what was checked
    members = pt2_check.check_archive(commented.read_bytes(), str(commented))
    records = torch._C.PyTorchFileReader(io.BytesIO(zip_archive.rebuild(members))).get_all_records()
    assert sorted(records) == sorted(members.files)


def test_card_with_a_repeated_member_exits_2_naming_it_and_nothing_runs(tmp_path, capsys):
    from pipeline.cli import main

    marker = tmp_path / "RAN"
    evil = rewrite(LINEAR, tmp_path / "evil.pt2", with_payload(pickled_bias(marker, True), marker))
    code = main(["card", "evil", "--model-kind", "exported", "--checkpoint", str(evil),
                 "--suite", str(REPO / "configs" / "suite_world.yaml"), "--output", str(tmp_path / "card"),
                 "--outputs", str(tmp_path / "outs"), "--runner", "local"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(evil) in err and "twice" in err and WEIGHTS_CONFIG in err and "Traceback" not in err
    assert not marker.exists()
    assert not (tmp_path / "card" / "card.json").exists()


def _torchscript_spec(path: Path):
    from pipeline.config import ClassifierSpec

    return ClassifierSpec(name="m", kind="torchscript", model="linear", checkpoint=str(path))


@pytest.mark.parametrize("other_first", [True, False])
def test_a_torchscript_archive_with_two_transforms_is_refused_by_the_classifier_and_the_card(tmp_path, other_first):
    """The card states the transform it read; the model must be fed that one, so a second
    ``preprocess.json`` (another input size) is refused rather than read two ways."""
    from pipeline.models.classifiers import TorchScriptClassifier
    from pipeline.models.stored_preprocess import archive_preprocess

    other = json.dumps({"input_size": [3, 64, 64], "mean": [0, 0, 0], "std": [1, 1, 1]}).encode()

    def edit(rel: str, data: bytes) -> list[tuple[str, bytes]]:
        if rel != "extra/preprocess.json":
            return [(rel, data)]
        return [(rel, other), (rel, data)] if other_first else [(rel, data), (rel, other)]

    evil = rewrite(SCRIPTED, tmp_path / "two.pt", edit)
    for attempt in (lambda: TorchScriptClassifier(_torchscript_spec(evil), "cpu"), lambda: archive_preprocess(str(evil))):
        with pytest.raises(ValueError) as err:
            attempt()
        assert str(evil) in str(err.value) and "extra/preprocess.json' twice" in str(err.value)


def test_a_torchscript_archive_with_a_comment_loads_with_its_own_transform(tmp_path):
    from pipeline.labels import label_space
    from pipeline.models.classifiers import TorchScriptClassifier

    commented = rewrite(SCRIPTED, tmp_path / "c.pt", lambda rel, data: [(rel, data)], comment=b"hello")
    clf = TorchScriptClassifier(_torchscript_spec(commented), "cpu", label_space([str(i) for i in range(10)]))
    assert clf.preprocess_cfg["input_size"] == [3, 32, 32]


def test_a_slider_file_is_read_as_torch_reads_it(tmp_path):
    """A ``torch.save`` slider (a zip too) loads from the members checked; a repeated member is refused."""
    import torch

    from pipeline.models.lora import load_slider_file

    good = tmp_path / "s.pt"
    torch.save({"w": torch.arange(3.0)}, good)
    assert torch.equal(load_slider_file(str(good))["w"], torch.arange(3.0))
    twice = rewrite(good, tmp_path / "twice.pt", lambda rel, data: [(rel, data)] * (2 if rel == "data.pkl" else 1))
    with pytest.raises(ValueError, match=r"twice.pt: holds member 's/data.pkl' twice"):
        load_slider_file(str(twice))
