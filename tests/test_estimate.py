"""`cnsbench estimate`: every actor checked against its share of the GPU before anything is printed,
the UNet evaluations the build makes, the table and its assumptions, bad options refused."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.perf import device, efficiency, report, startup
from pipeline.perf.evals import ddim_timesteps, unet_evals_per_unit
from pipeline.perf.data import gpu_spec
from pipeline.runtime.checkout import REPO_ROOT, TINY_CONFIG

CNS = str(REPO_ROOT / "configs" / "cns_bench.yaml")
GIB = 1024**3


def test_unet_evaluations_share_the_prefix_and_scale_0():
    assert ddim_timesteps(50)[:2] == [981, 961] and ddim_timesteps(50)[-1] == 1
    e = unet_evals_per_unit(50, 750, 14, [0, 0.5, 1.0, 1.5, 2.0, 2.5], 7.5)
    # 12 steps above t=750 once, then 38 window steps for scale 0 and 14 x 5 branches, CFG x2.
    assert (e["prefix_steps"], e["window_steps"], e["branches"]) == (12, 38, 71)
    assert e["evals"] == 2 * (12 + 71 * 38) == 5420 and e["evals_unshared"] == 2 * 50 * 84


def test_durations_are_minutes_below_two_hours_at_three_significant_digits():
    assert report.duration(45.33 * 60) == "45.3 min" and report.duration(7.5) == "0.125 min"
    assert report.duration(119 * 60) == "119 min" and report.duration(3 * 3600) == "3.00 h"
    assert report.duration(1250 * 3600) == "1,250 h" and report.significant(0.012345) == "0.0123"
    lines = report.table([("a", "1.5", "x"), ("long name", "12.25", "y")], numeric=(1,))
    assert lines == ["  a             1.5   x", "  long name   12.25   y"]


def test_a_gpu_is_its_vendor_gb_less_the_allocators_reserve():
    l4 = device.gpu_device(gpu_spec("l4"))
    assert l4.total_bytes == 24 * 10**9 and l4.kind == "gpu"  # 22.35 GiB, not 24
    assert l4.usable_bytes == 24 * 10**9 - 3 * GIB  # the reserve: 10 % of the card, at least 3 GiB
    assert l4.allowance(0.5) == l4.usable_bytes // 2 and l4.allowance(2) == l4.usable_bytes


def test_memory_budget_auto_is_the_classify_share_of_the_device(monkeypatch):
    cfg = load_config(CNS)
    assert cfg.resources.classify.memory_budget_gb == "auto"
    l4 = device.gpu_device(gpu_spec("l4"))
    budget, source = device.classify_budget(cfg, l4)
    assert budget == l4.allowance(0.5) and "auto" in source
    # At run time: the device found here (no GPU on a test machine: a share of the host).
    monkeypatch.setattr(device, "_nvidia_smi_bytes", lambda: 40 * 10**9)
    device.detect.cache_clear()
    try:
        found = device.run_device(cfg)
        assert found.kind == "gpu" and device.classify_budget(cfg)[0] == found.allowance(0.5)
    finally:
        device.detect.cache_clear()
    assert device.classify_budget(load_config(TINY_CONFIG)) is None  # unset: one group


def test_estimate_prints_an_aligned_table_with_each_assumptions_source(capsys):
    assert main(["estimate", CNS, "--gpu", "h100", "--gpus", "8", "--price-per-hour", "2"]) == 0
    out = capsys.readouterr().out
    assert "6,000 images" in out and "390,000 (65.0 per image" in out  # 2 classes x 50 seeds x 10 shifts x 6
    lines = out.splitlines()
    for stage in ("generate", "filter", "classify"):
        assert any(line.strip().startswith(stage) and " min " in line for line in lines)
    assert any(line.strip().startswith("wall time on 8 GPUs") for line in lines)
    assert any(line.strip().startswith("start-up") for line in lines)
    for value, unit in re.findall(r"([\d.,]+) (min|h)\b", out.split("assumptions:")[0]):
        assert unit == "min" or float(value.replace(",", "")) >= 2  # hours only from two hours
        assert len(value.replace(",", "").replace(".", "").lstrip("0")) == 3 or value == "0"
    assumptions = out.split("assumptions:\n")[1].rstrip().splitlines()
    assert len(assumptions) >= 8 and all(a.startswith("  - ") and "(source: " in a for a in assumptions)
    # The actor table's numeric columns are right-aligned under their headings.
    head = next(i for i, line in enumerate(lines) if line.strip().startswith("actor"))
    end = lines[head].index("projected") + len("projected")
    for line in lines[head + 1: head + 4]:
        assert line[end - 1] != " " and line[end] == " "


def test_a_card_too_small_exits_2_before_printing_naming_stage_and_setting(capsys):
    assert main(["estimate", CNS, "--gpu", "l4", "--gpus", "8"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing of an estimate printed
    err = captured.err
    assert "generate: projected 24.8 GiB" in err and "generator.branch_batch_size=11" in err
    assert "filter: projected" in err and "resources.filter.batch_size=" in err
    assert "classify" not in err  # memory_budget_gb auto: the groups fit half an L4
    assert main(["estimate", CNS, "--gpu", "l4", "--gpus", "8", "--set", "generator.branch_batch_size=11",
                 "--set", "resources.filter.batch_size=4"]) == 0


def test_a100_40gb_fits_with_the_classifiers_in_groups(capsys):
    assert main(["estimate", CNS, "--gpu", "a100-40gb", "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    groups = [line for line in out.splitlines() if line.strip().startswith("classify group")]
    assert len(groups) >= 2
    for line in groups:
        projected, may_use = (float(x) for x in line.split()[5:7])
        assert projected <= may_use
    # Without the budget the one classify actor (31.7 GiB) does not fit half the card: named, with the fix.
    assert main(["estimate", CNS, "--gpu", "a100-40gb", "--gpus", "8", "--set",
                 "resources.classify.memory_budget_gb=null"]) == 2
    assert "resources.classify.memory_budget_gb: auto" in capsys.readouterr().err


def test_unknown_gpu_lists_the_known_ones(capsys):
    assert main(["estimate", CNS, "--gpu", "nosuch", "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert "nosuch" in err and "h100" in err and "a100" in err and "l4" in err


@pytest.mark.parametrize("option,value", [
    ("--price-per-hour", "nan"), ("--price-per-hour", "inf"), ("--price-per-hour", "-1"),
    ("--gpus", "1e23"), ("--gpus", "0"), ("--gpus", str(10**23)),
])
def test_absurd_options_exit_2_naming_the_option(capsys, option, value):
    # Issue 43, failure 9: `--price-per-hour nan` printed "cost: nan" and exited 0.
    args = ["estimate", str(TINY_CONFIG), "--gpu", "h100", "--gpus", "1", option, value]
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert option in captured.err and value in captured.err and "cost" not in captured.out


def test_measured_runs_feed_the_estimate(tmp_path):
    run = {"gpus": 16, "images": 84000, "efficiency": 0.9, "efficiency_without_startup": 0.92, "compression": 40,
           "command": "python bench/scale.py --gpus 16 --images 84000 --json", "date": "2026-11-27", "machine": "m"}
    data = efficiency.with_run({"runs": [{**run, "gpus": 4}]}, run)
    assert [r["gpus"] for r in data["runs"]] == [4, 16]
    with pytest.raises(ValueError, match="efficiency_without_startup"):
        efficiency.with_run({}, {"gpus": 2, "images": 1, "efficiency": 1, "command": "x"})
    rehearsal = {"command": "python bench/rehearsal.py startup", "machine": "m", "date": "d",
                 "zero_shot_head_s": 25.4, "zero_shot_head_source": "s",
                 "actors": {"generate": {"imports_s": 9.0, "models": {"sd2": {"load_s": 10.0, "weights_bytes": 5 * GIB}}},
                            "write": {"imports_s": 2.0, "models": {}}}}
    out = startup.from_rehearsal(rehearsal)
    assert out["load_s_per_gib"] == {"all": 2.0, "generate": 2.0} and out["imports_s"] == {"generate": 9.0, "write": 2.0}
    json.dumps(out)


def test_a_vlm_group_counts_its_dtype_and_generation_cache(tmp_path):
    # A vlm's projection (pipeline/perf/memory.py, through the vlm kind's footprint) grows with
    # its token limit (the generation cache) and halves its weights in float16.
    from pipeline.demo.tiny_vlm import build_tiny_llava
    from pipeline.perf.estimate import actors

    model = str(build_tiny_llava(tmp_path / "m", ["a photo of", "yes", "no"], seed=3))
    base = [c.model_dump(mode="json", exclude_defaults=True) for c in load_config(TINY_CONFIG).classifiers]

    def vlm_group(dtype: str, tokens: int):
        vlm = {"name": "llava", "kind": "vlm", "model": model, "dtype": dtype,
               "protocol": {"kind": "two_choice", "distractors": "classifier:tiny-resnet", "max_new_tokens": tokens}}
        cfg = load_config(TINY_CONFIG, sets=["classifiers=" + json.dumps([*base, vlm]),
                                             "resources.classify.num_gpus=0.5", "resources.classify.memory_budget_gb=auto"])
        found = [a for a in actors(cfg, gpu_spec("h100"))[1] if a.stage == "classify"]
        assert [a.members for a in found][-1] == [3] and "vlm" in found[-1].name  # vlms apart, last
        return found[-1]

    short, long, wide = vlm_group("float16", 4), vlm_group("float16", 512), vlm_group("float32", 4)
    assert long.projected > short.projected and wide.projected > short.projected
    assert "float16" in short.detail and long.fits


def test_a_stage_is_projected_at_its_precisions_utilisation_where_measured(monkeypatch):
    from pipeline.perf import estimate, latency

    cfg = load_config(CNS)
    bf16 = cfg.model_copy(update={"resources": cfg.resources.model_copy(update={
        "classify": cfg.resources.classify.model_copy(update={"precision": "bfloat16"})})})
    spec = gpu_spec("h100")
    base = latency.utilisation()
    f32_s, gflop, _ = latency.image_seconds(bf16, spec, "classify")
    # nothing measured for bfloat16 (the shipped gpus.json): float32's figure stands in, and is said
    assert latency.stage_utilisation(bf16, "classify") == (base["classifier"], "float32")
    assert f32_s == pytest.approx(gflop * 1e9 / (spec["bf16_tflops"] * 1e12 * base["classifier"]))
    said = estimate.stage_precisions(bf16)
    assert "classify runs bfloat16 in this config" in said and "float32's is used" in said
    assert "runs" not in estimate.stage_precisions(cfg)  # float32 config: measured at its own precision
    # measured (python -m pipeline.perf.gpus --rehearsal ...): the stage's own figure, 10x the utilisation
    monkeypatch.setattr(latency, "utilisation", lambda: {**base, "classifier_by_precision": {
        "float32": base["classifier"], "bfloat16": base["classifier"] * 10}})
    assert latency.stage_utilisation(bf16, "classify") == (pytest.approx(base["classifier"] * 10), "bfloat16")
    assert latency.image_seconds(bf16, spec, "classify")[0] == pytest.approx(f32_s / 10)
    assert latency.image_seconds(cfg, spec, "classify")[0] == pytest.approx(f32_s)
    assert "runs bfloat16" not in estimate.stage_precisions(bf16)


# --------------------------------------------------------------------------- a family prices its own UNet work
# Shifts of the transforming families that run the UNet beside one that does not, with the
# options that make every loop of theirs run (object_edit: conditional, so with CFG).
MASKED_SHIFTS = {
    "object_edit": (["position", "background_complexity"], {"condition": "class"}),
    "masked_scenario": (["generated_background", "blur_background"], {}),
}


def _family_config(tmp_path, kind: str):
    """The tests' tiny config with ``kind`` as its primary family: 1 class, 1 seed, 2 shifts, 3 scales."""
    from buildproc import tiny_config

    def mutate(raw):
        raw["benchmark"].update(classes=["goldfish"], seeds=[1], scales=[0, 1.0, 2.0])
        raw["generator"]["kind"] = kind
        if kind == "prompt_nuisance":  # the tiny shifts as a vocabulary of nuisances
            raw["generator"]["options"] = {"vocabulary": {"background": ["painting style", "heavy snow"]}}
        if kind == "corruption":
            raw["benchmark"]["shifts"] = ["gaussian_noise", "contrast"]
        if kind in MASKED_SHIFTS:  # levels / strengths in [0, 1]
            shifts, options = MASKED_SHIFTS[kind]
            raw["benchmark"].update(shifts=shifts, scales=[0, 0.5, 1.0])
            raw["generator"]["options"] = options
            raw["generator"]["branch_batch_size"] = 1  # object_edit's rows in chunks of one: the same count

    return load_config(tiny_config(tmp_path, mutate))


