"""Adaptive builds' pure parts on hand-made tables: the allocation, the stratified estimates,
the replayed rounds, and the config's checks (docs/adaptive.md)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.aggregate import stratified
from pipeline.config import ConfigError, parse_config
from pipeline.plan.adaptive import STOP_CAP, STOP_SEEDS, STOP_TARGETS, allocate, schedule


def two_strata(n_right: int, flips: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One classifier at one scale: stratum 0 always right (``n_right`` trajectories), stratum 1
    right on the trajectories where ``flips`` is 1.  (y, x, stratum) of one cell."""
    y = np.array([1.0] * n_right + [float(f) for f in flips])[:, None]
    return y, np.ones_like(y), np.array([0] * n_right + [1] * len(flips))


WEIGHTS = np.array([[0.5], [0.5]])  # two classes of one shift: the uniform design's equal weights


def test_the_flipping_stratum_gets_the_next_round():
    y, x, stratum = two_strata(3, [1, 0, 1])
    ratio = stratified.stratified_ratio(y, x, stratum, WEIGHTS, n_pop=16, z=1.96)
    load = ratio.load[:, 0]
    assert load[1] > 4 * load[0]  # the always-right stratum has only the floor's variance
    assert allocate([3, 3], load, [1.0, 1.0], 4, 16, [6, 6], 10**6) == (3, 7)


def test_weighted_estimate_is_the_uniform_designs_mean():
    # Unequal seeds: 2 always right, 8 flipping half the time.  The uniform design (equal seeds
    # per stratum) measures the mean of the two strata's means, 0.75, not the pooled 0.6.
    y, x, stratum = two_strata(2, [1, 0] * 4)
    ratio = stratified.stratified_ratio(y, x, stratum, WEIGHTS, n_pop=16, z=1.96)
    assert ratio.estimate[0] == pytest.approx(0.75)
    assert float(y.mean()) == pytest.approx(0.6)
    # With equal seeds the estimate is the uniform build's pooled accuracy exactly.
    y, x, stratum = two_strata(4, [1, 0, 0, 1])
    assert stratified.stratified_ratio(y, x, stratum, WEIGHTS, 16, 1.96).estimate[0] == pytest.approx(y.mean())


def test_standard_error_is_the_stratified_one_with_the_population_correction():
    y, x, stratum = two_strata(4, [1, 0, 0, 1])
    ratio = stratified.stratified_ratio(y, x, stratum, WEIGHTS, n_pop=8, z=1.0)
    s2_flip = np.var([1, 0, 0, 1], ddof=1)
    s2_right = 0.25 / 5  # the floor: a half-right pseudo-observation among 4
    var = 0.25 * (1 - 4 / 8) * (s2_right + s2_flip) / 4
    assert ratio.half[0] == pytest.approx(np.sqrt(var))
    # Every seed of the range made: the uniform build's number itself, no interval.
    full = stratified.stratified_ratio(y, x, stratum, WEIGHTS, n_pop=4, z=1.96)
    assert full.half[0] == 0.0


def test_ratio_counts_only_evaluated_trajectories():
    y = np.array([[1.0], [0.0], [1.0], [1.0]])
    x = np.array([[1.0], [0.0], [1.0], [1.0]])  # the second trajectory is not evaluated
    ratio = stratified.stratified_ratio(y, x, np.array([0, 0, 1, 1]), WEIGHTS, 16, 1.96)
    assert ratio.estimate[0] == pytest.approx(1.0)


def test_allocation_prefers_cheap_strata_and_respects_caps():
    # Same variance, the second stratum four times as costly: n ∝ 1/sqrt(c) -> about 2:1.
    n = allocate([2, 2], [1.0, 1.0], [1.0, 4.0], 12, 100, [1, 1], 10**6)
    assert n[0] == pytest.approx(2 * n[1], abs=2)
    assert allocate([2, 2], [1.0, 1.0], [1.0, 1.0], 10, 3, [1, 1], 10**6) == (3, 3)  # seeds run out
    assert allocate([2, 2], [1.0, 1.0], [1.0, 1.0], 10, 100, [6, 6], 12) == (3, 3)  # the image budget
    assert allocate([2, 2], [0.0, 0.0], [1.0, 1.0], 10, 100, [6, 6], 10**6) == (2, 2)


def test_schedule_replays_rounds_and_says_why_it_stopped():
    strata = [(0, "a"), (1, "a")]
    made: set[tuple[int, ...]] = set()

    def assess(alloc):
        # The second stratum stays uncertain until it has 6 seeds.
        return [0.0, 1.0 if alloc[1] < 6 else 0.0], alloc[1] >= 6

    sched = schedule(strata, 16, 2, 2, 10**6, [6, 6], [1.0, 1.0], lambda a: a in made, assess)
    assert sched.rounds == [(2, 2)] and sched.stop is None  # the pilot is still to make
    made.update({(2, 2), (2, 4), (2, 6)})
    sched = schedule(strata, 16, 2, 2, 10**6, [6, 6], [1.0, 1.0], lambda a: a in made, assess)
    assert sched.rounds == [(2, 2), (2, 4), (2, 6)] and sched.stop == STOP_TARGETS
    capped = schedule(strata, 16, 2, 2, 30, [6, 6], [1.0, 1.0], lambda a: True, assess)
    assert capped.stop == STOP_CAP and capped.current == (2, 3)
    short = schedule(strata, 3, 2, 2, 10**6, [6, 6], [1.0, 1.0], lambda a: True, assess)
    assert short.stop == STOP_SEEDS and short.current == (2, 3)


