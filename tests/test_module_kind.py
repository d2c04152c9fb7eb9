"""Classifier kind ``module``: a model held in memory, its identity and what it may return."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from pipeline import registry
from pipeline.config import ClassifierSpec
from pipeline.labels import label_space

LABELS = label_space([str(d) for d in range(10)])
SMALL = {"resize": 16, "crop": 16, "interpolation": "bilinear", "mean": [0.5] * 3, "std": [0.25] * 3}


class Net(torch.nn.Module):
    def __init__(self, k: int = 10) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(3 * 16 * 16, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def _spec(model, preprocess=SMALL, **entry) -> ClassifierSpec:
    return ClassifierSpec(name="mine", kind="module", model="tests.Net", preprocess=preprocess, **entry).holding(model)


def _images(n: int) -> list:
    return [Image.new("RGB", (20, 24), (30 * i, 200 - 20 * i, 90)) for i in range(n)]


def test_the_kind_predicts_the_modules_logits_on_the_stated_transform():
    from pipeline.config.protocol import build_transform, preprocess_of, CNS_CLASSIFIER

    net = Net()
    cls = registry.CLASSIFIERS.get("module")
    clf = cls(_spec(net), "cpu", LABELS)
    x = torch.stack([build_transform(preprocess_of(ClassifierSpec(name="a", model="m", preprocess=SMALL).preprocess,
                                                   CNS_CLASSIFIER))(im) for im in _images(3)])
    assert torch.equal(clf.predict(_images(3)), net(x).detach())
    assert clf.out_to_label == list(range(10)) and net.training  # the caller's module is left as it was
    assert cls.input_transform(_spec(net)) == {**SMALL, "mean": [0.5] * 3, "std": [0.25] * 3}
    assert cls.input_transform(_spec(net, "cns"))["crop"] == 224


def test_identity_is_the_state_dict_digest():
    from pipeline.assets.weights import weights_digest
    from pipeline.models.module import qualified_name, state_digest

    a, b = Net(), Net()
    assert state_digest(a) == state_digest(b) == weights_digest(_spec(a))
    with torch.no_grad():
        b.fc.bias[0] += 1.0
    assert state_digest(b) != state_digest(a)
    assert state_digest(Net().to(torch.float64)) != state_digest(a)  # the dtype counts, not only the values
    assert qualified_name(a) == f"{__name__}.Net"
    assert registry.CLASSIFIERS.get("module").held_weights(_spec(None)) == [
        {"key": "state_dict", "ref": "tests.Net", "sha256": None}]


class _Returns(torch.nn.Module):
    def __init__(self, make) -> None:
        super().__init__()
        self.make = make

    def forward(self, x):
        return self.make(x)


def _boom(x):
    raise RuntimeError("boom")


@pytest.mark.parametrize("make, message", [
    (lambda x: {"logits": torch.zeros(len(x), 10)}, r"returned a dict, not a logits tensor"),
    (lambda x: torch.zeros(len(x) + 1, 10), r"returned shape \(3, 10\) for a batch of 2"),
    (lambda x: torch.full((len(x), 10), float("nan")), r"NaN or infinite"),
    (_boom, r"raised on a batch of shape \(2, 3, 16, 16\): RuntimeError: boom"),
])
def test_what_the_model_returns_is_checked_naming_the_classifier(make, message):
    with pytest.raises(ValueError, match=r"classifiers\[mine\]: .*" + message):
        registry.CLASSIFIERS.get("module")(_spec(_Returns(make)), "cpu", LABELS)


def test_an_entry_without_a_model_or_transform_is_refused_before_loading():
    cls = registry.CLASSIFIERS.get("module")
    assert "held in memory" in cls.problems(_spec(None), "classifiers[0] (mine)")[0]
    assert "preprocess" in cls.problems(_spec(Net(), "model"), "classifiers[0] (mine)")[0]
    assert cls.problems(_spec(Net()), "w") == [] and cls.flops_model(_spec(Net())) is None
    with pytest.raises(ValueError, match="11 logits|label space"):
        cls(_spec(Net(11)), "cpu", LABELS)  # 11 outputs over 10 classes need a label_map
    assert cls(_spec(Net(11), label_map={i: i % 10 for i in range(11)}), "cpu", LABELS).out_to_label[10] == 0
