"""Classifiers: top-k / p_true arithmetic, timm and open_clip zero-shot loading, the classify stage."""

from __future__ import annotations

import io
import json
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pyarrow as pa
import pytest
import torch
from PIL import Image

from pipeline.labels import imagenet

from pipeline.plan import schema
from pipeline.config import ClassifierSpec
from pipeline.demo.tiny_eval_models import (
    make_tiny_clip,
    make_tiny_clip_zeroshot,
    make_tiny_dino,
    make_tiny_timm_classifier,
)
from pipeline.models.classifiers import (
    OpenClipZeroShot,
    TimmClassifier,
    check_timm_name,
    load_label_map,
    topk_predictions,
)

SCALES = [0.0, 1.0, 2.0]


# --------------------------------------------------------------------------- top-k arithmetic
def test_topk_with_label_map_hand_computed():
    # 6 outputs -> ImageNet ids; outputs 2 and 5 both map to 7.
    out_to_label = [10, 11, 7, 13, 14, 7]
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    top1, top5, p_true = topk_predictions(logits, out_to_label, [7, 999])
    assert top1 == [7, 10]
    assert top5[0] == [7, 14, 13, 7, 11]  # outputs 5, 4, 3, 2, 1
    assert len(top5[1]) == 5
    e = np.exp(np.arange(6.0))
    assert p_true[0] == pytest.approx((e[2] + e[5]) / e.sum(), rel=1e-6)  # summed over both outputs of id 7
    assert p_true[1] == 0.0  # 999 is mapped by no output


def test_topk_fewer_than_five_outputs():
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]]))
    top1, top5, p_true = topk_predictions(logits, [100, 200, 300], [300])
    assert top1 == [200] and top5 == [[200, 300, 100]]
    assert p_true[0] == pytest.approx(0.3, abs=1e-6)


def test_topk_identity_and_shape_errors():
    logits = torch.zeros(2, 1000)
    logits[0, 42] = 10.0
    logits[1, 7] = 10.0
    top1, top5, p_true = topk_predictions(logits, list(range(1000)), [42, 8])
    assert top1 == [42, 7]
    assert p_true[0] > 0.9 and p_true[1] < 1e-3
    with pytest.raises(ValueError, match="output space"):
        topk_predictions(torch.zeros(1, 10), list(range(1000)), [0])
    with pytest.raises(ValueError, match="true ids"):
        topk_predictions(torch.zeros(1, 3), [0, 1, 2], [0, 1])


def test_label_map_forms(tmp_path):
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"0": 1, "1": 409}))
    assert load_label_map(str(path), "classifiers[x]") == {0: 1, 1: 409}
    assert load_label_map({0: 5}, "classifiers[x]") == {0: 5}
    with pytest.raises(FileNotFoundError, match="classifiers\\[x\\].label_map"):
        load_label_map(str(tmp_path / "missing.json"), "classifiers[x]")
    with pytest.raises(ValueError, match="0..999"):
        load_label_map({0: 1000}, "classifiers[x]")


def test_check_timm_name():
    check_timm_name("resnet50.a1_in1k")
    check_timm_name("resnet50")
    check_timm_name("resnet50.some_future_tag", local_weights=True)  # own weights: the architecture is enough
    with pytest.raises(ValueError, match="tags of resnet50"):
        check_timm_name("resnet50.some_future_tag")
    with pytest.raises(ValueError) as err:
        check_timm_name("resnet5O")
    assert "'resnet5O'" in str(err.value) and "resnet50" in str(err.value)
    with pytest.raises(ValueError, match="close names"):
        check_timm_name("convnxt_tiny.fb_in1k")


# --------------------------------------------------------------------------- tiny models
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_classify")
    return {
        "dir": d,
        "resnet": make_tiny_timm_classifier(d, "resnet"),
        "vit": make_tiny_timm_classifier(d, "vit", seed=3),
        "clip": make_tiny_clip(d),
        "dino": make_tiny_dino(d),
    }


def random_images(n: int, seed: int, size: int = 40) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(n)]


@pytest.mark.parametrize("arch", ["resnet", "vit"])
def test_timm_classifier_loads_saved_weights(tiny, arch):
    spec = ClassifierSpec(**tiny[arch])
    clf = TimmClassifier(spec, "cpu")
    saved = torch.load(spec.checkpoint)
    state = clf.model.state_dict()
    assert all(torch.equal(state[k], saved[k]) for k in saved)  # the file, not a random init
    assert clf.transform.transforms[1].size == (32, 32)  # tiny input size from the cfg overlay
    assert clf.out_to_label == list(range(1000))
    images = random_images(5, seed=0)
    logits = clf.predict(images)
    assert logits.shape == (5, 1000) and logits.dtype == torch.float32
    # Chunked prediction equals one-by-one prediction.
    one = torch.cat([clf.predict([im]) for im in images])
    assert torch.allclose(logits, one, atol=1e-4)


