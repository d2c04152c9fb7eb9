"""The CNS protocol reproduces the original CNS-Bench inputs; ``custom`` keeps the project's own.

Each check compares against the original's definitions written out here by hand (the
torchvision compositions of ``evaluation/similiarity_computer.py`` and easyrobust's
``benchmarks/cns_benchmark.py``, the Keras ImageNet names, the prompt strings of
``evaluation/eval_exp_clip_dino.py``), not against the code under test.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from pipeline.config import protocol
from pipeline.config import ConfigError, dump_yaml, load_config, parse_config

REPO = Path(__file__).resolve().parents[1]
IMAGENET = {
    "benchmark": {"classes": [7, 22], "seeds": [1], "shifts": ["cartoon_style", "heavy_snow"]},
    "classifiers": [{"name": "r50", "model": "resnet50.a1_in1k"}],
}


def cfg_of(**changes):
    raw = copy.deepcopy(IMAGENET)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key].update(value)
        else:
            raw[key] = value
    return parse_config(raw)


@pytest.fixture(scope="module")
def photo():
    """A real photograph (scikit-learn's sample image, 640 x 427 JPEG) as a PIL image."""
    from PIL import Image
    from sklearn.datasets import load_sample_image

    return Image.fromarray(load_sample_image("china.jpg"))


# --------------------------------------------------------------------------- names
def test_keras_names_at_known_indices():
    names = protocol.keras_class_names()
    assert len(names) == 1000
    assert (names[0], names[2], names[22]) == ("tench", "great white shark", "bald eagle")
    assert names[7] == "cock" and names[21] == "kite"
    assert names[134] == names[517] == "crane"
    assert names[638] == names[639] == "maillot"
    assert all("_" not in n for n in names)


def test_keras_names_differ_from_the_clip_names_of_zero_shot():
    from pipeline.labels.imagenet import class_names

    clip = class_names()
    assert (clip[7], clip[21]) == ("rooster", "kite (bird of prey)")
    differ = [i for i in range(1000) if clip[i] != protocol.keras_class_names()[i]]
    assert len(differ) > 300 and 7 in differ and 1 not in differ


def test_keras_names_ship_as_package_data():
    import tomllib

    root = REPO
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["pipeline.data"]
    assert "*.json" in data
    assert protocol.KERAS_CLASS_INDEX.parent == root / "pipeline" / "data"


# --------------------------------------------------------------------------- resolution
def test_imagenet_defaults_to_cns_and_the_resolved_config_shows_it():
    cfg = cfg_of()
    assert cfg.protocol == "cns"
    assert cfg.filter.class_names == "keras" and cfg.filter.shift_text_style == "verbatim"
    assert cfg.filter.dino.preprocess == "cns"
    assert [c.preprocess for c in cfg.classifiers] == ["cns"]
    doc = yaml.safe_load(dump_yaml(cfg))
    assert doc["protocol"] == "cns" and doc["classifiers"][0]["preprocess"] == "cns"
    # The resolved config parses back to itself (a resumed build compares them).
    assert parse_config(doc).model_dump() == cfg.model_dump()


def test_custom_keeps_the_project_settings_and_explicit_keys_win():
    cfg = cfg_of(protocol="custom")
    assert cfg.filter.class_names == "labels" and cfg.filter.shift_text_style == "words"
    assert cfg.filter.dino.preprocess == "model" and cfg.classifiers[0].preprocess == "model"
    mixed = cfg_of(classifiers=[{"name": "r50", "model": "resnet50.a1_in1k", "preprocess": "model"}])
    assert mixed.protocol == "cns" and mixed.classifiers[0].preprocess == "model"


def test_other_label_spaces_default_to_custom():
    cfg = load_config(REPO / "configs" / "demo.yaml")
    assert cfg.protocol == "custom" and {c.preprocess for c in cfg.classifiers} == {"model"}
    raw = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    raw.pop("protocol")
    assert parse_config(raw).protocol == "custom"


def test_keras_names_on_a_non_imagenet_label_space_are_refused():
    with pytest.raises(ConfigError, match="filter.class_names"):
        parse_config({
            "benchmark": {"labels": ["a", "b"], "classes": [0], "seeds": [1], "shifts": ["s"]},
            "filter": {"class_names": "keras"},
            "classifiers": [{"name": "r", "model": "resnet18"}],
        })


def test_shift_text_of_an_unknown_shift_is_refused():
    with pytest.raises(ConfigError, match=r"filter.shift_text: \['heavy_snwo'\]"):
        cfg_of(filter={"shift_text": {"heavy_snwo": "snow"}})


def test_explicit_preprocess_is_validated():
    ok = cfg_of(classifiers=[{"name": "c", "model": "resnet18", "preprocess": {
        "resize": 336, "crop": 336, "mean": [0.5] * 3, "std": [0.5] * 3}}])
    assert ok.classifiers[0].preprocess.interpolation == "bicubic"
    with pytest.raises(ConfigError, match=r"classifiers\[0\]\.preprocess"):
        cfg_of(classifiers=[{"name": "c", "model": "resnet18", "preprocess": {
            "resize": 200, "crop": 224, "mean": [0.5] * 3, "std": [0.5] * 3}}])
    with pytest.raises(ConfigError, match=r"classifiers\[0\]\.preprocess"):
        cfg_of(classifiers=[{"name": "c", "model": "resnet18", "preprocess": "timm"}])


def test_output_written_before_the_protocol_counts_as_custom():
    from pipeline.output_run import differing_keys, with_current_defaults as _with_current_defaults
    from pipeline.config import resolved_dict

    old = resolved_dict(cfg_of(protocol="custom"))
    old.pop("protocol")
    for clf in old["classifiers"]:
        clf.pop("preprocess")
    # Same settings as before: nothing differs.
    assert differing_keys(_with_current_defaults(old), resolved_dict(cfg_of(protocol="custom"))) == []
    # Its rows were made with the models' own preprocessing: a cns build may not extend it.
    bad = differing_keys(_with_current_defaults(old), resolved_dict(cfg_of()))
    assert "protocol" in bad and "filter.class_names" in bad and "filter.dino.preprocess" in bad


# --------------------------------------------------------------------------- prompts
from pipeline.models.filter_base import Filter  # noqa: E402 (the recorder's base; imports no torch)


class _PromptRecorder(Filter):
    """A filter that records the prompts the OOC filter would encode, and keeps everything."""

    def __init__(self, spec, device):
        from pipeline.models.detectors import OOCFilter

        super().__init__(spec, device)
        self.ooc = OOCFilter.__new__(OOCFilter)  # prompts() needs only the spec: no model loads
        self.ooc.spec = spec
        self.seen: list[tuple[str, str]] = []

    def set_precision(self, precision):  # the filter contract (docs/architecture.md, "Registries")
        self.precision = precision

    def evaluate(self, items):
        from pipeline.models.keep_all import KeepAll

        self.seen += [self.ooc.prompts(name, shift) for _, _, name, shift in items]
        return KeepAll(self.spec, "cpu").evaluate(items)


@pytest.fixture(scope="module")
def recorder_key():
    from pipeline import registry
    key = "test_protocol_prompts"
    if key not in registry.FILTERS.keys():
        registry.FILTERS.register(key, f"{__name__}:_PromptRecorder", "records prompts (tests)")
    return key


def _prompts(recorder_key, **changes) -> list[tuple[str, str]]:
    import io

    from PIL import Image

    from pipeline.stages.filter import FilterStage

    cfg = cfg_of(filter={"kind": recorder_key, **changes.pop("filter", {})}, **changes)
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="PNG")
    rows = [
        {"class_id": c, "class_name": cfg.benchmark.class_name(c), "shift": s, "scales": [0.0], "images": [buf.getvalue()]}
        for c in (7, 22)
        for s in ("cartoon_style", "heavy_snow")
    ]
    stage = FilterStage(cfg, device="cpu")
    stage.setup()
    stage.process(rows)
    return stage.filter.seen


