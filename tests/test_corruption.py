"""Family ``corruption``: the ImageNet-C corruptions at continuous severity.

Every corruption: identity at s = 0, deterministic for a seed, distance to the clean
image rising with s; at integer severities equal to the per-image reference of the
published formula (tests/corruption_reference.py) given the same random draws.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.families.corruption import corrupt, describe
from pipeline.families.corruption import params as P
from pipeline.families.corruption.ops import Fields

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corruption_reference as ref

REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def photo(size: int = 48, seed: int = 0) -> np.ndarray:
    """A smooth colourful test image (HxWx3 in [0, 1]) with edges, 8-bit levels."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    img = np.stack([0.5 + 0.4 * np.sin(6 * xx + 1), 0.5 + 0.4 * np.cos(5 * yy), 0.3 + 0.5 * xx * yy], -1)
    img[size // 4 : size // 2, size // 3 : 2 * size // 3] = [0.9, 0.2, 0.1]
    img += rng.normal(0, 0.02, img.shape)
    return np.round(np.clip(img, 0, 1) * 255) / 255


def as_batch(img: np.ndarray, n: int = 1) -> torch.Tensor:
    return torch.from_numpy(img).float().permute(2, 0, 1).unsqueeze(0).expand(n, -1, -1, -1).contiguous()


def as_image(t: torch.Tensor) -> np.ndarray:
    return t.permute(1, 2, 0).double().numpy()


def run(name: str, img: np.ndarray, severities, seed: int = 7) -> torch.Tensor:
    f = Fields(seed)
    return corrupt(name, as_batch(img, len(severities)), list(severities), [f] * len(severities))


# --------------------------------------------------------------------------- tables
def test_tables_have_five_rows_and_interpolate_linearly():
    assert len(P.ALL) == 19 and len(P.BENCHMARK) == 15 and set(P.EXTRA) == {"speckle_noise", "gaussian_blur", "spatter", "saturate"}
    assert all(len(rows) == 5 for rows in P.TABLES.values())
    assert P.params_at("gaussian_noise", 3) == (0.18,)
    assert P.params_at("gaussian_noise", 2.5) == pytest.approx((0.15,))
    assert P.params_at("defocus_blur", 1.25) == pytest.approx((3.25, 0.2))
    assert P.params_at("snow", 4) == (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65)
    st = P.severity_plan("contrast", 0.25)
    assert (st.lo, st.hi, st.weight) == (0.0, 1.0, 0.25)
    st = P.severity_plan("glass_blur", 3.5)
    assert (st.lo, st.hi, st.weight) == (3.0, 4.0, 0.5)
    st = P.severity_plan("contrast", 3.5)
    assert (st.lo, st.hi, st.weight) == (3.5, 3.5, 1.0)
    with pytest.raises(ValueError, match="severity must be in"):
        P.severity_plan("fog", 5.5)
    assert describe("pixelate", 2.5) == {"corruption": "pixelate", "severity": 2.5, "table": [0.45]}
    assert describe("spatter", 0.5)["blend"] == {"lo": 0.0, "hi": 1.0, "weight": 0.5}


# --------------------------------------------------------------------------- every corruption
@pytest.mark.parametrize("name", P.ALL)
def test_identity_determinism_and_blend(name):
    img = photo(40)
    sev = [0.0, 0.5, 1.0, 2.0, 5.0]
    a = run(name, img, sev)
    assert a.shape == (5, 3, 40, 40) and a.min() >= 0 and a.max() <= 1
    assert torch.equal(a[0], as_batch(img)[0])  # s = 0: the input unchanged
    assert torch.equal(a, run(name, img, sev))  # deterministic for a seed
    # 0 < s < 1 blends the input with severity 1 (same fields at every severity)
    assert torch.allclose(a[1], 0.5 * as_batch(img)[0] + 0.5 * a[2], atol=1e-6)
    # the batch of severities equals severities one by one
    assert torch.allclose(run(name, img, [2.0])[0], a[3], atol=1e-6)
    assert (a[4] - a[0]).abs().mean() > 1e-3  # severity 5 changes the image
    if name not in ("defocus_blur", "gaussian_blur", "zoom_blur", "contrast", "brightness", "saturate", "pixelate", "jpeg_compression"):
        assert not torch.equal(run(name, img, [3.0], seed=1), run(name, img, [3.0], seed=2))  # random fields


NOT_MONOTONE = ("saturate", "snow", "elastic_transform", "spatter", "frost", "glass_blur", "fog")
MONOTONE = [n for n in P.ALL if n not in NOT_MONOTONE]


@pytest.mark.parametrize("name", MONOTONE)
def test_distance_to_clean_rises_with_severity(name):
    img = photo(96)
    sev = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0]
    y = run(name, img, sev)
    d = (y - as_batch(img)).abs().mean(dim=(1, 2, 3)).numpy()
    assert d[0] == 0 and d[-1] > d[1] > 0
    assert np.all(np.diff(d) >= -2e-3), dict(zip(sev, d.round(4)))


