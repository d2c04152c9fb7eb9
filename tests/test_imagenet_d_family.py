"""Family ``prompt_nuisance`` on the world's text-to-image model (in process, few steps).

The batched unit (plain prompt + every nuisance as branches of the same UNet calls) must
give the images of one plain diffusers call per image with that image's prompt.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.config import load_config
from pipeline.families.base import UnitContext
from pipeline.families.prompt_nuisance import PromptNuisanceFamily

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "world_imagenet_d.yaml"
STEPS = 6


def arr(img) -> np.ndarray:
    return np.asarray(img, dtype=np.int16)


@pytest.fixture(scope="module")
def family():
    cfg = load_config(CONFIG, {"generator": {"steps": STEPS, "branch_batch_size": 2}})
    fam = PromptNuisanceFamily(cfg, cfg.family_groups()[0], "cpu", torch.float32)
    fam.setup()
    return fam


def test_unit_matches_one_pipeline_call_per_image(family):
    shifts = ["thick_strokes", "rotation", "blur"]
    ctx = UnitContext(3, "three", 5)
    made = family.generate(ctx, shifts, [0.0, 1.0])
    sampler = family.sampler
    # Plain image once, shared by every trajectory and handed to the unit's context.
    plain = made["rotation"].images[0]
    assert all(made[s].images[0] is plain for s in shifts) and ctx.base().image is plain
    # 4 branches (plain + 3 nuisances) x STEPS steps x 2 (CFG), in chunks of 2 rows.
    assert sum(m.unet_evals for m in made.values()) == pytest.approx(4 * STEPS * 2)
    assert np.abs(arr(plain) - arr(sampler.reference_image(3, 5, None, 0.0))).max() <= 2
    for shift in shifts:
        ref = arr(sampler.reference_image(3, 5, shift, 1.0))
        assert np.abs(arr(made[shift].images[1]) - ref).max() <= 2, shift
    assert np.abs(arr(made["rotation"].images[1]) - arr(plain)).mean() > 1.0  # the nuisance changes the image


def test_params_record_kind_nuisance_and_prompt(family):
    made = family.generate(UnitContext(7, "seven", 2), ["rotation"], [0.0, 1.0])
    p0, p1 = made["rotation"].params
    token = family.sampler.tokens[7]
    assert p0 == {"kind": "pose", "nuisance": "rotation", "prompt": f"a picture of a {token}"}
    assert p1 == {"kind": "pose", "nuisance": "rotation", "prompt": f"a picture of a {token}, in rotation"}
    json.dumps(made["rotation"].params)  # JSON-able, as the schema stores it
