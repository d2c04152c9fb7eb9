"""XIMAGENET-12 scenarios: identity at strength 0, untouched regions, published parameters at 1."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.families.masked_scenario import imageops, scenarios
from pipeline.families.masked_scenario.scenarios import SCENARIOS, apply, draws_for


def _image(seed: int = 0, size: int = 40) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    mask = np.zeros((size, size), dtype=bool)
    mask[10:28, 12:30] = True
    return img, mask


def _draws(name: str, img: np.ndarray, seed: int = 1) -> dict:
    d = draws_for(name, np.random.default_rng(seed))
    if name == "random_background":
        d["background"] = np.random.default_rng(99).integers(0, 256, img.shape, dtype=np.uint8)
    return d


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_strength_zero_is_the_original(name):
    img, mask = _image()
    out = apply(name, img, mask, 0.0, _draws(name, img))
    assert np.array_equal(out[..., :3], img)
    if out.shape[2] == 4:  # transparent: fully opaque at 0
        assert (out[..., 3] == 255).all()


BACKGROUND_ONLY = [n for n, s in SCENARIOS.items() if s.region == "background"]
OBJECT_ONLY = [n for n, s in SCENARIOS.items() if s.region == "object"]


@pytest.mark.parametrize("strength", [0.3, 0.5, 1.0])
@pytest.mark.parametrize("name", BACKGROUND_ONLY)
def test_background_scenarios_keep_object_pixels(name, strength):
    img, mask = _image(1)
    out = apply(name, img, mask, strength, _draws(name, img))
    assert np.array_equal(out[mask][:, :3], img[mask])
    assert not np.array_equal(out[~mask][:, :3], img[~mask]) or name == "transparent_image"


@pytest.mark.parametrize("strength", [0.3, 1.0])
@pytest.mark.parametrize("name", OBJECT_ONLY)
def test_object_scenarios_keep_the_background(name, strength):
    img, mask = _image(2)
    out = apply(name, img, mask, strength, _draws(name, img))
    assert np.array_equal(out[~mask], img[~mask])
    assert not np.array_equal(out[mask], img[mask])


def test_random_background_paste_mode_keeps_the_object_and_add_mode_is_the_published_blend():
    img, mask = _image(3)
    d = _draws("random_background", img)
    bg = d["background"]
    paste = apply("random_background", img, mask, 1.0, d, {"random_background_mode": "paste"})
    assert np.array_equal(paste[mask], img[mask]) and np.array_equal(paste[~mask], bg[~mask])
    # addWeighted(background, 1, segmented, 1, 0): object pixels saturate(I + B), background B.
    add = apply("random_background", img, mask, 1.0, d)
    want = np.clip(img.astype(int) + bg.astype(int), 0, 255).astype(np.uint8)
    assert np.array_equal(add[mask], want[mask]) and np.array_equal(add[~mask], bg[~mask])
    # by hand: I = 200, B = 100 -> 255 under the object; half strength: 0.5*200 + 0.5*100 outside.
    one = np.full((4, 4, 3), 200, np.uint8)
    m = np.zeros((4, 4), bool)
    m[:2] = True
    half = apply("random_background", one, m, 0.5, {"background": np.full((4, 4, 3), 100, np.uint8)})
    assert half[0, 0, 0] == 250 and half[3, 3, 0] == 150


def test_gaussian_kernel_is_opencvs_and_blur_uses_the_published_15x15_sigma3():
    k = imageops.gaussian_kernel(15, 3.0)
    x = np.arange(15) - 7
    want = np.exp(-(x**2) / 18.0)
    assert np.allclose(k, want / want.sum())
    # by hand: 1 / sum_{x=-7..7} exp(-x^2 / 18) = 0.13460 (truncated kernel, above the continuous 0.13298)
    assert abs(k[7] - 0.13460) < 1e-5
    img, mask = _image(4)
    out = apply("blur_background", img, mask, 1.0, {})
    blurred = imageops.gaussian_blur(img, 15, 3.0)
    assert np.array_equal(out[~mask], blurred[~mask])
    # A constant image stays constant under the blur (normalised kernel, reflect-101 border).
    flat = np.full((20, 20, 3), 77, np.uint8)
    assert (imageops.gaussian_blur(flat, 15, 3.0) == 77).all()
    # Reflect-101 border by hand on a 1-row ramp with a 3-tap kernel [0.25, 0.5, 0.25]:
    # (sigma = 1 / sqrt(2 ln 2) makes the 3-tap kernel exactly [1/4, 1/2, 1/4]; border 40|0 40 80 120|80)
    ramp = np.array([[[0] * 3, [40] * 3, [80] * 3, [120] * 3]], np.uint8).repeat(3, axis=0)
    assert np.allclose(imageops.gaussian_kernel(3, 1 / np.sqrt(2 * np.log(2))), [0.25, 0.5, 0.25])
    out = imageops.gaussian_blur(ramp, 3, 1 / np.sqrt(2 * np.log(2)))
    assert out[1, :, 0].tolist() == [20, 40, 80, 100]


def test_overexposure_is_the_published_unsharp_mask_at_strength_one():
    img, mask = _image(5)
    out = apply("bright_background", img, mask, 1.0, {})
    blur = imageops.gaussian_blur(img, 9, 4.0)  # the script passes cv2.BORDER_DEFAULT (4) as sigma
    want = np.clip(np.rint(1.5 * img.astype(float) + 0.9 * blur.astype(float) + 1.9), 0, 255).astype(np.uint8)
    assert np.array_equal(out[~mask], want[~mask])
    assert np.array_equal(out[mask], img[mask])


def test_hsv_matches_opencv_conventions():
    rgb = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0], [128, 128, 128], [0, 0, 0]]], np.uint8)
    hsv = imageops.rgb_to_hsv(rgb)
    assert hsv[0, :, 0].tolist()[:4] == [0, 60, 120, 30]  # OpenCV hue = degrees / 2
    assert hsv[0, 4].tolist() == [0, 0, 128] and hsv[0, 5].tolist() == [0, 0, 0]
    img, _ = _image(6)
    back = imageops.hsv_to_rgb(imageops.rgb_to_hsv(img))
    assert np.abs(back.astype(int) - img.astype(int)).max() <= 5  # 8-bit hue is quantised in 2-degree steps, as in OpenCV


@pytest.mark.parametrize("name", ["image_r", "image_g", "image_b"])
def test_colour_scenarios_draw_from_the_published_hue_ranges(name):
    ranges = scenarios.HUE_RANGES[name]
    hues = [draws_for(name, np.random.default_rng(s))["hue"] for s in range(300)]
    assert all(any(lo <= h <= hi for lo, hi in ranges) for h in hues)
    if name == "image_r":  # both halves of the red range are used
        assert any(h <= 29 for h in hues) and any(h >= 150 for h in hues)
    img, mask = _image(7)
    d = {"hue": 100}
    out = apply(name, img, mask, 1.0, d)
    hsv = imageops.rgb_to_hsv(out)
    sat = imageops.rgb_to_hsv(img)[..., 1] > 60
    sel = ~mask & sat
    assert np.abs(hsv[sel][:, 0].astype(int) - 100).max() <= 2


def test_rainbow_grey_segmented_transparent_at_strength_one():
    img, mask = _image(8)
    d = draws_for("image_rainbow", np.random.default_rng(3))
    assert 0 <= d["hue_shift"] <= 90
    out = apply("image_rainbow", img, mask, 1.0, d)
    assert np.array_equal(out[~mask], imageops.shift_hue(img, d["hue_shift"])[~mask])
    grey = apply("image_grey", img, mask, 1.0, {})
    g = img.astype(float) @ np.array([0.299, 0.587, 0.114])
    assert np.abs(grey[~mask][:, 0].astype(float) - g[~mask]).max() <= 0.5 + 1e-9
    assert (grey[~mask][:, 0] == grey[~mask][:, 2]).all()
    seg = apply("segmented_image", img, mask, 1.0, {})
    assert (seg[~mask] == 0).all()
    half = apply("segmented_image", img, mask, 0.5, {})
    assert np.abs(half[~mask].astype(float) - img[~mask] * 0.5).max() <= 0.5 + 1e-9
    tr = apply("transparent_image", img, mask, 1.0, {})
    assert tr.shape[2] == 4 and (tr[~mask][:, 3] == 0).all() and (tr[mask][:, 3] == 255).all()
    assert np.array_equal(tr[..., :3], img)


def test_rainbow_hue_wraps_in_uint8_before_the_modulo_as_the_script():
    # Color_image.py: turn_hsv[:, :, 0] = (turn_hsv[:, :, 0] + hues) % 180 on a uint8 array.
    hues = np.array([0, 80, 100, 170, 179], dtype=np.uint8)
    script = (hues + np.uint8(90)) % 180  # numpy keeps uint8: 170 + 90 = 260 -> 4
    assert script.tolist() == [90, 170, 10, 4, 13]
    hsv = np.stack([hues, np.full(5, 200, np.uint8), np.full(5, 200, np.uint8)], -1)[None]
    img = imageops.hsv_to_rgb(hsv)
    got = imageops.rgb_to_hsv(imageops.shift_hue(img, 90))[0, :, 0].astype(int)
    assert np.abs(got - script.astype(int)).max() <= 1  # one unit of HSV round trip
    assert abs(int(got[3]) - 80) > 60  # a plain rotation would give 80


def test_bad_strength_and_unknown_scenario_are_errors():
    img, mask = _image()
    with pytest.raises(ValueError, match="strength must be in"):
        apply("blur_object", img, mask, 1.5, {})
    with pytest.raises(KeyError, match="unknown scenario 'blurr'"):
        apply("blurr", img, mask, 1.0, {})