def test_non_monotone_tables_still_move_away_from_clean():
    # saturate's table desaturates (1, 2) then saturates (3..5); fog's severities 3 and 4
    # differ only in the plasma's roughness; the others change layout with severity.  Every
    # one is farther from the clean image at 5 than at 0.5 -- but elastic: the release's
    # severities 1-2 shear by up to 49 px, 3-5 by 5 px.
    img = photo(48)
    for name in ("saturate", "snow", "spatter", "frost", "glass_blur", "fog"):
        y = run(name, img, [0.5, 5.0])
        d = (y - as_batch(img, 2)).abs().mean(dim=(1, 2, 3))
        assert d[1] > d[0] > 0, name


# --------------------------------------------------------------------------- reference equality
def fields_np(seed: int, kind: str, name: str, shape) -> np.ndarray:
    return getattr(Fields(seed), kind)(name, shape).numpy()


SEVERITIES = [1, 2, 3, 4, 5]


def close(a: torch.Tensor, b: np.ndarray, atol: float, mean_tol: float | None = None) -> None:
    diff = np.abs(as_image(a) - b)
    if mean_tol is None:
        assert diff.max() <= atol, f"max abs diff {diff.max():.5f}"
    else:
        assert diff.mean() <= mean_tol and diff.max() <= atol, f"mean {diff.mean():.5f} max {diff.max():.5f}"


@pytest.mark.parametrize("s", SEVERITIES)
def test_noise_equals_reference(s):
    img = photo(40)
    h = w = 40
    noise = fields_np(7, "normal", "noise", (3, h, w)).transpose(1, 2, 0)
    (c,) = P.TABLES["gaussian_noise"][s - 1]
    close(run("gaussian_noise", img, [s])[0], ref.gaussian_noise(img, c, noise), 1e-5)
    (c,) = P.TABLES["speckle_noise"][s - 1]
    close(run("speckle_noise", img, [s])[0], ref.speckle_noise(img, c, noise), 1e-5)
    (c,) = P.TABLES["impulse_noise"][s - 1]
    flip = fields_np(7, "uniform", "flip", (3, h, w)).transpose(1, 2, 0)
    salt = fields_np(7, "uniform", "salt", (3, h, w)).transpose(1, 2, 0)
    close(run("impulse_noise", img, [s])[0], ref.impulse_noise(img, c, flip, salt), 1e-6)


def test_shot_noise_is_poisson_at_every_severity():
    # One uniform field, inverse CDF: mean and variance of counts match Poisson(x c).
    from pipeline.families.corruption.noise_blur import poisson_from_uniform

    u = torch.rand(200_000, generator=torch.Generator().manual_seed(0))
    for lam in (0.4, 3.0, 12.0, 60.0):
        k = poisson_from_uniform(torch.full_like(u, lam), u)
        assert abs(float(k.mean()) - lam) < 0.03 * lam + 0.01
        assert abs(float(k.var()) - lam) < 0.05 * lam + 0.01
    # the 8-bit table look-up used by shot_noise equals the inverse-CDF loop
    from pipeline.families.corruption.noise_blur import _poisson_levels

    x = torch.round(torch.rand((2, 3, 16, 16), generator=torch.Generator().manual_seed(1)) * 255) / 255
    uu = torch.rand(x.shape, generator=torch.Generator().manual_seed(2))
    for row, c in enumerate((60.0, 3.0)):
        want = poisson_from_uniform(x[row] * c, uu[row])
        got = _poisson_levels(x, [60.0, 3.0], uu)[row]
        assert (got != want).float().mean() < 1e-3  # equal but for float32 rounding at CDF steps
    # coupled across rates: a larger rate never gives fewer counts for the same draw
    small = poisson_from_uniform(torch.full_like(u, 5.0), u)
    large = poisson_from_uniform(torch.full_like(u, 12.0), u)
    assert bool((large >= small).all())


