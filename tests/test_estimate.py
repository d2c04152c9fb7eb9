"""`cnsbench estimate`: the UNet evaluations the build makes, the GPU table, the memory refusal."""

from __future__ import annotations

from pipeline.runtime.checkout import REPO_ROOT
from pipeline.cli import main
from pipeline.perf.estimate import ddim_timesteps, unet_evals_per_unit

CNS = str(REPO_ROOT / "configs" / "cns_bench.yaml")


def test_unet_evaluations_share_the_prefix_and_scale_0():
    assert ddim_timesteps(50)[:2] == [981, 961] and ddim_timesteps(50)[-1] == 1
    e = unet_evals_per_unit(50, 750, 14, [0, 0.5, 1.0, 1.5, 2.0, 2.5], 7.5)
    # 12 steps above t=750 once, then 38 window steps for scale 0 and 14 x 5 branches, CFG x2.
    assert (e["prefix_steps"], e["window_steps"], e["branches"]) == (12, 38, 71)
    assert e["evals"] == 2 * (12 + 71 * 38) == 5420 and e["evals_unshared"] == 2 * 50 * 84


def test_estimate_prints_images_gpu_hours_wall_time_and_assumptions(capsys):
    assert main(["estimate", CNS, "--gpu", "h100", "--gpus", "8", "--price-per-hour", "2"]) == 0
    out = capsys.readouterr().out
    assert "images: 6,000" in out and "UNet evaluations: 390,000" in out  # 2 classes x 50 seeds x 10 shifts x 6
    for stage in ("generate", "filter", "classify"):
        assert any(line.strip().startswith(stage) and "GPU-hours" in line for line in out.splitlines())
    assert "wall time on 8 GPUs" in out and "cost:" in out and "assumptions:" in out and "utilisation" in out


def test_unknown_gpu_lists_the_known_ones(capsys):
    assert main(["estimate", CNS, "--gpu", "nosuch", "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert "nosuch" in err and "h100" in err and "a100" in err and "l4" in err


def test_generate_actor_larger_than_the_gpu_is_refused(capsys):
    # 16 branches per forward decode 16 images of 768 px at once: more than an L4's 24 GiB.
    assert main(["estimate", CNS, "--gpu", "l4", "--gpus", "4"]) == 2
    assert "generate actor needs" in capsys.readouterr().err
    assert main(["estimate", CNS, "--gpu", "l4", "--gpus", "4", "--set", "generator.branch_batch_size=4"]) == 0
