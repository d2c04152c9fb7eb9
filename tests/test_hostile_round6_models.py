"""Models held in memory: their identity is their behaviour, and a failed addition leaves nothing behind.

On copies of the session's demo build (``demo_world``):

* a model's identity covers its plain attributes and the modules it holds outside
  ``_modules``: a test-time-augmentation flag switched, or another list of ensemble members,
  under a name already used is refused naming both digests, never given the old numbers;
* a model that returns infinity on a later batch, and an evaluation interrupted (Ctrl-C) at a
  later batch, leave the output's files as they were, and a card of another classifier of the
  output runs; an addition a killed process left unfinished is named by ``cnsbench status``,
  whose ``--roll-back`` undoes it; a TorchScript archive refused while it is added leaves no
  entry behind; a name the card would refuse is refused before anything is written;
* a module with parameters on ``meta`` and a ``label_map`` leaving outputs unmapped are
  refused with a :class:`pipeline.errors.CnsbenchError` naming what is wrong.
"""

from __future__ import annotations

import copy
import hashlib
import shutil
from pathlib import Path

import pytest
import torch

from pipeline.errors import CnsbenchError

pytestmark = pytest.mark.usefixtures("one_torch_thread")
REPO = Path(__file__).resolve().parents[1]
PRE = {"resize": 32, "crop": 32, "interpolation": "bilinear", "mean": [0.5] * 3, "std": [0.5] * 3}
QUIET = {"echo": lambda m: None, "runner": "local"}


def evaluate(model, out, **kw):
    """The model added into ``out`` itself (``in_place``), as these cases need."""
    import cnsbench

    return cnsbench.evaluate(model, out, output=out, in_place=True, **kw)


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=2), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 15 * 15, 10))


class TTA(torch.nn.Module):
    """The issue's test-time augmentation: the flip is a plain attribute, outside the ``state_dict``."""

    def __init__(self, net: torch.nn.Module, flip: bool) -> None:
        super().__init__()
        self.net, self.flip = net, flip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(torch.flip(x, dims=[2, 3]) if self.flip else x)


class Lin(torch.nn.Module):
    """No parameters: its scale ``k`` is a plain attribute."""

    def __init__(self, k: float) -> None:
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[:, c % 3].mean((1, 2), keepdim=False)[:, None] * (c + 1) for c in range(10)], 1) * self.k


class Ens(torch.nn.Module):
    """Members in a plain list: not registered, an empty ``state_dict``."""

    def __init__(self, members: list) -> None:
        super().__init__()
        self.members = members

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(m(x) for m in self.members)


class Failing(torch.nn.Module):
    """Answers until its ``at``-th call (counted from its copy's probe), then returns infinity or
    raises KeyboardInterrupt, as a Ctrl-C during that batch does."""

    def __init__(self, at: int, interrupt: bool) -> None:
        super().__init__()
        self.net, self.at, self.interrupt, self.calls = _net(3), at, interrupt, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls >= self.at:
            if self.interrupt:
                raise KeyboardInterrupt
            return self.net(x) * float("inf")
        return self.net(x)


@pytest.fixture()
def output(demo_world, tmp_path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(demo_world, out)
    return out


def _files(out: Path) -> dict[str, str]:
    """SHA-256 of every file of the output but the run records and the lease."""
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in out.rglob("*")
            if p.is_file() and p.relative_to(out).parts[0] not in ("runs", "lease.json")}


def _predictions(out: Path):
    from pipeline.io.store import OutputStore
    from pipeline.io.tables import load_predictions

    return load_predictions(OutputStore(str(out))).sort_values(["classifier", "sample_id"]).reset_index(drop=True)