@pytest.mark.parametrize("s", SEVERITIES)
def test_blurs_equal_reference(s):
    img = photo(48)
    (sigma,) = P.TABLES["gaussian_blur"][s - 1]
    close(run("gaussian_blur", img, [s])[0], ref.gaussian_blur(img, sigma), 1e-5)
    r, ab = P.TABLES["defocus_blur"][s - 1]
    close(run("defocus_blur", img, [s])[0], ref.defocus_blur(img, r, ab), 1e-5)
    stop, step = P.TABLES["zoom_blur"][s - 1]
    close(run("zoom_blur", img, [s])[0], ref.zoom_blur(img, stop, step), 1e-5)
    radius, sig = P.TABLES["motion_blur"][s - 1]
    angle = float(fields_np(7, "uniform", "angle", (1,))[0]) * 90 - 45
    close(run("motion_blur", img, [s])[0], ref.motion_blur(img, radius, sig, angle), 1e-5)


@pytest.mark.parametrize("s", SEVERITIES)
def test_glass_blur_equals_reference(s):
    img = photo(32)
    sigma, delta, it = P.TABLES["glass_blur"][s - 1]
    u = fields_np(7, "uniform", "glass", (3, 32, 32, 2))
    draws = np.floor(u * 2 * delta).astype(np.int64) - delta
    # float32 vs float64 blurs may differ by one 8-bit level before the shuffle
    close(run("glass_blur", img, [s])[0], ref.glass_blur(img, sigma, delta, it, draws), 5e-3, mean_tol=2e-4)


@pytest.mark.parametrize("s", SEVERITIES)
def test_digital_equal_reference(s):
    img = photo(48)
    (c,) = P.TABLES["contrast"][s - 1]
    close(run("contrast", img, [s])[0], ref.contrast(img, c), 1e-5)
    (c,) = P.TABLES["brightness"][s - 1]
    close(run("brightness", img, [s])[0], ref.brightness(img, c), 1e-5)
    a, b = P.TABLES["saturate"][s - 1]
    close(run("saturate", img, [s])[0], ref.saturate(img, a, b), 1e-5)
    (c,) = P.TABLES["pixelate"][s - 1]
    close(run("pixelate", img, [s])[0], ref.pixelate(img, c), 2.5 / 255, mean_tol=0.5 / 255)
    (q,) = P.TABLES["jpeg_compression"][s - 1]
    close(run("jpeg_compression", img, [s])[0], ref.jpeg_compression(img, q), 6 / 255, mean_tol=1 / 255)


@pytest.mark.parametrize("s", SEVERITIES)
def test_elastic_and_fog_equal_reference(s):
    img = photo(48)
    alpha, sigma, jitter = P.TABLES["elastic_transform"][s - 1]
    ua = fields_np(7, "uniform", "affine", (3, 2))
    udx = fields_np(7, "uniform", "dx", (1, 1, 48, 48))[0, 0]
    udy = fields_np(7, "uniform", "dy", (1, 1, 48, 48))[0, 0]
    close(run("elastic_transform", img, [s])[0], ref.elastic_transform(img, alpha, sigma, jitter, ua, udx, udy), 2e-4)


def test_fog_matches_reference_in_distribution():
    # The release draws the plasma's uniforms from np.random; same formula, other draws:
    # compare the statistics of the fogged image, not pixels.
    img = photo(48)
    c, decay = P.TABLES["fog"][2]
    rng = np.random.default_rng(0)
    ref_means = [ref.fog(img, c, decay, rng).mean() for _ in range(20)]
    ours = [float(run("fog", img, [3], seed=k)[0].mean()) for k in range(20)]
    assert abs(np.mean(ours) - np.mean(ref_means)) < 0.02


