"""A vlm classifier added to an existing build output (the reclassify path of ``cnsbench build``).

The vlm asks ImageNet-D's two-choice question, whose distractor comes from another
classifier's ranking: a classifier the output already has predictions of.  Adding the vlm
to the config and building again reads those predictions back from the shards and gives
the vlm's rows a fresh build with the vlm included gives.  (Tiny random-weight models:
one shard of one trajectory, local runner.)
"""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
import yaml
from buildproc import build_here, snapshot, tiny_config

from pipeline.labels import label_space
from pipeline.models.vqa_protocols import IMAGENET_D_PROMPT


def _small(raw: dict) -> None:
    raw["benchmark"].update(classes=["goldfish"], seeds=[1], shifts=["painting_style"], scales=[0, 1.0])
    raw["generator"]["steps"] = 5
    raw["classifiers"][2]["templates"] = ["a photo of a {c}."]  # the zero-shot head built fast


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> tuple:
    """The small tiny config with the vlm (listed last), a fresh build of it, and a build
    of the same config without the vlm."""
    from pipeline.demo.tiny_vlm import build_tiny_llava

    root = tmp_path_factory.mktemp("vlm-reclassify")
    names = label_space("imagenet")
    model = build_tiny_llava(root / "llava", [IMAGENET_D_PROMPT, *(names.name(i) for i in range(len(names)))], seed=1)
    without = tiny_config(root, _small, "without.yaml")
    raw = yaml.safe_load(without.read_text())
    raw["classifiers"].append({
        "name": "llava", "kind": "vlm", "model": str(model),
        "protocol": {"kind": "two_choice", "distractors": "tiny-clip-zs", "max_new_tokens": 3, "temperature": 1.0},
    })
    with_vlm = root / "with.yaml"
    with_vlm.write_text(yaml.safe_dump(raw))
    assert build_here(with_vlm, root / "fresh") == 0
    assert build_here(without, root / "without") == 0
    return with_vlm, snapshot(root / "fresh"), root / "without"


@pytest.mark.parametrize("budget", [None, 0.1], ids=["one-group", "a-group-each"])
def test_added_vlm_draws_distractors_from_the_stored_predictions(builds, tmp_path, capsys, budget):
    with_vlm, want, without = builds
    out = tmp_path / "out"
    shutil.copytree(without, out)
    assert "llava" not in set(snapshot(out)["predictions"]["classifier"])
    extra = ["--set", f"resources.classify.memory_budget_gb={budget}"] if budget else []
    capsys.readouterr()
    assert build_here(with_vlm, out, *extra) == 0
    text = capsys.readouterr().out
    assert "adding predictions of llava to 1 committed shard(s)" in text
    assert "1 already done, 0 to make" in text

    got = snapshot(out)
    assert got["images"] == want["images"]  # nothing regenerated
    vlm = want["predictions"][want["predictions"]["classifier"] == "llava"]
    assert len(vlm) == 2 and vlm["answer"].notna().all()
    pd.testing.assert_frame_equal(got["predictions"], want["predictions"], check_exact=False, rtol=1e-5)