def test_timm_classifier_with_label_map(tiny, tmp_path):
    spec_dict = make_tiny_timm_classifier(tmp_path, "resnet", name="tiny-10", num_classes=10)
    mapping = {i: 100 + i for i in range(9)}  # output 9 left unmapped
    (tmp_path / "map.json").write_text(json.dumps({str(k): v for k, v in mapping.items()}))
    clf = TimmClassifier(ClassifierSpec(**spec_dict, label_map=str(tmp_path / "map.json")), "cpu")
    saved = torch.load(spec_dict["checkpoint"])
    assert torch.equal(clf.model.state_dict()["fc.weight"], saved["fc.weight"])  # head kept, not dropped
    assert clf.out_to_label == [100 + i for i in range(9)] + [-1]
    assert clf.predict(random_images(2, seed=1)).shape == (2, 10)
    with pytest.raises(ValueError, match="label_map"):
        TimmClassifier(ClassifierSpec(**spec_dict), "cpu")  # 10 outputs need a label map
    with pytest.raises(ValueError, match=">= the model's 10 outputs"):
        TimmClassifier(ClassifierSpec(**spec_dict, label_map={12: 3}), "cpu")


def test_timm_missing_checkpoint_names_path_and_classifier(tiny, tmp_path):
    missing = str(tmp_path / "gone" / "weights.pth")
    spec = ClassifierSpec(**{**tiny["resnet"], "name": "my-resnet", "checkpoint": missing})
    with pytest.raises(FileNotFoundError) as err:
        TimmClassifier(spec, "cpu")
    assert missing in str(err.value) and "my-resnet" in str(err.value)


def test_timm_unknown_name(tiny):
    with pytest.raises(ValueError, match="resnet50"):
        TimmClassifier(ClassifierSpec(**{**tiny["resnet"], "model": "resnet5O"}), "cpu")


def test_open_clip_zero_shot_head(tiny, tmp_path):
    spec = ClassifierSpec(
        **make_tiny_clip_zeroshot(tmp_path, templates=["a photo of a {c}.", "a drawing of a {c}."]),
        label_map={0: 1, 1: 409, 2: 0},
    )
    clf = OpenClipZeroShot(spec, "cpu")
    assert clf.out_to_label == [1, 409, 0]
    assert clf.head.shape == (32, 3)
    # Head = renormalised mean of the per-template unit embeddings.
    names = [imagenet.class_name(i) for i in (1, 409, 0)]
    for j, name in enumerate(names):
        per_t = torch.nn.functional.normalize(
            torch.stack([clf.model.encode_text(clf.tokenizer([t.format(c=name)]))[0] for t in spec.templates]), dim=-1
        )
        expect = torch.nn.functional.normalize(per_t.mean(0), dim=-1)
        assert torch.allclose(clf.head[:, j], expect, atol=1e-5)
    images = random_images(3, seed=2)
    logits = clf.predict(images)
    assert logits.shape == (3, 3)
    assert logits.abs().max() <= 100.0 + 1e-3  # 100 * cosine
    with torch.inference_mode():
        img = torch.nn.functional.normalize(
            clf.model.encode_image(torch.stack([clf.transform(im) for im in images])), dim=-1
        )
    assert torch.allclose(logits, 100 * img @ clf.head, atol=1e-3)


def test_open_clip_zero_shot_head_is_built_once_per_weights(tiny, tmp_path, monkeypatch):
    # Same weights, names and templates: the head is reused (a build's stages and the
    # builds of one process encode the prompts once); rewritten weights make a new one.
    spec = ClassifierSpec(**make_tiny_clip_zeroshot(tmp_path, templates=["a {c}."]), label_map={0: 7, 1: 8})
    calls = []
    build = OpenClipZeroShot._build_head
    monkeypatch.setattr(OpenClipZeroShot, "_build_head", lambda self, *a: calls.append(1) or build(self, *a))
    first, again = OpenClipZeroShot(spec, "cpu"), OpenClipZeroShot(spec, "cpu")
    assert len(calls) == 1 and again.head is first.head
    other = ClassifierSpec(**{**spec.model_dump(), "label_map": {0: 7, 1: 9}})
    assert not torch.equal(OpenClipZeroShot(other, "cpu").head, first.head) and len(calls) == 2
    state = torch.load(spec.checkpoint)
    torch.save({k: v + 0.01 if v.is_floating_point() else v for k, v in state.items()}, spec.checkpoint)
    changed = OpenClipZeroShot(spec, "cpu")
    assert len(calls) == 3 and not torch.allclose(changed.head, first.head)