# --------------------------------------------------------------------------- identity
def test_the_digest_covers_attributes_listed_members_and_hooks_and_is_stable():
    from pipeline.models.module import state_digest

    net = _net()
    assert state_digest(TTA(net, False)) == state_digest(TTA(net, False)) == state_digest(copy.deepcopy(TTA(net, False)))
    assert state_digest(TTA(net, True)) != state_digest(TTA(net, False))
    assert state_digest(Ens([Lin(1)])) == state_digest(Ens([Lin(1)]))
    assert state_digest(Ens([Lin(2), Lin(4)])) != state_digest(Ens([Lin(1)]))
    assert state_digest(Ens([Lin(1)])) != state_digest(Ens([Lin(1.5)]))
    hooked = TTA(net, False)
    hooked.register_forward_hook(lambda m, i, o: -o)
    assert state_digest(hooked) != state_digest(TTA(net, False))
    trained = TTA(net, False).train()
    assert state_digest(trained) == state_digest(TTA(net, False).eval())  # evaluated in eval mode either way


@pytest.mark.parametrize("first, second", [
    (lambda: TTA(_net(), False), lambda: TTA(_net(), True)),
    (lambda: Ens([Lin(1)]), lambda: Ens([Lin(2), Lin(4)])),
], ids=["tta-flip", "listed-ensemble"])
def test_the_same_name_with_a_model_that_answers_differently_is_refused(output, first, second):
    from pipeline.models.module import state_digest

    a, b = first(), second()
    evaluate(a, str(output), name="same", preprocess=PRE, **QUIET)
    before = _files(output)
    with pytest.raises(CnsbenchError, match=rf"'same'.*{state_digest(a)[:12]}.*{state_digest(b)[:12]}"):
        evaluate(b, str(output), name="same", preprocess=PRE, **QUIET)
    assert _files(output) == before  # nothing written: the old numbers stay the first model's only
    # The first model again under its name: nothing to add, its own numbers.
    assert evaluate(first(), str(output), name="same", preprocess=PRE, **QUIET) is not None


# --------------------------------------------------------------------------- nothing left behind
def test_a_failed_and_an_interrupted_evaluation_leave_the_output_as_it_was(output, tmp_path):
    """The contract: infinity on a later batch, then a Ctrl-C at a later batch (batches of 4, a
    shard of 18 images: both after the first shards were committed)."""
    from pipeline.cli import main
    from pipeline.io.rollback import JOURNAL

    before, preds = _files(output), _predictions(output)
    with pytest.raises(CnsbenchError, match=r"classifiers\[k\]: the model returned NaN or infinite logits"):
        evaluate(Failing(at=12, interrupt=False), str(output), name="k", preprocess=PRE, batch_size=4, **QUIET)
    assert _files(output) == before
    with pytest.raises(KeyboardInterrupt):
        evaluate(Failing(at=16, interrupt=True), str(output), name="k", preprocess=PRE, batch_size=4, **QUIET)
    assert _files(output) == before and not (output / JOURNAL).exists()
    assert _predictions(output).equals(preds)
    assert main(["status", str(output)]) == 0
    assert main(["card", "cnn", "--suite", str(output), "--output", str(tmp_path / "card"), "--runner", "local"]) == 0
    # The name is free again: another model takes it.
    assert evaluate(_net(5), str(output), name="k", preprocess=PRE, **QUIET) is not None


def test_an_addition_a_killed_process_left_is_named_by_status_and_rolled_back(output, monkeypatch, capsys):
    from pipeline.cli import main
    from pipeline.io import rollback

    before = _files(output)
    with monkeypatch.context() as m:  # a process killed outright does not roll back itself
        m.setattr("pipeline.output_run.Running._roll_back", lambda self: None)
        with pytest.raises(KeyboardInterrupt):
            evaluate(Failing(at=16, interrupt=True), str(output), name="k", preprocess=PRE, batch_size=4, **QUIET)
    assert (output / rollback.JOURNAL).exists() and _files(output) != before
    capsys.readouterr()
    assert main(["status", str(output)]) == 3
    shown = capsys.readouterr().out
    assert f"unfinished: adding k was cut short; run `cnsbench status {output} --roll-back`" in shown
    assert main(["status", str(output), "--roll-back"]) == 0
    assert "the addition of k did not finish: rolled back" in capsys.readouterr().out
    assert _files(output) == before


