"""Geometry edits of object_edit against hand-computed cases and direct transforms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from pipeline.families.object_edit import ObjectEditOptions, level_of, physical
from pipeline.families.object_edit import geometry as G


def _ellipse(h=64, w=64, cy=30.0, cx=26.0, ry=14.0, rx=8.0):
    yy, xx = np.mgrid[:h, :w]
    return ((yy - cy) ** 2 / ry**2 + (xx - cx) ** 2 / rx**2) <= 1.0


def _digit_like(size=32):
    """A ring with a bar: thin strokes, like the world's digits (ink on black)."""
    yy, xx = np.mgrid[:size, :size]
    r = np.hypot(yy - 14, xx - 15)
    return ((r >= 6) & (r <= 9)) | ((xx >= 20) & (xx <= 22) & (yy >= 10) & (yy <= 27))


def _image(mask, seed=0):
    rng = np.random.default_rng(seed)
    img = rng.uniform(0.0, 0.2, mask.shape + (3,)).astype(np.float32)
    img[mask] = [0.9, 0.8, 0.7]
    return img


def test_measures_by_hand():
    m = np.zeros((10, 10), bool)
    m[2:4, 3:8] = True  # 2 x 5 = 10 pixels
    assert G.area_share(m) == pytest.approx(0.10)
    assert G.centroid(m) == pytest.approx((2.5, 5.0))
    assert G.bbox(m) == (2, 3, 4, 8)
    assert G.iou(m, m) == 1.0
    with pytest.raises(ValueError, match="empty"):
        G.centroid(np.zeros((4, 4), bool))


@pytest.mark.parametrize("mask_fn", [_ellipse, _digit_like], ids=["ellipse", "strokes"])
@pytest.mark.parametrize("target", [0.15, 0.1, 0.08, 0.05, 0.03])
def test_size_reaches_the_target_share_within_tolerance(mask_fn, target):
    mask = mask_fn()
    layer = G.scale_to_share(_image(mask), mask, target)
    assert abs(G.area_share(layer.mask) - target) <= 0.015
    assert layer.info["reached"] and layer.info["target_share"] == target
    assert layer.info["share"] == pytest.approx(G.area_share(layer.mask))
    # Scaled about the centroid: the object stays where it was.
    assert np.allclose(G.centroid(layer.mask), G.centroid(mask), atol=1.0)


def test_size_target_outside_the_open_unit_interval_is_refused():
    mask = _ellipse()
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="target area share"):
            G.scale_to_share(_image(mask), mask, bad)


@pytest.mark.parametrize("dy,dx", [(5, -7), (-9, 0), (0, 12), (11, 3)])
def test_translation_moves_the_centroid_by_the_offset(dy, dx):
    mask = _ellipse()
    img = _image(mask)
    layer = G.translate_object(img, mask, dy, dx)
    moved = np.subtract(G.centroid(layer.mask), G.centroid(mask))
    assert moved == pytest.approx((dy, dx), abs=1.0)
    # The object's own pixels travel with it.
    assert np.allclose(layer.pixels[layer.mask], img[mask])


@pytest.mark.parametrize("distance", [4.0, 8.0, 12.5])
def test_offset_for_a_requested_distance(distance):
    mask = _ellipse()
    dy, dx, _angle, fits = G.offset_for(mask, distance, angle=0.3)
    assert fits and G.feasible_offset(mask, dy, dx)
    layer = G.translate_object(_image(mask), mask, dy, dx)
    moved = math.hypot(*np.subtract(G.centroid(layer.mask), G.centroid(mask)))
    assert moved == pytest.approx(distance, abs=1.0)


def test_offset_that_cannot_fit_is_flagged():
    mask = _ellipse(ry=28, rx=28, cy=32, cx=32)
    dy, dx, _, fits = G.offset_for(mask, 20.0, angle=0.0)
    assert not fits and G.feasible_offset(mask, dy, dx)


@pytest.mark.parametrize("degrees", [10, 30, 45, 90, -60, 180])
@pytest.mark.parametrize("about", ["image_center", "object_center"])
def test_rotated_mask_matches_a_direct_rotation(degrees, about):
    mask = _ellipse()
    layer = G.rotate_object(_image(mask), mask, degrees, about)
    cy, cx = G.rotation_center(mask, about)
    # PIL rotates counter-clockwise about `center` (x, y) in pixel-corner coordinates:
    # pixel index i has its centre at i + 0.5.
    direct = Image.fromarray(mask.astype(np.uint8) * 255).rotate(
        degrees, resample=Image.BILINEAR, center=(cx + 0.5, cy + 0.5)
    )
    assert G.iou(layer.mask, np.asarray(direct) >= 128) >= 0.99


def test_physical_mapping_and_its_inverse():
    opts = ObjectEditOptions()
    # The published ImageNet-E levels lie on the default grid.
    assert physical("size", 0.5, opts)["target_share"] == pytest.approx(0.10)
    assert physical("size", 0.7, opts)["target_share"] == pytest.approx(0.08)
    assert physical("size", 1.0, opts)["target_share"] == pytest.approx(0.05)
    assert physical("background_complexity", 1.0, opts)["lambda"] == pytest.approx(20.0)
    assert physical("background_simplicity", 1.0, opts)["lambda"] == pytest.approx(-20.0)
    assert physical("rotation", 0.5, opts)["degrees"] == pytest.approx(45.0)
    assert physical("position", 1.0, opts)["offset"] == pytest.approx(0.25)
    for attr in ("size", "position", "rotation", "background_complexity", "background_simplicity"):
        for level in (0.25, 0.7, 1.0):
            value = next(iter(physical(attr, level, opts).values()))
            assert level_of(attr, value, opts) == pytest.approx(level)


def test_classical_fill_fills_the_hole_from_its_surroundings():
    img = np.zeros((24, 24, 3), np.float32)
    img[:, :12] = 0.2
    img[:, 12:] = 0.6
    hole = np.zeros((24, 24), bool)
    hole[8:16, 2:6] = True  # inside the left half
    img[hole] = 1.0
    out = G.classical_fill(img, hole)
    assert np.allclose(out[~hole], img[~hole])
    assert np.allclose(out[hole], 0.2, atol=0.02)
