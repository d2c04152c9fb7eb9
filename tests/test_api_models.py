"""cnsbench.evaluate / cnsbench.card of a model held in memory, added in place to a copy of the demo build.

On a copy of the session's demo build (``demo_world``): the model's predictions join every
committed image, its weights are its identity (other weights under the same name are refused,
naming both digests), bad input is refused naming the classifier before anything is written
(on a copy of ``synthetic_demo``, the demo's plan with made-up pixels: no build needed),
and its card equals the card that ``cnsbench card`` makes of the same module exported to a
``.pt2`` archive.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from pipeline.errors import CnsbenchError

PRE = {"resize": 32, "crop": 32, "interpolation": "bilinear", "mean": [0.5] * 3, "std": [0.5] * 3}


class SmallCNN(torch.nn.Module):
    """A CNN over the demo world's ten digits (random weights: its numbers are what they are)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=2)
        self.head = torch.nn.Linear(4 * 15 * 15, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).flatten(1))


@pytest.fixture()
def output(demo_world, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(demo_world, out)
    return str(out)


def evaluate(model, output: str, **kwargs):
    """``cnsbench.evaluate`` adding ``model`` to ``output`` itself; the report's numbers of its name."""
    import cnsbench
    from pipeline.api.models import classifier_metrics

    cnsbench.evaluate(model, output, output=output, in_place=True, **kwargs)
    return classifier_metrics(output, kwargs["name"])


def _marker(output: str) -> bytes:
    with open(f"{output}/config.json", "rb") as f:
        return f.read()


def test_evaluate_adds_the_model_to_every_committed_image_and_returns_the_reports_numbers(output):
    import json

    from pipeline.io.store import OutputStore
    from pipeline.io.tables import load_predictions, load_samples
    from pipeline.models.module import state_digest

    model = SmallCNN()
    metrics = evaluate(model, output, name="mine", preprocess=PRE, runner="local", echo=lambda m: None)
    store = OutputStore(output)
    samples, preds = load_samples(store), load_predictions(store)
    mine = preds[preds["classifier"] == "mine"]
    assert set(mine["sample_id"]) == set(samples["sample_id"]) and len(mine) == len(samples)
    assert {r["classifier"] for r in metrics["summary"]} == {"mine"} and metrics["accuracy"]
    report = json.loads(store.read_bytes("report/metrics.json"))
    assert [r for r in report["summary"] if r["classifier"] == "mine"] == metrics["summary"]
    marker = json.loads(_marker(output))
    entry = next(c for c in marker["config"]["classifiers"] if c["name"] == "mine")
    assert entry["kind"] == "module" and entry["preprocess"] == {**PRE, "shifted_crop_only": False}  # read later
    assert entry["model"] == f"{__name__}.SmallCNN" and marker["weights"]["mine"] == state_digest(model)

    # Same name, same weights: nothing to add, the same numbers.
    assert evaluate(model, output, name="mine", preprocess=PRE, echo=lambda m: None)["summary"] == metrics["summary"]
    # Other weights under the same name: refused, both digests named, nothing touched.
    before = _marker(output)
    other = SmallCNN(seed=1)
    with pytest.raises(CnsbenchError, match=r"mine.*" + state_digest(model)[:12] + r".*" + state_digest(other)[:12]):
        evaluate(other, output, name="mine", preprocess=PRE, echo=lambda m: None)
    assert _marker(output) == before


class _Dict(SmallCNN):
    def forward(self, x):
        return {"logits": super().forward(x)}


class _Eleven(SmallCNN):
    def forward(self, x):
        return torch.cat([super().forward(x), x[:, :1, 0, 0]], dim=1)


class _NaN(SmallCNN):
    def forward(self, x):
        return super().forward(x) * float("nan")


class _Raises(SmallCNN):
    def forward(self, x):
        raise RuntimeError("no batch for me")


@pytest.mark.parametrize("model, kwargs, message", [
    (_Dict(), {}, r"classifiers\[bad\]: the model returned a dict, not a logits tensor"),
    (_Eleven(), {}, r"classifiers\[bad\]: model has 11 outputs but the label space"),
    (_NaN(), {}, r"classifiers\[bad\]: the model returned NaN"),
    (_Raises(), {}, r"classifiers\[bad\]: the model raised .*no batch for me"),
    (SmallCNN(), {"preprocess": "bogus"}, r"classifier 'bad': preprocess"),
    (SmallCNN(), {"preprocess": "model"}, r"classifier 'bad': preprocess 'model'"),
    (SmallCNN(), {"label_map": {0: 10}}, r"classifiers\[bad\]\.label_map: class ids \[10\] are outside"),
])
def test_bad_input_is_refused_naming_the_classifier_before_any_write(synthetic_demo, tmp_path, model, kwargs, message):
    """On a synthetic output of the demo's plan: the checks read its config and images, no model of the world runs."""
    output = str(tmp_path / "out")
    shutil.copytree(synthetic_demo, output)
    before = _marker(output)
    with pytest.raises(CnsbenchError, match=message):
        evaluate(model, output, name="bad", **{"preprocess": PRE, **kwargs}, echo=lambda m: None)
    assert _marker(output) == before


def test_a_path_that_is_not_an_output_is_refused(tmp_path):
    with pytest.raises(CnsbenchError, match="no built benchmark|not a cnsbench build output|does not exist"):
        evaluate(SmallCNN(), str(tmp_path / "nothing"), name="m", preprocess=PRE)


def test_the_card_of_a_model_in_memory_equals_the_card_of_its_pt2_export(output, tmp_path):
    from cnsbench import card
    from pipeline.cli import main
    from pipeline.models.exported import export_classifier

    suite = tmp_path / "suite.yaml"
    suite.write_text(f"suite: one\nbenchmarks:\n  - {{name: cns, family: cns, output: {output}}}\n")
    model = SmallCNN()
    mine = card(model, str(suite), name="mine", output=str(tmp_path / "card"), preprocess=PRE, echo=lambda m: None)
    assert mine["model"]["kind"] == "module" and mine["model"]["preprocess"] == {**PRE, "mean": [0.5] * 3}

    pt2 = export_classifier(model, str(tmp_path / "mine.pt2"), {"input_size": [3, 32, 32], "interpolation": "bilinear",
                                                                 "mean": [0.5] * 3, "std": [0.5] * 3})
    assert main(["card", "--model-kind", "exported", "--model", "mine", "--checkpoint", pt2, "--name", "exported",
                 "--suite", str(suite),
                 "--output", str(tmp_path / "card-pt2"), "--runner", "local"]) == 0
    import json

    exported = json.loads((tmp_path / "card-pt2" / "card.json").read_text())
    for a, b in zip(mine["benchmarks"], exported["benchmarks"], strict=True):
        for key in ("metric", "value", "ci_low", "ci_high"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), key


def test_a_program_that_returns_no_logits_tensor_is_refused_at_export_and_by_the_asset_check(tmp_path):
    """A module returning a dict exports as a program; ``export_classifier`` and the up-front
    check (``validate``, ``build``, ``evaluate``) refuse it, naming what it returns."""
    import json

    from pipeline.config import ClassifierSpec
    from pipeline.models import stored_preprocess
    from pipeline.models.exported import export_classifier, returned_problems

    size = {"input_size": [3, 32, 32], "mean": [0.5] * 3, "std": [0.5] * 3}
    with pytest.raises(ValueError, match=r"export_classifier: _Dict returns a dict of 1 value\(s\).*not a logits tensor"):
        export_classifier(_Dict(), str(tmp_path / "d.pt2"), size)
    program = torch.export.export(_Dict().eval(), (torch.zeros(2, 3, 32, 32),),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    torch.export.save(program, str(tmp_path / "d.pt2"), extra_files={stored_preprocess.PREPROCESS_FILE: json.dumps(size)})
    spec = ClassifierSpec(name="d", kind="exported", model="d", checkpoint=str(tmp_path / "d.pt2"))
    [line] = returned_problems(spec, "classifiers[0] (d)")
    assert line.startswith("classifiers[0] (d).checkpoint: the program in") and "returns a dict" in line
    ok = ClassifierSpec(name="m", kind="exported", model="m",
                        checkpoint=export_classifier(SmallCNN(), str(tmp_path / "m.pt2"), size))
    assert returned_problems(ok, "w") == []


class _Locked(SmallCNN):
    def __init__(self) -> None:
        import threading

        super().__init__()
        self.lock = threading.Lock()


def test_a_model_that_cannot_travel_to_ray_is_refused_before_any_write(output):
    before = _marker(output)
    with pytest.raises(CnsbenchError, match=r"classifiers\[locked\]: its model cannot be sent to the Ray workers .*lock"):
        evaluate(_Locked(), output, name="locked", preprocess=PRE, runner="ray", echo=lambda m: None)
    assert _marker(output) == before