def test_cns_filter_prompts_are_the_originals(recorder_key):
    # eval_exp_clip_dino.py: f"a photo of a {name}" and f"a photo of a {name} in {args.variation}"
    # with name = Keras name, '_' -> ' ', and the --variation argument verbatim.
    assert _prompts(recorder_key) == [
        ("a photo of a cock", "a photo of a cock in cartoon_style"),
        ("a photo of a cock", "a photo of a cock in heavy_snow"),
        ("a photo of a bald eagle", "a photo of a bald eagle in cartoon_style"),
        ("a photo of a bald eagle", "a photo of a bald eagle in heavy_snow"),
    ]


def test_custom_filter_prompts_use_label_names_and_shift_words(recorder_key):
    seen = _prompts(recorder_key, protocol="custom", benchmark={"shift_words": {"heavy_snow": "deep snow"}})
    assert seen[0] == ("a photo of a rooster", "a photo of a rooster in cartoon style")
    assert seen[1] == ("a photo of a rooster", "a photo of a rooster in deep snow")


def test_per_shift_filter_text_overrides_the_style(recorder_key):
    seen = _prompts(recorder_key, filter={"shift_text": {"heavy_snow": "a snowstorm"}})
    assert seen[0][1] == "a photo of a cock in cartoon_style"
    assert seen[1][1] == "a photo of a cock in a snowstorm"