def _gray(ctx):
    """A grey base image with a usable object mask: a square in the middle, a quarter of the image,
    so a moved object always uncovers part of its old place."""
    import numpy as np
    from PIL import Image

    from pipeline.families.base import BaseImage

    arr = np.full((64, 64, 3), 128, np.uint8)
    mask = np.zeros((64, 64), bool)
    mask[16:48, 16:48] = True
    arr[mask] = (200, 90, 40)
    return BaseImage(image=Image.fromarray(arr), mask=mask)


@pytest.mark.parametrize("kind", ["slider", "prompt", "prompt_nuisance", "corruption", "object_edit",
                                  "masked_scenario"])
def test_the_estimate_counts_the_unet_evaluations_each_family_records(tmp_path, kind, one_torch_thread):
    """What the estimate prices is what the family's own counter (``ShiftImages.unet_evals``,
    summed into a shard's ``stats.unet_evals``) records when it makes the images."""
    import torch

    from pipeline.families.base import UnitContext
    from pipeline.perf.estimate import unet_evaluations
    from pipeline.registry import FAMILIES

    cfg = _family_config(tmp_path, kind)
    # The base images come from ``_gray``, as from a collection: no UNet work of the seed source's
    # (that is the next test's).
    cfg = cfg.model_copy(update={"source": cfg.source.model_copy(update={"kind": "folders"})})
    recorded = 0.0
    for group in cfg.family_groups():
        family = FAMILIES.get(group.kind)(cfg, group, "cpu", torch.float32)
        family.setup()
        for class_id in cfg.benchmark.classes:
            for seed in cfg.benchmark.seeds:
                ctx = UnitContext(class_id, cfg.benchmark.class_name(class_id), seed, _gray)
                made = family.generate(ctx, list(group.shifts), list(group.scales))
                assert all(m.unusable is None for m in made.values())
                recorded += sum(m.unet_evals for m in made.values())
    assert unet_evaluations(cfg) == recorded
    assert (recorded > 0) == (kind != "corruption")