def test_assess_names_the_cells_within_their_targets():
    correct = np.ones((8, 1, 2))
    correct[4:, 0, 1] = [1, 0, 1, 0]
    found = stratified.cells(correct, np.ones((8, 1), dtype=bool), np.array([0] * 4 + [1] * 4),
                             np.array([0, 0]), 1, [0.0, 1.0], 16, 0.95, 3.0)
    assert found.accuracy.estimate.reshape(2).tolist() == pytest.approx([1.0, 0.75])
    load, met = stratified.assess(found, 0.05, 0.5)
    assert not met and load[1] > load[0]
    _, met = stratified.assess(found, 0.9, 3.0)
    assert met


# --------------------------------------------------------------------------- config
def demo_raw(**sampling) -> dict:
    import yaml

    from pipeline.cli import TINY_CONFIG

    raw = yaml.safe_load(TINY_CONFIG.read_text())
    raw["benchmark"]["seeds"] = "1..8"
    raw["sampling"] = {"target": 0.1, "max_images": 1000, "pilot": 2, "round_size": 4, **sampling}
    return raw


@pytest.mark.parametrize("change, key", [
    ({"target": 0}, "sampling.target"),
    ({"target": -0.1}, "sampling.target"),
    ({"pilot": 1}, "sampling.pilot"),
    ({"round_size": 0}, "sampling.round_size"),
    ({"max_images": 10}, "sampling.max_images"),
])
def test_bad_sampling_values_name_their_key(change, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_config(demo_raw(**change), "cfg.yaml")


def test_a_seed_list_the_rounds_cannot_extend_is_refused():
    raw = demo_raw()
    raw["benchmark"]["seeds"] = [1, 2]
    with pytest.raises(ConfigError, match=r"benchmark\.seeds: sampling"):
        parse_config(raw, "cfg.yaml")


def test_the_section_is_off_by_default_and_leaves_the_hash_alone():
    from pipeline.config import config_hash

    raw = demo_raw()
    del raw["sampling"]
    cfg = parse_config(raw, "cfg.yaml")
    assert cfg.sampling is None
    with_section = parse_config(demo_raw(), "cfg.yaml")
    assert config_hash(cfg) != config_hash(with_section)
    assert "sampling" not in _hashed(cfg)


def _hashed(cfg) -> dict:
    import json

    from pipeline.config.loading import resolved_dict

    data = resolved_dict(cfg)
    if data.get("sampling") is None:
        data.pop("sampling", None)
    return json.loads(json.dumps(data))


def test_a_round_ends_once_its_targets_are_projected_met():
    # Up to 10 trajectories, but 5 seeds in the uncertain stratum are projected to be enough.
    assert allocate([2, 2], [0.0, 1.0], [1.0, 1.0], 10, 100, [6, 6], 10**6, lambda a: a[1] >= 5) == (2, 5)
    # Projected at least one trajectory in: a round is never empty while a target is unmet.
    assert allocate([2, 2], [0.0, 1.0], [1.0, 1.0], 10, 100, [6, 6], 10**6, lambda a: True) == (2, 3)
    # The projection from a real cell: stratum 1 flips; its interval narrows as its seeds grow.
    correct = np.ones((8, 1, 2))
    correct[4:, 0, 1] = [1, 0, 1, 0]
    found = stratified.cells(correct, np.ones((8, 1), dtype=bool), np.array([0] * 4 + [1] * 4),
                             np.array([0, 0]), 1, [0.0, 1.0], 64, 0.95, 3.0)
    assert not stratified.projected_met(found, 0.2, 3.0, np.array([4, 4]), 64, 0.95)
    assert stratified.projected_met(found, 0.2, 3.0, np.array([4, 40]), 64, 0.95)


def test_a_failure_point_not_seen_yet_is_not_taken_as_met():
    # Two strata of one shift, every trajectory right at every scale: no failure point yet, so
    # no estimate, but the mean failure point is not known to be within its target.
    correct = np.ones((4, 1, 3))
    args = (np.ones((4, 1), dtype=bool), np.array([0, 0, 1, 1]), np.array([0, 0]), 1, [0.0, 1.0, 2.0])
    found = stratified.cells(correct, *args, 16, 0.95, 2.0)
    assert np.isnan(found.fp_mean.estimate).all() and np.isnan(found.fp_mean.half).all()
    load, met = stratified.assess(found, 0.5, 0.5)
    assert not met and load[0] == pytest.approx(load[1]) and load[0] > 0
    # Every seed of the range made: nothing is left to find.
    _, met = stratified.assess(stratified.cells(correct, *args, 2, 0.95, 2.0), 0.5, 0.5)
    assert met