# --------------------------------------------------------------------------- transforms
def _original_dino_transform():
    # similiarity_computer.py, DinoImgSimilarity._get_transform
    from torchvision import transforms

    return transforms.Compose([
        transforms.Resize(520),
        transforms.CenterCrop(518),
        transforms.ToTensor(),
        transforms.Normalize(mean=0.5, std=0.2),
    ])


def _original_classifier_transform():
    # easyrobust cns_benchmark.py with its defaults: input 224, crop_pct 0.875, interpolation 3
    # (PIL's BICUBIC), ImageNet mean/std.
    from torchvision import transforms

    return transforms.Compose([
        transforms.Resize(int(224 / 0.875), interpolation=transforms.InterpolationMode.BICUBIC),
        transforms.CenterCrop(224),
        transforms.ToTensor(),
        transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    ])


def test_dino_transform_is_the_originals_pixel_for_pixel(photo, tmp_path):
    import torch

    from pipeline.config import DinoModelSpec
    from pipeline.demo.tiny_eval_models import make_tiny_dino
    from pipeline.models.detectors import DinoEncoder

    expected = _original_dino_transform()(photo)
    assert expected.shape == (3, 518, 518)
    assert torch.equal(protocol.build_transform(protocol.CNS_DINO)(photo), expected)
    enc = DinoEncoder(DinoModelSpec(**{**make_tiny_dino(tmp_path), "preprocess": "cns"}), "cpu")
    assert torch.equal(enc.transform(photo), expected)
    own = DinoEncoder(DinoModelSpec(**{**make_tiny_dino(tmp_path), "preprocess": "model"}), "cpu")
    assert own.transform(photo).shape == (3, 28, 28)


def test_classifier_transform_is_the_originals_pixel_for_pixel(photo, tmp_path):
    import torch

    from pipeline.config import ClassifierSpec
    from pipeline.demo.tiny_eval_models import make_tiny_timm_classifier
    from pipeline.models.classifiers import TimmClassifier

    expected = _original_classifier_transform()(photo)
    assert torch.equal(protocol.build_transform(protocol.CNS_CLASSIFIER)(photo), expected)
    spec = make_tiny_timm_classifier(tmp_path, "resnet")
    cns = TimmClassifier(ClassifierSpec(**{**spec, "preprocess": "cns"}), "cpu")
    assert torch.equal(cns.inputs([photo, photo]), torch.stack([expected, expected]))
    own = TimmClassifier(ClassifierSpec(**{**spec, "preprocess": "model"}), "cpu")
    assert own.inputs([photo]).shape == (1, 3, 32, 32)  # the tiny model's own data config
    explicit = TimmClassifier(ClassifierSpec(**{**spec, "preprocess": {
        "resize": 64, "crop": 48, "interpolation": "bilinear", "mean": [0.5] * 3, "std": [0.25] * 3}}), "cpu")
    from torchvision import transforms

    by_hand = transforms.Compose([
        transforms.Resize(64), transforms.CenterCrop(48), transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.25] * 3),
    ])(photo)
    assert torch.equal(explicit.inputs([photo])[0], by_hand)


