"""Typed contracts between modules: the classifier kinds and the registry's base-class check.

A classifier kind derives from :class:`pipeline.models.classifiers.BaseClassifier` (``predict``,
``asks``, ``set_precision``, ``footprint``); the registry refuses, naming the entry, a plug-in
class that does not; the classify stage and the memory projection ask the contract, never
``hasattr`` / ``getattr(..., False)``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pipeline import registry
from pipeline.models.classifiers import BaseClassifier, classify_all
from pipeline.models.footprint import ModelSize

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kind", registry.CLASSIFIERS.keys())
def test_every_classifier_kind_implements_the_contract(kind):
    cls = registry.CLASSIFIERS.get(kind)
    assert issubclass(cls, BaseClassifier)
    assert isinstance(cls.asks, bool) and cls.asks == (kind == "vlm")
    for name in ("predict", "set_precision", "footprint", "own_preprocess", "answer"):
        assert callable(getattr(cls, name))
    assert not getattr(cls, "__abstractmethods__", None), f"{kind}: abstract {cls.__abstractmethods__}"


def test_a_plugin_that_is_not_a_classifier_fails_on_load_naming_it(monkeypatch):
    reg = registry.Registry("classifier", base="pipeline.models.classifiers:BaseClassifier")
    reg.register("fake", "pipeline.models.keep_all:KeepAll")
    reg.register("good", "pipeline.models.classifiers:TimmClassifier")
    assert reg.get("good").__name__ == "TimmClassifier"
    with pytest.raises(registry.PluginError) as err:
        reg.get("fake")
    assert str(err.value) == (
        "classifier 'fake' (pipeline.models.keep_all:KeepAll) is not a subclass of "
        "pipeline.models.classifiers.BaseClassifier"
    )
    reg.register("func", "pipeline.models.classifiers:topk_predictions")  # not even a class
    with pytest.raises(registry.PluginError, match=r"classifier 'func' \(pipeline.models.classifiers:topk_predictions\)"):
        reg.get("func")


def test_footprints_are_model_sizes():
    from pipeline.config import ClassifierSpec

    spec = ClassifierSpec(name="r", kind="timm", model="resnet18", model_kwargs={"num_classes": 10})
    size = registry.CLASSIFIERS.get("timm").footprint(spec, 2)
    assert isinstance(size, ModelSize) and not size.own_dtype
    assert size.params == 11_181_642  # resnet18 with a 10-way head
    one = registry.CLASSIFIERS.get("timm").footprint(spec, 1)
    assert size.activation_bytes == 2 * one.activation_bytes > 0
    with pytest.raises(LookupError, match="no size known for torch hub entry 'resnet'"):
        registry.CLASSIFIERS.get("torch_hub").footprint(ClassifierSpec(name="h", kind="torch_hub", model="a/b:resnet"), 1)


def test_classify_all_asks_the_contract_not_attributes():
    """A ranking kind and an asking kind through the same loop: the asking one sees the ranking."""
    import torch

    class Ranker(BaseClassifier):
        def __init__(self, spec=None, device="cpu", labels=None):
            self.spec = type("S", (), {"name": "rank"})()

        out_to_label = property(lambda self: [0, 1, 2])

        def predict(self, images, shifted=None):
            return torch.tensor([[0.0, 5.0, 1.0]] * len(images))

        def set_precision(self, precision):
            pass

    class Asker(Ranker):
        asks = True

        def __init__(self):
            self.spec = type("S", (), {"name": "ask"})()
            self.seen = None

        def answer(self, images, truth, sample_ids, params, rankings):
            self.seen = rankings
            out = type("O", (), {})()
            out.top1, out.top5, out.p_true, out.answers = [1] * len(images), [[1]] * len(images), [1.0] * len(images), ["b"] * len(images)
            out.excluded = [False] * len(images)
            return out

    asker = Asker()
    out = classify_all([asker, Ranker()], [object(), object()], [1, 1], ["a", "b"], [None, None])
    assert asker.seen == {"rank": [[1, 2, 0], [1, 2, 0]]}
    assert out[0][3] == ["b", "b"] and out[1][0] == [1, 1] and out[1][3] == [None, None]
    with pytest.raises(TypeError, match=r"classifiers\[rank\]: a Ranker ranks \(predict\); it asks nothing"):
        Ranker().answer([], [], [], [], {})


def _source(path: str) -> str:
    return (ROOT / path).read_text()


def test_no_duck_typed_dispatch_on_classifiers():
    """The stages and the memory projection use the contract (no hasattr / getattr(.., 'asks', False))."""
    for path in ("pipeline/stages/classify.py", "pipeline/perf/memory.py", "pipeline/models/classifiers.py"):
        tree = ast.parse(_source(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr"):
                args = [a.value for a in node.args if isinstance(a, ast.Constant)]
                assert not {"asks", "set_precision", "footprint"} & set(args), f"{path}:{node.lineno}"
    assert "CLASSIFIER_SIZERS" not in _source("pipeline/perf/memory.py")
    assert "GENERATORS" not in _source("pipeline/registry.py")


def test_protocol_resolution_is_a_copy_that_keeps_what_the_config_set():
    """protocol.resolve fills the unset keys in a copy; the filled keys stay unset in model_fields_set
    (a released layout's protocol may still fill them), and the validated input is not changed."""
    from pipeline.config import protocol
    from pipeline.config.loading import load_config

    cfg = load_config(ROOT / "configs" / "demo.yaml")
    assert cfg.classifiers[0].preprocess == "model" and "preprocess" not in cfg.classifiers[0].model_fields_set
    assert cfg.filter.shift_text_style == "words" and "shift_text_style" not in cfg.filter.model_fields_set
    bare = cfg.model_copy(update={"classifiers": [c.model_copy(update={"preprocess": None}) for c in cfg.classifiers]})
    resolved = protocol.resolve(bare)
    assert resolved is not bare and [c.preprocess for c in bare.classifiers] == [None] * len(cfg.classifiers)
    assert [c.preprocess for c in resolved.classifiers] == ["model"] * len(cfg.classifiers)
    assert resolved.classifiers[0].model_fields_set == bare.classifiers[0].model_fields_set
    assert protocol.resolve(resolved) == resolved
