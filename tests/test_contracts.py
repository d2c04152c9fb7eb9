"""Typed contracts between modules: the classifier kinds and the registry's base-class check.

A classifier kind derives from :class:`pipeline.models.classifier_kind.BaseClassifier` through
one of its two roles (a ranking :class:`pipeline.models.classifiers.Classifier` with ``predict``,
or an :class:`pipeline.models.classifier_kind.AskingClassifier` with ``answer``), with the
class-level hooks the project asks a kind; the registry refuses, naming the entry, a plug-in
class that does not; the classify stage and the memory projection ask the contract, never
``hasattr`` / ``getattr(..., False)``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pipeline import registry
from pipeline.config import spec_class
from pipeline.models.classifier_kind import AskingClassifier
from pipeline.models.classifiers import BaseClassifier, Classifier, classify_all
from pipeline.models.footprint import ModelSize

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kind", registry.CLASSIFIERS.keys())
def test_every_classifier_kind_implements_the_contract(kind):
    cls = registry.CLASSIFIERS.get(kind)
    assert issubclass(cls, BaseClassifier)
    assert isinstance(cls.asks, bool) and cls.asks == (kind == "vlm")
    # One role each, and only its own method: no inherited method that raises.
    assert issubclass(cls, AskingClassifier) == cls.asks != issubclass(cls, Classifier)
    assert hasattr(cls, "answer") == cls.asks and hasattr(cls, "predict") != cls.asks
    assert cls.Spec is spec_class(kind), f"{kind}: its options model is not the one its config entries get"
    for name in ("set_precision", "footprint", "own_preprocess", "local_files", "hub_refs", "problems",
                 "file_problems", "cached_weights", "held_weights", "input_transform", "flops_model"):
        assert callable(getattr(cls, name))
    assert not getattr(cls, "__abstractmethods__", None), f"{kind}: abstract {cls.__abstractmethods__}"


def test_a_plugin_that_is_not_a_classifier_fails_on_load_naming_it(monkeypatch):
    reg = registry.Registry("classifier", base="pipeline.models.classifier_kind:BaseClassifier")
    reg.register("fake", "pipeline.models.keep_all:KeepAll")
    reg.register("good", "pipeline.models.classifiers:TimmClassifier")
    assert reg.get("good").__name__ == "TimmClassifier"
    with pytest.raises(registry.PluginError) as err:
        reg.get("fake")
    assert str(err.value) == (
        "classifier 'fake' (pipeline.models.keep_all:KeepAll) is not a subclass of "
        "pipeline.models.classifier_kind.BaseClassifier"
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


def test_a_kinds_options_live_on_its_own_spec():
    """``classifiers[]`` is a union on ``kind``: a vlm's fields exist only on its spec, the YAML is
    unchanged, and a plain entry that sets one is told which kind takes it."""
    from pipeline.config import ClassifierSpec, ConfigError, VLMSpec, parse_config

    assert "dtype" not in ClassifierSpec.model_fields and "dtype" in VLMSpec.model_fields
    raw = {"benchmark": {"classes": [1], "shifts": ["snow"], "seeds": [0]},
           "classifiers": [{"name": "r", "model": "resnet18"},
                           {"name": "q", "kind": "vlm", "model": "org/vlm", "protocol": {"kind": "open"}}]}
    cfg = parse_config(raw)
    assert [type(c) for c in cfg.classifiers] == [ClassifierSpec, VLMSpec]
    assert cfg.classifiers[1].dtype == "float32" and "dtype" not in cfg.classifiers[0].model_dump()
    assert type(ClassifierSpec.model_validate(cfg.classifiers[1].model_dump())) is VLMSpec
    raw["classifiers"][0]["dtype"] = "float16"
    with pytest.raises(ConfigError, match=r"classifiers\[0\]: .*dtype: only a classifier of kind vlm takes them"):
        parse_config(raw)
    raw["classifiers"][0].pop("dtype")
    raw["classifiers"][1]["bogus"] = 1
    with pytest.raises(ConfigError, match=r"classifiers\[1\]\.bogus: unknown key; allowed keys here: .*prompt_template"):
        parse_config(raw)


def test_no_module_switches_on_classifier_kind_names():
    """assets, config loading, cards and perf ask the kind's class (its hooks), never its name."""
    import re

    pattern = re.compile(r'kind == "vlm"|kind in \(')
    paths = [*(ROOT / "pipeline" / d for d in ("assets", "card", "perf")), ROOT / "pipeline/config/loading.py"]
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*.py")))]
    found = [f"{f.relative_to(ROOT)}:{n}" for f in files for n, line in enumerate(f.read_text().splitlines(), 1)
             if pattern.search(line)]
    assert len(files) > 10 and found == []


def test_an_output_written_before_the_union_still_reads():
    """Outputs' config.json of before held a vlm's keys (null) on every entry: they still parse."""
    from pipeline.config import ClassifierSpec

    old = {"name": "r", "kind": "timm", "model": "resnet18", "protocol": None, "dtype": None, "vision_dtype": None,
           "image_aspect_ratio": None, "prompt_template": None}
    spec = ClassifierSpec.model_validate(old)
    assert type(spec) is ClassifierSpec and "dtype" not in spec.model_dump()