def test_status_names_a_remedy_that_works_for_a_model_held_in_memory(output, monkeypatch, capsys):
    """An output an earlier version left with a module's entry and none of its predictions."""
    from pipeline.cli import main
    from pipeline.output_run import Running

    model = _net(7)
    with monkeypatch.context() as m:
        m.setattr(Running, "add_classifiers", lambda self: None)
        evaluate(model, str(output), name="held", preprocess=PRE, **QUIET)
    capsys.readouterr()
    assert main(["status", str(output)]) == 3
    shown = capsys.readouterr().out
    assert "held is a model held in memory: evaluate it again from Python under the same name" in shown
    assert "cnsbench build" not in shown
    evaluate(model, str(output), name="held", preprocess=PRE, **QUIET)  # the remedy
    assert main(["status", str(output)]) == 0


def test_a_torchscript_archive_refused_while_added_leaves_no_entry(output, tmp_path, capsys):
    from test_hostile_archives import SCRIPTED, rewrite

    from pipeline.cli import main

    if not SCRIPTED.is_file():
        pytest.skip("assets/world not trained")
    dup = rewrite(SCRIPTED, tmp_path / "dup.pt", lambda rel, data: [(rel, data)] * (2 if rel == "data.pkl" else 1))
    before = _files(output)
    assert main(["card", "dup", "--model-kind", "torchscript", "--checkpoint", str(dup), "--suite", str(output),
                 "--output", str(tmp_path / "card"), "--runner", "local"]) == 2
    assert "data.pkl' twice" in capsys.readouterr().err
    assert _files(output) == before
    assert main(["status", str(output)]) == 0
    assert "classified  360/360 images" in capsys.readouterr().out
    # `validate` refuses the archive up front, as the classifier refuses it at load.
    entry = f"classifiers+={{name: dup, kind: torchscript, model: linear, checkpoint: {dup}}}"
    assert main(["validate", str(REPO / "configs" / "demo.yaml"), "--set", entry]) == 2
    assert "data.pkl' twice" in capsys.readouterr().out


def test_a_name_the_card_would_refuse_is_refused_before_anything_is_written(output, tmp_path):
    from cnsbench import card

    before = _files(output)
    with pytest.raises(CnsbenchError, match="at most 200 characters"):
        evaluate(_net(), str(output), name="n" * 300, preprocess=PRE, **QUIET)
    assert _files(output) == before
    assert card(_net(), str(output), name="n" * 200, output=str(tmp_path / "card"), preprocess=PRE, **QUIET)


# --------------------------------------------------------------------------- low points
def test_a_module_with_parameters_on_meta_is_refused_naming_them(synthetic_demo, tmp_path):
    """Refused before any image is read: a copy of the synthetic demo output does (unit tier)."""
    output = tmp_path / "out"
    shutil.copytree(synthetic_demo, output)
    with torch.device("meta"):
        model = _net()
    before = _files(output)
    with pytest.raises(CnsbenchError, match=r"classifier 'm': .* on the 'meta' device.*0\.weight"):
        evaluate(model, str(output), name="m", preprocess=PRE, **QUIET)
    assert _files(output) == before


class Eleven(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.net(x)
        return torch.cat([logits, logits[:, :1]], 1)


def test_a_label_map_leaving_outputs_unmapped_is_refused(output):

    before = _files(output)
    with pytest.raises(CnsbenchError, match=r"classifiers\[part\]\.label_map: maps 10 of the model's 11 outputs; "
                                            r"outputs \[10\] are unmapped"):
        evaluate(Eleven(), str(output), name="part", preprocess=PRE, label_map={i: i for i in range(10)}, **QUIET)
    assert _files(output) == before
    # Every output mapped (two onto one class): accepted.
    full = {**{i: i for i in range(10)}, 10: 0}
    assert evaluate(Eleven(), str(output), name="full", preprocess=PRE, label_map=full, **QUIET) is not None
