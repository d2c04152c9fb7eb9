"""Plan: ids and seeds are functions of coordinates; units group (class, seed)."""

from __future__ import annotations

from pipeline import plan
from pipeline.config import BenchmarkSpec


def spec(**kw) -> BenchmarkSpec:
    base = {"classes": [22, 1], "seeds": [34, 2], "shifts": ["painting_style", "heavy_snow"]}
    return BenchmarkSpec(**{**base, **kw})


def test_ids_follow_published_layout():
    assert plan.sample_id("painting_style", 22, 34, 1.0) == "painting_style/022/seed_0034_scale_1000"
    assert plan.trajectory_id("heavy_snow", 1, 2) == "heavy_snow/001/seed_0002"
    assert plan.scale_tag(2.5) == "2500" and plan.scale_tag(0.0) == "0000" and plan.scale_tag(-0.5) == "m0500"


def test_noise_seed_is_shared_by_all_shifts_and_scales():
    # The shared prefix and scale-0 image require it; the reference seeds with the seed itself.
    assert plan.noise_seed(22, 34) == 34 == plan.noise_seed(1, 34)


def test_units_cover_plan_and_are_order_independent():
    units = plan.plan_units(spec())
    assert len(units) == 4 and all(u.shifts == ("painting_style", "heavy_snow") for u in units)
    ids = {(u.class_id, u.seed) for u in units}
    assert ids == {(22, 34), (22, 2), (1, 34), (1, 2)}
    reordered = plan.plan_units(spec(classes=[1, 22], seeds=[2, 34]))
    assert {u.id for u in reordered} == {u.id for u in units}
    s = plan.summarize(spec())
    assert (s.n_trajectories, s.n_images, s.n_units, s.n_sliders) == (8, 48, 4, 4)


def test_units_skip_done_trajectories():
    done = {plan.trajectory_id("painting_style", 22, 34), plan.trajectory_id("heavy_snow", 22, 34),
            plan.trajectory_id("heavy_snow", 1, 2)}
    units = {u.id: u.shifts for u in plan.plan_units(spec(), done)}
    assert "022/seed_0034" not in units
    assert units["001/seed_0002"] == ("painting_style",)
    assert units["022/seed_0002"] == ("painting_style", "heavy_snow")


def test_unit_row_roundtrip():
    u = plan.plan_units(spec(classes=[22], seeds=[34], shifts=["heavy_snow"]))[0]
    row = u.to_row()
    assert row["class_name"] == "bald eagle" and row["unit_id"] == "022/seed_0034"
    assert plan.WorkUnit.from_row(row) == u
