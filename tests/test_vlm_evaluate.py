"""`cnsbench evaluate` of an ImageNet-D-shaped tree with questions/*.csv and a vlm classifier (in-process).

The vlm is a tiny random LLaVA built here; its generation is replaced by answers chosen
from each prompt's options, so the test knows every verdict: the distractor must be the
file's (top-1, or top-2 when the top-1 is the truth), the scoring ImageNet-D's, the prompt
wrapped in the original's llava_v1 conversation; an image without a question is not asked.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from PIL import Image

from pipeline import cli
from pipeline.labels import label_space
from pipeline.models.vqa_protocols import IMAGENET_D_PROMPT

REPO = Path(__file__).resolve().parents[1]

# image (kind/folder/file), gt, top1, top2 -> the distractor the rule picks
QUESTIONS = [
    ("background/banana/banana_0.jpg", "banana", "orange", "banana", "orange"),
    ("background/banana/banana_1.jpg", "banana", "banana", "lemon", "lemon"),
    ("background/pen/pen_0.jpg", "pen", "can opener", "pen", "can opener"),
    ("background/chair/chair_0.jpg", "chair", "chair", "bench", "bench"),
]
# What the fake model answers per image, and the verdict ImageNet-D's rules give it.
ANSWERS = {"banana_0": ("It is a banana.", "TRUE"), "banana_1": ("a lemon", "FALSE"),
           "pen_0": ("a can opener", "FALSE"), "chair_0": ("a chair or a bench", "BOTH")}


def make_tree(root: Path) -> Path:
    for i, (rel, *_rest) in enumerate(QUESTIONS):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40, 40), (40 * i, 100, 150)).save(root / rel, quality=90)
    (root / "texture" / "banana").mkdir(parents=True)
    Image.new("RGB", (40, 40)).save(root / "texture" / "banana" / "t.jpg")  # no question: no vlm row needed
    (root / "questions").mkdir()
    lines = ["image_dir\tgt_category\ttop1_pred_cate\ttop2_pred_cate"] + ["\t".join(q[:4]) for q in QUESTIONS]
    (root / "questions" / "background.csv").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture()
def vlm_config(tmp_path):
    from pipeline.demo.assets import ensure_tiny_assets
    from pipeline.demo.tiny_vlm import build_tiny_llava

    ensure_tiny_assets()
    model = build_tiny_llava(tmp_path / "llava", [IMAGENET_D_PROMPT, "banana orange lemon pen can opener chair bench"])
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text().replace("../assets", str(REPO / "assets")))
    clip = next(c for c in raw["classifiers"] if c["kind"] == "open_clip_zeroshot")
    raw["classifiers"] = [
        {"name": "llava", "kind": "vlm", "model": str(model),
         "protocol": {"kind": "two_choice", "distractors": "questions", "max_new_tokens": 2}},
        clip,  # a ranking classifier beside it; the vlm's distractors come from the release
    ]
    path = tmp_path / "vlm.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_evaluate_release_questions_with_a_vlm(tmp_path, vlm_config, monkeypatch):
    from pipeline.models.vlm import VLMClassifier

    prompts: list[str] = []

    by_options = {"banana, orange": "banana_0", "banana, lemon": "banana_1", "pen, can opener": "pen_0",
                  "chair, bench": "chair_0"}

    def fake_generate(self, images, chat_prompts, seeds):
        out = []
        for p in chat_prompts:
            prompts.append(p)
            options = re.search(r"list: (.*)\. ASSISTANT:", p).group(1)
            out.append(ANSWERS[by_options[options]][0] if options in by_options else "I do not know")
        return out

    monkeypatch.setattr(VLMClassifier, "generate", fake_generate)
    root = make_tree(tmp_path / "ImageNet-D")
    out = tmp_path / "out"
    rc = cli.main(["evaluate", str(root), "--config", str(vlm_config), "--output", str(out), "--runner", "local"])
    assert rc == 0
    # The prompt is the release's, with the file's categories: truth first, then the distractor.
    asked = {re.search(r"list: (.*)\. ASSISTANT:", p).group(1) for p in prompts}
    assert {f"{gt}, {d}" for _, gt, _, _, d in QUESTIONS} <= asked
    assert all(IMAGENET_D_PROMPT.split("{")[0] in p for p in prompts)
    assert len(prompts) == len(QUESTIONS)  # the image without a question is not asked
    assert all(p.startswith("A chat between a curious human and an artificial intelligence assistant. ") and
               " USER: <image>\nWhat is the main object" in p for p in prompts)  # the original's llava_v1 wrapper

    samples = pd.read_parquet(out / "samples")
    preds = pd.read_parquet(out / "predictions")
    assert {"answer", "correct", "excluded"} <= set(preds.columns)
    v = preds[preds["classifier"] == "llava"].merge(samples[["sample_id", "params", "class_id"]], on="sample_id")
    names = label_space("imagenet_d")
    verdicts = {}
    for _, r in v.iterrows():
        if not isinstance(r["params"], str):
            continue
        q = json.loads(r["params"])["question"]
        d = q["top1_pred_cate"] if q["top1_pred_cate"] != q["gt_category"] else q["top2_pred_cate"]
        verdicts[by_options[f"{q['gt_category']}, {d}"]] = r
    assert set(verdicts) == set(ANSWERS)
    unasked = v[v["params"].isna()].iloc[0]  # no question in the file: not asked, excluded
    assert pd.isna(unasked["answer"]) and unasked["excluded"] and unasked["top1"] == -1
    for stem, r in verdicts.items():
        expected = ANSWERS[stem][1]
        assert bool(r["excluded"]) == (expected == "BOTH")
        assert (r["correct"] is None or pd.isna(r["correct"])) if expected == "BOTH" else r["correct"] == (expected == "TRUE")
    assert verdicts["banana_0"]["top1"] == verdicts["banana_0"]["class_id"]
    assert names.name(int(verdicts["pen_0"]["top1"])) == "can opener"  # FALSE: the class it named
    clip_rows = preds[preds["classifier"] != "llava"]
    assert clip_rows["answer"].isna().all() and clip_rows["excluded"].isna().all()

    # report/: TRUE / (TRUE + FALSE) with the excluded count, per shift and scale.
    table = pd.read_csv(out / "report" / "vlm_answers.csv")
    bg = table[(table["classifier"] == "llava") & (table["shift"] == "background")].iloc[0]
    assert (bg["n_true"], bg["n_false"], bg["n_excluded"], bg["n_unasked"]) == (1, 2, 1, 0)
    tx = table[(table["classifier"] == "llava") & (table["shift"] == "texture")].iloc[0]
    assert (tx["n"], tx["n_excluded"], tx["n_unasked"]) == (1, 1, 1)  # no question: excluded, not asked
    assert bg["accuracy"] == pytest.approx(1 / 3)
    acc = pd.read_csv(out / "report" / "accuracy.csv")
    row = acc[(acc["classifier"] == "llava") & (acc["shift"] == "background")].iloc[0]
    assert row["accuracy"] == pytest.approx(1 / 3)  # the CNS accuracy drops the excluded answer too
    cfg = json.loads((out / "config.json").read_text())["config"]
    proto = next(c for c in cfg["classifiers"] if c["name"] == "llava")["protocol"]
    assert proto["prompt"] == IMAGENET_D_PROMPT and proto["temperature"] == 0.2  # recorded, resolved
    assert proto["top_k"] == 50 and proto["distractors"] == "questions"
    llava = next(c for c in cfg["classifiers"] if c["name"] == "llava")
    assert llava["prompt_template"] == "original" and llava["dtype"] == "float16"  # ImageNet-D's protocol
    assert "vlm" in (out / "report" / "index.html").read_text().lower()
