"""A model held in memory is also identified by its answers on a probe batch of the output's images.

The object digest sees what the object holds; these models keep what changes their answers
outside it (a module-level global their forward reads, an object without ``__dict__`` whose
state lives elsewhere), so their digest stays the same.  Under a name already used they are
refused by the probe (naming both models, the probe images and by how much), in place, into
another output, by the card and by refine; the same answers pass; an output recorded before
probes existed keeps working without one.  On copies of the session's demo build (``demo_world``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from test_hostile_round6_models import PRE, QUIET, _files, _net, _predictions, evaluate

pytestmark = pytest.mark.usefixtures("one_torch_thread")
GAIN = 1.0  # read by Global.forward: outside the object, so outside its digest
_STATE: dict[int, float] = {}  # Opaque's state, keyed by the object: outside it


class Global(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * GAIN


class Opaque:
    """No ``__dict__``, no slots: hashed by its class only, as an extension object is."""

    __slots__ = ("__weakref__",)

    def __init__(self, k: float) -> None:
        _STATE[id(self)] = k

    def __deepcopy__(self, memo: dict) -> "Opaque":
        return self  # a handle: copies share what it points to

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x * _STATE[id(self)]


class Scaled(torch.nn.Module):
    def __init__(self, k: float) -> None:
        super().__init__()
        self.net, self.scale = _net(), Opaque(k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale(self.net(x))


@pytest.fixture()
def output(demo_world, tmp_path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(demo_world, out)
    return out


@pytest.fixture()
def gain(monkeypatch):
    """Set the global the model reads (put back after the test)."""
    return lambda value: monkeypatch.setattr(f"{__name__}.GAIN", value)


def _marker(out: Path) -> dict:
    return json.loads((out / "config.json").read_text())


def _record(out: Path, name: str) -> dict:
    return json.loads((out / _marker(out)["probes"][name]["file"]).read_text())


def test_the_digest_cannot_see_these_models_state():
    from pipeline.models.module import state_digest

    assert state_digest(Scaled(1.0)) == state_digest(Scaled(-1.0))
    assert state_digest(Global()) == state_digest(Global())  # whatever GAIN is when it runs


def test_a_model_reading_a_changed_global_is_refused_in_place_naming_both(output, gain):
    from pipeline.stages.probe import PROBE_IMAGES, AnswersChanged

    evaluate(Global(), str(output), name="g", preprocess=PRE, **QUIET)
    rec = _record(output, "g")
    assert len(rec["samples"]) == PROBE_IMAGES and rec["model"].endswith(".Global")
    assert len({s["sample_id"].split("/")[0] for s in rec["samples"]}) > 1  # spread over the shifts
    before, preds = _files(output), _predictions(output)
    gain(2.0)  # the same top-1 on every image: only the logits tell
    with pytest.raises(AnswersChanged, match=r"classifier 'g' answers differently from the model that made its "
                                             r"predictions: recorded .*\.Global \(object digest \w{12}…\), given "
                                             r".*\.Global .*the same object digest.*differ on 8 of 8 probe images "
                                             r".*max \|Δlogit\| .*give the classifier another name") as err:
        evaluate(Global(), str(output), name="g", preprocess=PRE, **QUIET)
    assert rec["samples"][0]["sample_id"] in str(err.value)
    assert _files(output) == before and _predictions(output).equals(preds)  # never the old numbers
    gain(1.0 + 1e-4)  # within the tolerance: the same model
    assert evaluate(Global(), str(output), name="g", preprocess=PRE, **QUIET) is not None


def test_an_opaque_object_answering_otherwise_is_refused_into_another_output(demo_world, tmp_path):
    from pipeline.stages.probe import AnswersChanged

    out = tmp_path / "ev"
    import cnsbench

    cnsbench.evaluate(Scaled(1.0), demo_world, output=out, name="s", preprocess=PRE, **QUIET)
    assert len(_record(out, "s")["samples"]) == 8  # a new output: probed on all its shards' images
    before = _files(out)
    with pytest.raises(AnswersChanged, match=r"classifier 's' answers differently"):
        cnsbench.evaluate(Scaled(-1.0), demo_world, output=out, name="s", preprocess=PRE, **QUIET)
    assert _files(out) == before
    assert cnsbench.evaluate(Scaled(1.0), demo_world, output=out, name="s", preprocess=PRE, **QUIET) is not None


class Stopping(Global):
    """Global, interrupted (as by Ctrl-C) on the ``STOP_AT``-th forward of any of its copies."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        CALLS.append(1)
        if len(CALLS) == STOP_AT:
            raise KeyboardInterrupt
        return super().forward(x)


CALLS: list[int] = []
STOP_AT = 20  # past the first committed shard (18 images in batches of 4), before the last


def test_a_new_output_interrupted_after_its_first_shard_has_its_record(demo_world, tmp_path, gain):
    import cnsbench
    from pipeline.stages.probe import AnswersChanged

    out = tmp_path / "ev"
    CALLS.clear()
    with pytest.raises(KeyboardInterrupt):
        cnsbench.evaluate(Stopping(), demo_world, output=out, name="g", preprocess=PRE, batch_size=4, **QUIET)
    assert list((out / "manifest").glob("*.json")) and _record(out, "g")["samples"]  # predictions, and their record
    gain(2.0)
    with pytest.raises(AnswersChanged, match=r"classifier 'g' answers differently"):  # the resume is checked
        cnsbench.evaluate(Stopping(), demo_world, output=out, name="g", preprocess=PRE, batch_size=4, **QUIET)


