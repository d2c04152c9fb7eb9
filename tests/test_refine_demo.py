"""``cnsbench refine --classifier all`` on the demo world: each classifier's rows are its lone run's.

On copies of the session's demo build (``demo_world``, one unit with the demo world's
modules): the contract's command refines the world's four classifiers together, three
rounds, in process; each classifier refined alone (one command per classifier, one after
another on another copy: later ones classify the points earlier ones made, so every point is
made once there too, in batches of its own classifier's points) gives the same
``failure_points_refined.csv`` rows, and the run together makes fewer images than the
classifiers refined alone, each in an output of its own, would.
"""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

KEY = ["classifier", "shift", "trajectory_id"]


def _points(out) -> set[str]:
    """The keys of the points committed to an output's refinement store (its manifests)."""
    from pipeline.io.store import OutputStore
    from pipeline.refine import refine_uri

    return {k for m in OutputStore(refine_uri(str(out))).manifests() for k in m.trajectories}


def _rows(out) -> pd.DataFrame:
    from pipeline.analyses.refined import read_refined
    from pipeline.io.store import OutputStore

    return read_refined(OutputStore(str(out))).sort_values(KEY).reset_index(drop=True)


@pytest.mark.slow
def test_all_classifiers_together_equal_each_alone_with_fewer_images(demo_world, tmp_path):
    from pipeline.cli import main
    from pipeline.refine import refine

    together, alone = tmp_path / "together", tmp_path / "alone"
    for out in (together, alone):
        shutil.copytree(demo_world, out)
    assert main(["refine", str(together), "--classifier", "all", "--rounds", "3", "--runner", "local"]) == 0
    rows = _rows(together)
    names = ["linear", "cnn", "vit", "clip-zs"]
    assert sorted(set(rows["classifier"])) == sorted(names)

    lone = {}
    for name in names:
        s = refine(str(alone), name, rounds=3, runner="local", aggregate=False, echo=lambda m: None)
        mine = _rows(alone)
        mine = mine[mine["classifier"] == name].reset_index(drop=True)
        # Alone, in an output of its own, a classifier makes every probe of its bisection: one a round.
        assert s.points_made + s.points_reused == s.per_classifier[name] == int(mine["rounds"].sum())
        lone[name] = (s, mine)

    for name, (_, mine) in lone.items():
        theirs = rows[rows["classifier"] == name].reset_index(drop=True)
        assert (theirs["status"] == "refined").any(), name
        assert (theirs.loc[theirs["status"] == "refined", "rounds"] == 3).all(), name
        pd.testing.assert_frame_equal(theirs, mine, check_exact=True)

    made = _points(together)
    assert made == _points(alone)  # the same points, each made once in both
    each_alone = sum(s.per_classifier[name] for name, (s, _) in lone.items())
    assert max(s.per_classifier[name] for name, (s, _) in lone.items()) <= len(made) < each_alone