@pytest.mark.parametrize("kinds", [("corruption",), ("slider", "corruption")])
def test_the_seed_sources_base_images_are_priced_as_the_generate_stage_records_them(tmp_path, kinds,
                                                                                  one_torch_thread):
    """A build whose families make no scale 0 of their own generates each unit's base image with
    the seed source: its evaluations go on the unit's first row (a shard's ``stats.unet_evals``)
    and the estimate prices them; beside a slider family the base is its scale 0, made once."""
    from buildproc import tiny_config

    from pipeline import plan
    from pipeline.perf.estimate import base_cost, unet_evaluations
    from pipeline.stages.generate import GenerateStage

    def mutate(raw):
        raw["benchmark"].update(classes=["goldfish"], seeds=[1], scales=[0, 1.0, 2.0])
        raw["generator"]["kind"] = kinds[0]
        if kinds == ("corruption",):
            raw["benchmark"]["shifts"] = ["gaussian_noise", "contrast"]
        else:
            raw["families"] = [{"kind": "corruption", "shifts": ["gaussian_noise"], "scales": [0, 1.0]}]

    cfg = load_config(tiny_config(tmp_path, mutate))
    assert cfg.source.kind == "seed"
    stage = GenerateStage(cfg, device="cpu")
    stage.ensure_setup()
    rows = stage.process([u.to_row() for u in plan.plan_units(cfg)])
    assert rows and all(r["error"] is None for r in rows)
    recorded = sum(r["unet_evals"] for r in rows)
    per_unit = cfg.generator.steps * 2  # the plain prompt over every step, with guidance
    if kinds == ("corruption",):
        assert base_cost(cfg).evals["evals"] == per_unit
        assert [r["unet_evals"] for r in rows] == [per_unit, 0.0]  # on the unit's first row
    else:
        assert base_cost(cfg) is None  # the slider family's scale 0 is the base
    assert recorded > 0 and unet_evaluations(cfg) == recorded


