"""Released benchmarks' protocols (pipeline/sources/release_protocol.py): filling, overrides, the report's entry."""

from __future__ import annotations

import pytest

from pipeline.config.protocol import IMAGENET_MEAN, IMAGENET_STD, Preprocess, build_transform
from pipeline.sources.detect import protocol_of
from pipeline.sources.release_protocol import ANALYSIS, ANY_KIND, MODEL, TORCHVISION_EVAL, ReleaseProtocol, apply

OWN = Preprocess(232, 224, "bicubic", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
CROP_ONLY = Preprocess(256, 224, "bilinear", IMAGENET_MEAN, IMAGENET_STD, shifted_crop_only=True)
PROTO = ReleaseProtocol(
    name="toy",
    original="somebody/toy eval.py",
    preprocess={"timm": CROP_ONLY, ANY_KIND: MODEL},
    templates=("A photo of a {c}",),
    accuracy="top-1",
    metric="accuracy",
)


def entry(name: str, kind: str = "timm", **kw) -> dict:
    return {"name": name, "kind": kind, "model": "m", "templates": "openai_imagenet", "preprocess": "cns", **kw}


def own(e: dict) -> Preprocess | None:
    return OWN if e["model"] == "m" else None


def test_unset_entries_get_the_protocol_and_the_model_own_as_numbers():
    clfs, analysis, warnings = apply(
        PROTO, [entry("a"), entry("z", "open_clip_zeroshot"), entry("t", "torchscript", model="x")], {}, own
    )
    by = {c["name"]: c for c in clfs}
    assert by["a"]["preprocess"] == CROP_ONLY.as_dict() and by["a"]["preprocess"]["shifted_crop_only"] is True
    assert by["a"]["templates"] == "openai_imagenet"  # templates are for zero-shot kinds only
    assert by["z"]["preprocess"] == OWN.as_dict() and by["z"]["templates"] == ["A photo of a {c}"]
    assert by["t"]["preprocess"] == MODEL  # a kind that cannot state its own transform keeps "model"
    assert warnings == [] and analysis["overridden"] == {}
    assert analysis["name"] == ANALYSIS and analysis["protocol"] == "toy"
    assert analysis["classifiers"]["z"] == {"preprocess": OWN.as_dict(), "templates": ["A photo of a {c}"]}


def test_an_entry_that_sets_its_own_keeps_it_with_a_warning():
    explicit = {"a": {"preprocess"}, "z": {"templates"}, "same": {"preprocess"}, "own": {"preprocess"}}
    clfs, analysis, warnings = apply(
        PROTO,
        [
            entry("a"),  # cns: not test.py's transform
            entry("z", "open_clip_zeroshot", templates="simple"),
            entry("same", preprocess={**CROP_ONLY.as_dict(), "interpolation": "bilinear"}),  # the protocol's, spelled out
            entry("own", "open_clip_zeroshot", preprocess=MODEL),  # "model" is what the protocol asks for
        ],
        explicit,
        own,
    )
    by = {c["name"]: c for c in clfs}
    assert by["a"]["preprocess"] == "cns" and by["z"]["templates"] == "simple"
    assert set(analysis["overridden"]) == {"a", "z"}
    assert len(warnings) == 2 and all("not comparable with the published ones" in w for w in warnings)
    assert "classifiers[a] overrides the toy protocol (preprocess 'cns'" in warnings[0]
    assert "templates 'simple' instead of ['A photo of a {c}']" in warnings[1]


def test_layouts_declare_their_protocols():
    assert protocol_of("cns") is None and protocol_of("folders") is None
    c, d = protocol_of("imagenet_c"), protocol_of("imagenet_d")
    assert c.preprocess_for("timm") == Preprocess(256, 224, "bilinear", IMAGENET_MEAN, IMAGENET_STD, True)
    assert c.preprocess_for("open_clip_zeroshot") == MODEL and c.templates is None
    assert d.preprocess_for("timm") == MODEL and d.templates == ("A photo of a {c}",)
    assert TORCHVISION_EVAL == Preprocess(256, 224, "bilinear", IMAGENET_MEAN, IMAGENET_STD)


def test_shifted_images_are_only_cropped():
    from PIL import Image

    img = Image.new("RGB", (224, 224), (10, 200, 30))
    img.putpixel((0, 0), (255, 255, 255))
    shifted = build_transform(CROP_ONLY, shifted=True)(img)
    clean = build_transform(CROP_ONLY)(img)
    assert shifted.shape == clean.shape == (3, 224, 224)
    # no resize: the corner pixel stays where it is, alone; the resized image moves it out of the crop
    assert shifted[0, 0, 0] == pytest.approx((1.0 - IMAGENET_MEAN[0]) / IMAGENET_STD[0])
    assert shifted[0, 0, 1] == pytest.approx((10 / 255 - IMAGENET_MEAN[0]) / IMAGENET_STD[0], abs=1e-6)
    assert clean[0, 0, 0] == pytest.approx((10 / 255 - IMAGENET_MEAN[0]) / IMAGENET_STD[0], abs=1e-6)
    assert build_transform(TORCHVISION_EVAL, shifted=True)(img).equal(clean)  # without the flag: the same for all


def test_a_models_own_transform_as_numbers_equals_its_librarys(tmp_path):
    """timm's data config and open_clip's preprocess, written as a Preprocess, feed the same tensor."""
    import numpy as np
    from PIL import Image

    from pipeline.demo.tiny_eval_models import make_tiny_clip, make_tiny_timm_classifier
    from pipeline.models.detectors import load_open_clip, load_timm, timm_transform
    from pipeline.models.own_preprocess import open_clip_own_preprocess, timm_own_preprocess

    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (90, 70, 3), dtype=np.uint8))
    timm_spec = make_tiny_timm_classifier(tmp_path / "timm")
    p = timm_own_preprocess(timm_spec["model"], timm_spec["model_kwargs"])
    assert (p.crop, p.interpolation) == (32, "bicubic")
    net = load_timm(timm_spec["model"], timm_spec["checkpoint"], timm_spec["model_kwargs"], "cpu", "t")
    assert build_transform(p)(img).equal(timm_transform(net)(img))
    clip_spec = make_tiny_clip(tmp_path / "clip", name="tiny-clip-own", vision={"image_size": 48})
    q = open_clip_own_preprocess(clip_spec["model"], clip_spec["pretrained"], clip_spec["model_config_file"])
    assert (q.resize, q.crop, q.interpolation, q.mean) == (48, 48, "bicubic", (0.48145466, 0.4578275, 0.40821073))
    _, clip_preprocess, _ = load_open_clip(clip_spec["model"], clip_spec["pretrained"], clip_spec["model_config_file"], "cpu", "c")
    assert build_transform(q)(img).equal(clip_preprocess(img))