def test_open_clip_zero_shot_takes_the_cns_input_too(photo, tmp_path):
    import torch

    from pipeline.config import ClassifierSpec
    from pipeline.demo.tiny_eval_models import make_tiny_clip_zeroshot
    from pipeline.models.classifiers import OpenClipZeroShot

    spec = make_tiny_clip_zeroshot(tmp_path, image_size=224)
    clf = OpenClipZeroShot(ClassifierSpec(**spec), "cpu")
    assert clf.preprocess_choice == "cns"
    assert torch.equal(clf.inputs([photo])[0], _original_classifier_transform()(photo))
    assert clf.predict([photo]).shape == (1, 1000)


# --------------------------------------------------------------------------- class tokens
def test_plain_imagenet_names_on_a_slider_build_are_refused(tmp_path, capsys):
    from buildproc import tiny_config

    from pipeline.cli import main

    def plain(raw):
        raw["generator"]["class_tokens"] = {"kind": "none"}

    assert main(["validate", str(tiny_config(tmp_path, plain, name="plain.yaml"))]) == 2
    out = capsys.readouterr().out
    assert "generator.class_tokens: kind 'none'" in out and "plain_names: true" in out

    def opted_in(raw):
        raw["generator"]["class_tokens"] = {"kind": "none", "plain_names": True}

    assert main(["validate", str(tiny_config(tmp_path, opted_in, name="opt.yaml"))]) == 0
    assert "class_tokens" not in capsys.readouterr().out


def test_paper_config_validates_here_listing_what_is_missing(capsys):
    from pipeline.cli import main

    assert main(["validate", str(REPO / "configs" / "cns_bench.yaml")]) == 2
    captured = capsys.readouterr()
    out = captured.out
    assert "protocol: cns" in out and "Traceback" not in out + captured.err
    assert "generator.class_tokens:" in out and "imagenet_star/tokens.pt" in out
    assert "cartoon_style_class_002_alpha1.0_rank4_noxattn/cartoon_style_class_002_alpha1.0_rank4_noxattn_last.pt" in out
    assert "torch hub facebookresearch/dinov2:dinov2_vitb14_reg_lc" in out
    cfg = load_config(REPO / "configs" / "cns_bench.yaml")
    assert cfg.benchmark.seeds == list(range(1, 51)) and cfg.benchmark.scales == [0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert cfg.generator.class_tokens.kind == "text_encoder_dir" and cfg.generator.resolution == 768
    timm_models = [c.model for c in cfg.classifiers if c.kind == "timm"]
    assert "resnet50.a1_in1k" in timm_models and "convnextv2_huge.fcmae_ft_in1k" in timm_models
    assert {c.preprocess for c in cfg.classifiers if c.name != "clip_vit_l14_336"} == {"cns"}


# --------------------------------------------------------------------------- torch hub
HUBCONF = '''
dependencies = ["torch"]

import torch


def tiny_lc(width=3):
    """A stand-in for dinov2_*_lc: image -> 1000 ImageNet logits."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(width, 1000))
'''


def test_torch_hub_classifier_loads_an_entry_point_lazily(photo, tmp_path):
    import torch

    from pipeline.config import ClassifierSpec
    from pipeline.registry import CLASSIFIERS

    (tmp_path / "hubconf.py").write_text(HUBCONF)
    spec = ClassifierSpec(name="hub", kind="torch_hub", model=f"{tmp_path}:tiny_lc", preprocess="model")
    clf = CLASSIFIERS.get("torch_hub")(spec, "cpu")
    assert clf.out_to_label == list(range(1000))
    # No data config to read: 'model' is the standard ImageNet eval transform (= cns).
    assert torch.equal(clf.inputs([photo])[0], _original_classifier_transform()(photo))
    assert clf.predict([photo, photo]).shape == (2, 1000)

    from pipeline.models.classifiers import parse_hub_model

    assert parse_hub_model("facebookresearch/dinov2:dinov2_vitb14_reg_lc", "x") == (
        "facebookresearch/dinov2", "dinov2_vitb14_reg_lc")
    assert parse_hub_model("owner/repo:main:entry", "x") == ("owner/repo:main", "entry")
    with pytest.raises(ValueError, match=r"classifiers\[0\] \(hub\)\.model"):
        parse_hub_model("dinov2_vitb14_lc", "classifiers[0] (hub)")