def test_the_masked_families_count_their_rows_steps_and_guidance(tmp_path):
    """The counts by hand, 10 steps, levels 0.5 and 1: object_edit's position fills run 6 steps
    (strength 0.6) and its background edits 5 (strength 0.5), each of 2 levels with CFG;
    masked_scenario's generated background runs strengths 0.5 and 1 from step 0, guided."""
    from pipeline.registry import FAMILIES

    for kind, evals in (("object_edit", 2 * (2 * 6 + 2 * 5)), ("masked_scenario", 2 * 2 * 10)):
        cfg = _family_config(tmp_path, kind)
        group = cfg.family_groups()[0]
        cost = FAMILIES.get(kind).unet_cost(cfg, group)
        assert cost.evals["evals"] == evals and cost.evals["prefix_steps"] == 0
        assert "upper bound" in cost.note and "unusable" in cost.note
        if kind == "masked_scenario":
            other = dataclasses.replace(group, shifts=("blur_background",))
        else:
            classical = group.options.fill.model_copy(update={"kind": "classical"})
            other = dataclasses.replace(group, shifts=("size",),
                                        options=group.options.model_copy(update={"fill": classical}))
        assert FAMILIES.get(kind).unet_cost(cfg, other) is None  # no scenario / edit that runs the UNet


def test_the_estimate_of_the_tiny_build_equals_its_manifests_count(tiny_reference):
    from pipeline.io.manifest import scan_manifests
    from pipeline.io.store import OutputStore
    from pipeline.perf.estimate import unet_evaluations

    from buildproc import tiny_config

    scan = scan_manifests(OutputStore(str(tiny_reference)))
    recorded = sum(m.stats["unet_evals"] for m in scan.manifests)
    assert recorded > 0 and unet_evaluations(load_config(tiny_config(tiny_reference.parent))) == recorded


def test_the_imagenet_d_world_is_priced_for_its_generation(capsys):
    """ImageNet-D's prompt_nuisance family runs the UNet: its generation is counted, not "runs no UNet"."""
    assert main(["estimate", str(REPO_ROOT / "configs" / "world_imagenet_d.yaml"), "--gpu", "h100", "--gpus", "1"]) == 0
    out = capsys.readouterr().out
    # 10 classes x 6 seeds, each the plain prompt and 3 nuisances over 25 steps with guidance
    assert "UNet evaluations   12,000" in out and "runs no UNet" not in out
    assert re.search(r"generate\s+\S+ min\s+12,000 UNet evaluations, 240 VAE decodes", out), out