def test_the_card_rescores_a_model_answering_otherwise(output, gain, tmp_path):
    """A card only reads the output it is given: a model answering otherwise than the one whose
    predictions it holds under the name is scored again into the card's own output, never given
    the old numbers."""
    import cnsbench

    evaluate(Global(), str(output), name="g", preprocess=PRE, **QUIET)
    same = cnsbench.card(Global(), str(output), name="g", output=str(tmp_path / "same"), preprocess=PRE, **QUIET)
    assert same["benchmarks"][0]["output"] == str(output)  # the same answers: read as they are
    before = _files(output)
    gain(-1.0)
    card = cnsbench.card(Global(), str(output), name="g", output=str(tmp_path / "card"), preprocess=PRE, **QUIET)
    own = tmp_path / "card" / "outputs" / "cns"
    assert _files(output) == before and card["benchmarks"][0]["output"] == str(own)
    old, new = (cnsbench.open_output(o).predictions() for o in (output, own))
    old, new = (p[p["classifier"] == "g"].set_index("sample_id")["top1"].sort_index() for p in (old, new))
    assert len(new) == len(old) and (new != old).any()  # its own answers, not the old numbers


def test_refine_refuses_a_model_answering_otherwise(output, gain):
    import cnsbench
    from pipeline.errors import CnsbenchError

    evaluate(Global(), str(output), name="g", preprocess=PRE, **QUIET)
    before = _files(output)
    gain(3.0)
    with pytest.raises(CnsbenchError, match=r"classifier 'g' answers differently"):
        cnsbench.refine("g", str(output), rounds=1, models={"g": Global()}, **QUIET)
    assert _files(output) == before and not (output / "refine").exists()


def test_an_output_without_a_probe_record_keeps_working(output, gain):
    """An output made before probes: the probe check is skipped (the digest check still runs),
    and nothing is recorded for predictions already made."""
    evaluate(Global(), str(output), name="g", preprocess=PRE, **QUIET)
    marker = _marker(output)
    del marker["probes"]
    (output / "config.json").write_text(json.dumps(marker, indent=1))
    gain(2.0)
    assert evaluate(Global(), str(output), name="g", preprocess=PRE, **QUIET) is not None
    assert "probes" not in _marker(output)
    # A name new to the output gets its record.
    evaluate(Global(), str(output), name="h", preprocess=PRE, **QUIET)
    assert list(_marker(output)["probes"]) == ["h"]


def test_a_damaged_probe_record_is_named(output):
    from pipeline.stages.probe import AnswersChanged

    evaluate(Global(), str(output), name="g", preprocess=PRE, **QUIET)
    rel = _marker(output)["probes"]["g"]["file"]
    (output / rel).write_text((output / rel).read_text().replace("0", "1", 1))
    with pytest.raises(AnswersChanged, match=rf"{rel}: the probe record of classifier 'g' does not match"):
        evaluate(Global(), str(output), name="g", preprocess=PRE, **QUIET)


def test_the_tolerance_passes_numerics_and_refuses_another_model():
    from pipeline.stages.probe import differences

    rng = np.random.default_rng(0)
    ref = rng.normal(size=(8, 1000)) * 5
    ref[0] = 1e-7  # an image whose logits are all near zero
    assert differences(ref, (ref * (1 + 1e-3 * rng.standard_normal(ref.shape))).astype(np.float32)) == []
    assert differences(ref, ref.astype(np.float16).astype(np.float32)) == []  # half-precision rounding
    worse = ref.copy()
    worse[3] *= 1.05
    assert [i for i, _, _ in differences(ref, worse)] == [3]
    assert [i for i, _, _ in differences(ref, np.flip(ref, 1).copy())] == list(range(1, 8))
    assert [i for i, _, _ in differences(ref, np.where(np.isnan(ref), 0, ref) * np.nan)] == list(range(8))


def test_the_probe_is_recorded_and_checked_on_object_storage(demo_world, gain):
    """Written and read through the store: an output on S3 (a test server on 127.0.0.1)."""
    pytest.importorskip("s3fs")
    import fsspec
    from s3server import s3_environment

    import cnsbench
    from pipeline.stages.probe import AnswersChanged

    with s3_environment("probe-test"):
        out = "s3://probe-test/ev"
        cnsbench.evaluate(Global(), demo_world, output=out, name="g", preprocess=PRE, **QUIET)
        fs = fsspec.filesystem("s3")
        marker = json.loads(fs.cat(f"{out}/config.json"))
        assert len(json.loads(fs.cat(f"{out}/{marker['probes']['g']['file']}"))["samples"]) == 8
        gain(2.0)
        with pytest.raises(AnswersChanged, match=r"s3://probe-test/ev: classifier 'g' answers differently"):
            cnsbench.evaluate(Global(), demo_world, output=out, name="g", preprocess=PRE, **QUIET)