def test_open_clip_zero_shot_templates_and_errors(tiny, tmp_path):
    base = {
        "name": "zs", "kind": "open_clip_zeroshot", "model": tiny["clip"]["model"],
        "checkpoint": tiny["clip"]["pretrained"], "model_config_file": tiny["clip"]["model_config_file"],
    }
    with pytest.raises(ValueError, match="unknown set"):
        OpenClipZeroShot(ClassifierSpec(**base, templates="fancy"), "cpu")
    with pytest.raises(ValueError, match="\\{c\\}"):
        OpenClipZeroShot(ClassifierSpec(**base, templates=["no placeholder"]), "cpu")
    with pytest.raises(ValueError, match="0..1"):
        OpenClipZeroShot(ClassifierSpec(**base, templates=["{c}"], label_map={0: 1, 2: 3}), "cpu")
    missing = str(tmp_path / "clip.pt")
    with pytest.raises(FileNotFoundError) as err:
        OpenClipZeroShot(ClassifierSpec(**{**base, "checkpoint": missing}, templates=["{c}"]), "cpu")
    assert missing in str(err.value) and "classifiers[zs]" in str(err.value)
    from open_clip import zero_shot_metadata as meta
    from pipeline.models.classifiers import zero_shot_templates

    assert len(zero_shot_templates("openai_imagenet", "x")) == len(meta.OPENAI_IMAGENET_TEMPLATES) == 80
    assert zero_shot_templates("simple", "x")[0]("tench") == meta.SIMPLE_IMAGENET_TEMPLATES[0]("tench")


# --------------------------------------------------------------------------- stage
def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def filtered_batch() -> pa.Table:
    rows = []
    for t, (cid, cname) in enumerate([(1, "goldfish"), (0, "tench")]):
        n = len(SCALES)
        rows.append(
            dict(
                trajectory_id=f"snow/{cid:03d}/seed_{t}", unit_id=f"u{t}", class_id=cid, class_name=cname, seed=t,
                shift="snow", scales=SCALES, sample_ids=[f"s{t}_{i}" for i in range(n)],
                images=[png(im) for im in random_images(n, seed=20 + t, size=32)], unet_evals=1.0, gen_seconds=0.1,
                error=None, clip_text=[30.0] * n, clip_shift_text=[30.0] * n, clip_image=[1.0] * n,
                dino_image=[1.0] * n, n_pass=[2] * n, kept=[True] * n,
            )
        )
    rows.append(
        dict(
            trajectory_id="snow/002/seed_9", unit_id="u9", class_id=2, class_name="great white shark", seed=9,
            shift="snow", scales=[], sample_ids=[], images=[], unet_evals=0.0, gen_seconds=0.0, error="boom",
            clip_text=[], clip_shift_text=[], clip_image=[], dino_image=[], n_pass=[], kept=[],
        )
    )
    return pa.Table.from_pylist(rows, schema=schema.FILTERED)


def test_classify_stage_round_trip(tiny):
    from pipeline.stages.classify import ClassifyStage

    zs = make_tiny_clip_zeroshot(tiny["dir"], name="zs", templates=["a photo of a {c}."])
    zs["label_map"] = {0: 0, 1: 1, 2: 2}
    cfg = {
        "benchmark": {"classes": [0, 1], "seeds": [0, 1], "shifts": ["snow"], "scales": SCALES},
        "filter": {"clip": tiny["clip"], "dino": tiny["dino"]},
        "classifiers": [tiny["resnet"], tiny["vit"], zs],
    }
    stage = ClassifyStage(cfg, device="cpu")
    batch = filtered_batch()
    out = stage(batch)
    assert out.schema.equals(schema.CLASSIFIED)
    rows = out.to_pylist()
    assert [r["trajectory_id"] for r in rows] == batch.column("trajectory_id").to_pylist()
    images = [Image.open(io.BytesIO(b)).convert("RGB") for r in rows[:2] for b in r["images"]]
    truth = [r["class_id"] for r in rows[:2] for _ in r["images"]]
    expected = [
        topk_predictions(c.predict(images), c.out_to_label, truth) for c in stage.classifiers
    ]
    j = 0
    for r in rows[:2]:
        assert len(r["pred_top1"]) == len(r["pred_top5"]) == len(r["pred_p_true"]) == len(SCALES)
        for i in range(len(SCALES)):
            assert len(r["pred_top1"][i]) == 3 and len(r["pred_p_true"][i]) == 3
            assert [len(t) for t in r["pred_top5"][i]] == [5, 5, 3]  # zero-shot head has 3 outputs
            for c, (top1, top5, p_true) in enumerate(expected):  # config order
                assert r["pred_top1"][i][c] == top1[j]
                assert r["pred_top5"][i][c] == top5[j]
                assert r["pred_p_true"][i][c] == pytest.approx(p_true[j], abs=1e-6)
                assert 0.0 <= r["pred_p_true"][i][c] <= 1.0 and not math.isnan(r["pred_p_true"][i][c])
            assert r["pred_top5"][i][2][0] in (0, 1, 2)
            j += 1
    failed = rows[2]
    assert failed["error"] == "boom"
    assert failed["pred_top1"] == failed["pred_top5"] == failed["pred_p_true"] == []