# --------------------------------------------------------------------------- the family
def test_family_generates_trajectories_with_params(tmp_path):
    from PIL import Image

    from pipeline.config import load_config
    from pipeline.families.base import BaseImage, UnitContext
    from pipeline.families.corruption import CorruptionFamily

    cfg = load_config(REPO / "configs" / "world_corruptions.yaml")
    group = next(g for g in cfg.family_groups() if g.kind == "corruption")
    fam = CorruptionFamily(cfg, group)
    fam.setup()
    base = Image.fromarray(np.uint8(photo(32) * 255))
    ctx = UnitContext(3, "three", 1)
    ctx.set_base(BaseImage(image=base, info={"source": "seed"}))
    scales = [0.0, 1.0, 2.5, 5.0]
    out = fam.generate(ctx, ["gaussian_noise", "pixelate"], scales)
    again = fam.generate(ctx, ["gaussian_noise"], scales)
    noise = out["gaussian_noise"]
    assert noise.images[0] is base  # s = 0 is the input itself
    assert [im.size for im in noise.images] == [(32, 32)] * 4
    assert np.array_equal(np.asarray(noise.images[3]), np.asarray(again["gaussian_noise"].images[3]))
    assert noise.params[2] == {"source": "seed", "corruption": "gaussian_noise", "severity": 2.5, "table": [0.15]}
    assert noise.params[0]["identity"] is True
    # another unit draws other noise
    ctx2 = UnitContext(3, "three", 2)
    ctx2.set_base(BaseImage(image=base))
    other = fam.generate(ctx2, ["gaussian_noise"], scales)["gaussian_noise"]
    assert not np.array_equal(np.asarray(other.images[3]), np.asarray(noise.images[3]))


def test_config_rejects_unknown_corruption_and_severity():
    from pipeline.config import ConfigError, load_config

    path = REPO / "configs" / "world_corruptions.yaml"
    with pytest.raises(ConfigError, match=r"families\[0\]\.shifts: unknown corruption 'rain'"):
        load_config(path, {"families": [{"kind": "corruption", "shifts": ["rain"]}]})
    with pytest.raises(ConfigError, match=r"families\[0\]\.scales: severity 6.0 is outside \[0, 5\]"):
        load_config(path, {"families": [{"kind": "corruption", "shifts": ["fog"], "scales": [0, 6]}]})
    with pytest.raises(ConfigError, match="work_size"):
        load_config(path, {"families": [{"kind": "corruption", "shifts": ["fog"], "options": {"work_size": 2}}]})
    cfg = load_config(path, {"families": [{"kind": "corruption", "shifts": ["fog"]}]})
    assert cfg.family_groups()[1].scales == (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)


def test_frost_folder_option(tmp_path):
    from PIL import Image

    from pipeline.families.corruption.weather_digital import folder_frost

    Image.fromarray(np.full((20, 30, 3), 200, np.uint8)).save(tmp_path / "f1.png")
    layer = folder_frost(Fields(1), 40, 40, str(tmp_path))  # smaller than the image: resized up
    assert layer.shape == (3, 40, 40) and torch.allclose(layer, torch.full_like(layer, 200 / 255), atol=1e-6)
    with pytest.raises(FileNotFoundError, match="frost_dir"):
        folder_frost(Fields(1), 8, 8, str(tmp_path / "none")) if (tmp_path / "none").mkdir() is None else None


def test_work_size_corrupts_at_that_size_and_resizes_back():
    from PIL import Image

    from pipeline.config import load_config
    from pipeline.families.base import BaseImage, UnitContext
    from pipeline.families.corruption import CorruptionFamily

    cfg = load_config(
        REPO / "configs" / "world_corruptions.yaml",
        {"families": [{"kind": "corruption", "shifts": ["pixelate"], "options": {"work_size": 64}}]},
    )
    fam = CorruptionFamily(cfg, cfg.family_groups()[1])
    fam.setup()
    ctx = UnitContext(3, "three", 1)
    ctx.set_base(BaseImage(image=Image.fromarray(np.uint8(photo(32) * 255))))
    out = fam.generate(ctx, ["pixelate"], [0.0, 5.0])["pixelate"]
    assert out.images[1].size == (32, 32) and out.params[1]["work_size"] == 64


def test_validate_names_a_wrong_baseline_and_frost_folder(tmp_path):
    from pipeline.assets import missing_assets
    from pipeline.config import load_config

    cfg = load_config(
        REPO / "configs" / "world_corruptions.yaml",
        {
            "aggregate": {"analyses": ["cns", {"name": "corruption_error", "baseline": "alexnet"}]},
            "families": [{"kind": "corruption", "shifts": ["frost"], "options": {"frost_dir": str(tmp_path / "nope")}}],
        },
    )
    problems = missing_assets(cfg)
    assert any("aggregate.analyses[1].baseline: 'alexnet' is not a classifier" in p for p in problems)
    assert any("families[corruption].options.frost_dir: folder not found" in p for p in problems)
