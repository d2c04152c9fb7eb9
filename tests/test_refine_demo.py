"""``cnsbench refine --classifier all`` on the demo world: each classifier's rows are its lone run's.

On a copy of the run's demo build (``demo_world``, shared by the demo world's modules):
the contract's command refines the world's four classifiers together, two rounds, in
process.  Then each classifier is refined alone on the same output, one command
each.  A lone run bisects from its own grid verdicts and asks for the probes its bisection
needs; the points are committed by coordinates, so a probe the run together made is reused
and one it did not make is generated.  That every lone run generates nothing shows the run
together made exactly the probes each classifier's own bisection visits; equal rows show it
reached each classifier's verdicts (an image is a function of its coordinates: regenerated
points equal the first ones, tests/test_refine.py).  The run together made fewer images than
the classifiers refined alone, each in an output of its own, would: the sum of their points.
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

    out = tmp_path / "out"
    shutil.copytree(demo_world, out)
    assert main(["refine", str(out), "--classifier", "all", "--rounds", "2", "--runner", "local"]) == 0
    rows, made = _rows(out), _points(out)
    names = ["linear", "cnn", "vit", "clip-zs"]
    assert sorted(set(rows["classifier"])) == sorted(names)

    each_alone = 0
    for name in names:
        s = refine(str(out), name, rounds=2, runner="local", aggregate=False, echo=lambda m: None)
        mine = _rows(out)
        mine = mine[mine["classifier"] == name].reset_index(drop=True)
        theirs = rows[rows["classifier"] == name].reset_index(drop=True)
        # Alone, its bisections visit one probe a round, and every one was made by the run together.
        assert s.points_made == 0 and s.points_reused == s.per_classifier[name] == int(mine["rounds"].sum()) > 0, name
        assert (theirs["status"] == "refined").any(), name
        assert (theirs.loc[theirs["status"] == "refined", "rounds"] == 2).all(), name
        pd.testing.assert_frame_equal(theirs, mine, check_exact=True)
        each_alone += s.per_classifier[name]

    assert _points(out) == made  # nothing was added by the lone runs
    assert len(made) < each_alone
