"""Background-complexity guidance: the objective by hand, prediction types, and the effect on the world model."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.families.object_edit import GAIN_COMPLEXITY, GAIN_SIMPLICITY
from pipeline.families.object_edit import geometry as G
from pipeline.families.object_edit.calibration import (
    amplitude_gradient,
    background_amplitude,
    fit_gain,
    original_change,
    original_steps,
)
from pipeline.families.object_edit.guidance import (
    DenoiseSettings,
    MaskedDenoiser,
    complexity_objective,
    fourier_amplitude,
    from_tensor,
    guidance_strength,
    high_frequency_energy,
    to_tensor,
)

REPO = Path(__file__).resolve().parents[1]
WORLD_SD = REPO / "assets" / "world" / "sd"
needs_world = pytest.mark.skipif(not (WORLD_SD / "model_index.json").is_file(), reason="assets/world not present")


def test_fourier_amplitude_by_hand():
    # A constant image has only the DC term: |F[0, 0]| = c * H * W, so the mean over the
    # H * W coefficients is c.
    x = torch.full((1, 3, 8, 8), 0.25)
    assert fourier_amplitude(x).item() == pytest.approx(0.25)
    # A unit impulse has |F| = 1 at every frequency.
    d = torch.zeros((1, 1, 4, 4))
    d[0, 0, 1, 2] = 1.0
    assert fourier_amplitude(d).item() == pytest.approx(1.0)
    # A checkerboard +-1 in [0, 1] terms: 0.5 + 0.5 * (-1)^(i+j) -> DC 0.5*16, Nyquist 0.5*16.
    i, j = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
    board = (0.5 + 0.5 * (-1.0) ** (i + j)).float()[None, None]
    assert fourier_amplitude(board).item() == pytest.approx((8.0 + 8.0) / 16.0)


def test_objective_per_pixel_count_and_the_lambda_mapping():
    x = torch.rand(2, 3, 8, 12, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(complexity_objective(x), fourier_amplitude(x) / 96)
    assert guidance_strength(20.0, 3.0, 0.5) == 60.0 and guidance_strength(-20.0, 3.0, 0.5) == -10.0
    assert guidance_strength(0.0, 3.0, 0.5) == 0.0


def test_the_originals_guidance_by_its_formulas():
    """Step sizes from guided diffusion's schedule; the amplitude gradient by hand; the change's sign."""
    steps = original_steps("identity")
    # 75 of 100 respaced steps run (25 skipped); the respaced betas telescope to abar of the first step run,
    # timestep round(74 * 999 / 99) = 747 of the 1000-step linear schedule.
    abar = np.cumprod(1 - np.linspace(1e-4, 0.02, 1000))
    assert len(steps) == 75 and np.prod(1 - 4 * steps) == pytest.approx(abar[747], rel=1e-9)
    assert len(original_steps("wiener")) == 74 and original_steps("wiener").sum() < steps.sum() < original_steps("fixed_eps").sum()
    # d mean|F| / du: numerically against finite differences on a small image.
    rng = np.random.default_rng(0)
    u = rng.random((3, 6, 6))
    g = amplitude_gradient(u)
    e = np.zeros_like(u)
    e[1, 2, 3] = 1e-6
    amp = lambda v: np.abs(np.fft.fft2(v, axes=(-2, -1))).mean()
    assert g[1, 2, 3] == pytest.approx((amp(u + e) - amp(u - e)) / 2e-6, rel=1e-4)
    img, mask = _ring_on_texture()
    up, down = original_change(img, mask, 20.0), original_change(img, mask, -20.0)  # at 256 px, as the original
    assert up > 0 > down and original_change(img, mask, 0.0, size=64) == 0.0
    ones = np.ones((4, 4))
    assert background_amplitude(np.ones((4, 4, 3)), ones) == pytest.approx(1.0)  # the DC term / 16 coefficients
    # The gain: log-linear between the bracketing strengths; a target beyond the plateau takes the plateau.
    assert fit_gain([10, 100], [0.1, 0.3], 0.2, 20) == (pytest.approx(np.sqrt(10 * 100) / 20), True)
    assert fit_gain([10, 100, 1000], [0.5, 0.78, 0.8], 0.9, 20) == (100 / 20, False)


def test_high_frequency_energy_of_flat_and_textured_regions():
    flat = np.full((16, 16, 3), 0.3, np.float32)
    assert high_frequency_energy(flat) == pytest.approx(0.0, abs=1e-12)
    tex = flat.copy()
    tex[::2] += 0.2
    region = np.zeros((16, 16), bool)
    region[:, :8] = True
    assert high_frequency_energy(tex, region) > 1e-3
    assert high_frequency_energy(tex, np.zeros((16, 16), bool)) == 0.0


class _StubUnet(torch.nn.Module):
    def __init__(self, value: torch.Tensor) -> None:
        super().__init__()
        self.value = value
        self.register_buffer("anchor", torch.zeros(1))

    def forward(self, x, t, encoder_hidden_states=None, return_dict=False):
        return (self.value.expand_as(x).clone(),)


class _StubPipe:
    def __init__(self, kind: str, value: torch.Tensor) -> None:
        from types import SimpleNamespace

        self.unet = _StubUnet(value)
        self.scheduler = SimpleNamespace(config=SimpleNamespace(prediction_type=kind))


@pytest.mark.parametrize("kind", ["v_prediction", "epsilon"])
def test_model_output_to_clean_image_and_noise(kind):
    """x0 and eps from either prediction type satisfy z = sqrt(abar) x0 + sqrt(1 - abar) eps."""
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(2, 4, 3, 3, generator=gen)
    out = torch.randn(1, 4, 3, 3, generator=gen)
    abar = torch.tensor(0.36)
    den = MaskedDenoiser(_StubPipe(kind, out), DenoiseSettings(guidance_scale=1.0))
    emb = torch.zeros(1, 2, 8)
    x0, eps = den._predict(z, torch.tensor(500), emb, emb, abar)
    assert torch.allclose(0.6 * x0 + 0.8 * eps, z, atol=1e-5)
    if kind == "epsilon":
        assert torch.allclose(eps, out.expand_as(z))
    else:  # v = sqrt(abar) eps - sqrt(1 - abar) x0
        assert torch.allclose(0.6 * eps - 0.8 * x0, out.expand_as(z), atol=1e-5)
    with pytest.raises(ValueError, match="prediction type"):
        MaskedDenoiser(_StubPipe("sample", out), DenoiseSettings(guidance_scale=1.0))._predict(z, 1, emb, emb, abar)


@pytest.fixture(scope="module")
def world_pipe():
    from pipeline.models.diffusion import load_pipeline

    pipe = load_pipeline(str(WORLD_SD), torch.float32, "cpu")
    neg, _ = pipe.encode_prompt("", "cpu", 1, True, negative_prompt="")
    return pipe, neg


def _ring_on_texture(size=32):
    yy, xx = np.mgrid[:size, :size]
    mask = (np.hypot(yy - 15, xx - 15) >= 6) & (np.hypot(yy - 15, xx - 15) <= 9)
    img = np.repeat((0.25 * (0.5 + 0.5 * np.sin(xx * 1.9) * np.sin(yy * 1.7)))[..., None], 3, -1).astype(np.float32)
    img[mask] = 0.9
    return img, mask


@needs_world
def test_guidance_raises_and_lowers_background_detail_and_keeps_the_object(world_pipe):
    pipe, uncond = world_pipe
    img, mask = _ring_on_texture()
    start = G.classical_fill(img, G.dilate(mask, 1))  # the object removed
    background = ~G.dilate(mask, 2)
    levels = [0.0, 5.0, 10.0, 20.0, -5.0, -10.0, -20.0]  # the paper's lambda, mapped by the calibrated gains
    n = len(levels)
    den = MaskedDenoiser(pipe, DenoiseSettings(steps=10, strength=0.6, guidance_scale=1.0))
    out = den.run(
        to_tensor([start] * n, 32),
        to_tensor([img] * n, 32),
        to_tensor([mask.astype(np.float32)] * n, 32, signed=False),
        [guidance_strength(lv, GAIN_COMPLEXITY, GAIN_SIMPLICITY) for lv in levels],
        (uncond, uncond),
        seed=1,
    )
    images = dict(zip(levels, from_tensor(out, 32)))
    hf = {lv: high_frequency_energy(a, background) for lv, a in images.items()}
    amp = {
        lv: float(fourier_amplitude(torch.from_numpy(a * background[..., None]).permute(2, 0, 1)[None]))
        for lv, a in images.items()
    }
    up, down = [0.0, 5.0, 10.0, 20.0], [0.0, -5.0, -10.0, -20.0]
    # Complexity: the guided objective rises with the level, and every level adds fine detail (toward the
    # plateau of lambda 20 the added structure coarsens, so the finest detail need not keep rising) ...
    assert all(amp[a] < amp[b] for a, b in itertools.pairwise(up)), amp
    assert all(hf[lv] > 2 * hf[0.0] for lv in up[1:]), hf
    # ... simplicity: they fall.
    assert all(hf[a] > hf[b] for a, b in itertools.pairwise(down)), hf
    assert all(amp[a] > amp[b] for a, b in itertools.pairwise(down)), amp
    # The calibration: lambda = +-20 changes the background's mean |FFT| about as the original's
    # formulas do (+88 % is beyond the loop's plateau, docs/imagenet_e.md; -1.7 %).
    bg = (~mask).astype(np.float64)
    base = background_amplitude(images[0.0], bg)
    assert 0.5 < (background_amplitude(images[20.0], bg) - base) / base < 1.0
    assert -0.03 < (background_amplitude(images[-20.0], bg) - base) / base < -0.005
    # The object is kept: mean absolute change inside its mask stays tiny.
    for a in images.values():
        assert float(np.abs(a - img)[mask].mean()) < 0.01
    assert den.unet_evals == 6 * n  # 10 steps x strength 0.6, no classifier-free guidance


@needs_world
def test_unguided_loop_is_inpainting_and_deterministic(world_pipe):
    pipe, uncond = world_pipe
    img, mask = _ring_on_texture()
    hole = np.zeros_like(mask)
    hole[2:10, 20:30] = True
    keep = (~hole).astype(np.float32)
    den = MaskedDenoiser(pipe, DenoiseSettings(steps=10, strength=0.6, guidance_scale=1.0))
    args = (to_tensor([img], 32), to_tensor([img], 32), to_tensor([keep], 32, signed=False), [0.0], (uncond, uncond))
    a = from_tensor(den.run(*args, seed=3), 32)[0]
    b = from_tensor(den.run(*args, seed=3), 32)[0]
    assert np.array_equal(a, b)
    assert np.abs(a - img)[~hole].max() < 1e-5  # known pixels untouched
    assert np.abs(a - img)[hole].mean() > 0.01  # the hole was regenerated
