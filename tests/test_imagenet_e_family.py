"""Family object_edit in process on a hand-made unit (classical fill: no model is loaded)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.config import load_config
from pipeline.families.base import BaseImage, UnitContext
from pipeline.families.object_edit import ObjectEditFamily
from pipeline.families.object_edit import geometry as G
from pipeline.sources.ink_masks import ink_mask

REPO = Path(__file__).resolve().parents[1]
SCALES = [0.0, 0.25, 0.5, 0.7, 1.0]


def _family(shifts=("size", "position", "rotation")):
    cfg = load_config(REPO / "configs" / "world_imagenet_e.yaml", {"benchmark": {"shifts": list(shifts)}})
    family = ObjectEditFamily(cfg, cfg.family_groups()[0])
    family.setup()
    assert family.sampler is None  # classical fill, no background shift: no model
    return family


def _digit(size=32):
    yy, xx = np.mgrid[:size, :size]
    r = np.hypot(yy - 15, xx - 14)
    ink = ((r >= 5) & (r <= 8)) | ((xx >= 19) & (xx <= 21) & (yy >= 10) & (yy <= 26))
    arr = np.zeros((size, size, 3), np.uint8)
    arr[ink] = 230
    return Image.fromarray(arr)


def test_geometry_shifts_record_their_physical_parameters():
    family = _family()
    img = _digit()
    ctx = UnitContext(3, "three", 1)
    ctx.set_base(BaseImage(img, ink_mask(img, 0.25)))
    out = family.generate(ctx, ["size", "position", "rotation"], SCALES)
    mask0 = ink_mask(img, 0.25)
    for shift, result in out.items():
        assert len(result.images) == len(SCALES) and result.unusable is None
        assert result.images[0] is img  # level 0: the unedited image itself
        assert [p["level"] for p in result.params] == SCALES
        assert all(p["attribute"] == shift for p in result.params)
    for p, im in zip(out["size"].params[1:], out["size"].images[1:]):
        assert abs(p["share"] - p["target_share"]) <= 0.015
        assert p["target_share"] == pytest.approx(0.15 - 0.1 * p["level"])
        # Visible in the image: ink above half the object's grey (alpha >= 0.5, the layer's mask).
        assert abs(G.area_share(ink_mask(im, 0.45)) - p["target_share"]) <= 0.015
    moves = [(p["dy"], p["dx"]) for p in out["position"].params[1:]]
    for (dy, dx), p, im in zip(moves, out["position"].params[1:], out["position"].images[1:]):
        assert p["fits"] and math.hypot(dy, dx) == pytest.approx(p["requested_px"], abs=1.0)
        assert p["requested_px"] == pytest.approx(0.25 * 32 * p["level"])
        moved = np.subtract(G.centroid(ink_mask(im, 0.25)), G.centroid(mask0))
        assert moved == pytest.approx((dy, dx), abs=1.0)
    # One direction for the whole trajectory.
    far = np.asarray(moves[-1], float)
    for (dy, dx), level in zip(moves, SCALES[1:]):
        assert np.abs(np.asarray((dy, dx)) - level * far).max() <= 1.0  # whole-pixel rounding only
    assert [p["degrees"] for p in out["rotation"].params[1:]] == pytest.approx([22.5, 45.0, 63.0, 90.0])
    # Edits are deterministic.
    again = family.generate(ctx, ["position"], SCALES)["position"]
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(again.images, out["position"].images))


def test_a_unit_without_an_object_is_unusable_not_failed():
    family = _family(("size",))
    img = Image.new("RGB", (32, 32))
    ctx = UnitContext(3, "three", 1)
    ctx.set_base(BaseImage(img, ink_mask(img, 0.25)))
    result = family.generate(ctx, ["size"], SCALES)["size"]
    assert result.unusable and "min_mask_share" in result.unusable
    assert len(result.images) == len(SCALES)


@pytest.mark.skipif(not (REPO / "assets" / "world" / "sd" / "model_index.json").is_file(), reason="assets/world not present")
def test_diffusion_fill_and_background_guidance_with_the_world_model():
    import torch

    overrides = {
        "benchmark": {"shifts": ["size", "background_complexity"], "scales": [0, 1.0]},
        "generator": {"options": {"fill": {"kind": "diffusion", "dilation": 2, "steps": 10, "strength": 0.6}}},
    }
    cfg = load_config(REPO / "configs" / "world_imagenet_e.yaml", overrides)
    family = ObjectEditFamily(cfg, cfg.family_groups()[0], "cpu", torch.float32)
    family.setup()
    assert family.sampler is not None
    img = _digit()
    mask = ink_mask(img, 0.25)
    ctx = UnitContext(3, "three", 1)
    ctx.set_base(BaseImage(img, mask))
    out = family.generate(ctx, ["size", "background_complexity"], [0.0, 1.0])
    size_p = out["size"].params[1]
    assert size_p["fill"] == "diffusion" and size_p["uncovered_share"] > 0
    assert abs(size_p["share"] - 0.05) <= 0.015
    bg_p = out["background_complexity"].params[1]
    gain = cfg.family_groups()[0].options.background.gain_complexity
    assert bg_p["lambda"] == 20.0 and bg_p["strength"] == pytest.approx(20.0 * gain)  # the paper's lambda, mapped
    assert bg_p["hf_after"] > bg_p["hf_before"]
    # The object's own pixels are kept exactly by the background edit.
    edited = np.asarray(out["background_complexity"].images[1])
    assert np.array_equal(edited[mask], np.asarray(img)[mask])
    assert out["size"].unet_evals > 0
    # rerender_background: the whole background of a geometry edit passes through the loop (as the
    # original's), not only the uncovered region.
    overrides["benchmark"]["shifts"] = ["rotation"]
    overrides["generator"]["options"]["fill"]["rerender_background"] = True
    cfg = load_config(REPO / "configs" / "world_imagenet_e.yaml", overrides)
    family = ObjectEditFamily(cfg, cfg.family_groups()[0], "cpu", torch.float32)
    family.setup()
    out = family.generate(ctx, ["rotation"], [0.0, 1.0])["rotation"]
    assert out.params[1]["fill"] == "rerender"
    far = ~G.dilate(mask | np.asarray(ink_mask(out.images[1], 0.25)), 3)  # away from the old and the turned object
    changed = np.abs(np.asarray(out.images[1], float) - np.asarray(img, float)).max(-1)
    assert (changed[far] > 0).mean() > 0.5  # the classical fill would leave these pixels as they were
