"""The report's first screen answers "where does each classifier break", in the config's order and colours.

In process, from a hand-made table: the first section of the page is the table of failure
points per shift and drops, before the settings and the counts; a classifier keeps its
colour when another is added; the aggregation lists classifiers in the order it is given.
"""

from __future__ import annotations

import pandas as pd

from pipeline.aggregate.metrics import compute_metrics
from pipeline.aggregate.report import breaks_table, cns_section, colours_of

SCALES = [0.0, 1.0, 2.0]


def _tables():
    samples, preds = [], []
    for shift in ("fog", "rain"):
        for seed in range(4):
            tid = f"{shift}/000/seed_{seed:04d}"
            for scale in SCALES:
                sid = f"{tid}_scale_{int(scale * 1000):04d}"
                samples.append({"sample_id": sid, "trajectory_id": tid, "shift": shift, "scale": scale, "kept": True})
                # "b" breaks at 1 on fog for seeds 0-1; "a" never breaks
                preds.append({"sample_id": sid, "classifier": "b", "correct": not (shift == "fog" and seed < 2 and scale >= 1)})
                preds.append({"sample_id": sid, "classifier": "a", "correct": True})
    return pd.DataFrame(samples), pd.DataFrame(preds)


def test_breaks_table_and_it_opens_the_section():
    samples, preds = _tables()
    m = compute_metrics(samples, preds, SCALES)
    table = breaks_table(m).set_index("classifier")
    assert list(table.index) == ["b", "a"]  # the order of the predictions (the config's)
    assert table.loc["b", "fog"] == "breaks at 1 (2/4), drop 0.5000"
    assert table.loc["b", "rain"] == "never breaks (0/4), drop 0.0000"
    assert table.loc["b", "accuracy drop at 2"] == "0.2500"
    html = cns_section(m, [])
    assert html.index("Where each classifier breaks") < html.index("scales:") < html.index("<h2>Dataset</h2>")


def test_colours_follow_names_not_positions():
    world = ["linear", "cnn", "vit", "clip-zs"]
    before = colours_of(world)
    assert len(set(before.values())) == 4
    after = colours_of([*world, "small-cnn"])  # a classifier added: the others keep their colours
    assert {n: after[n] for n in world} == before and after["small-cnn"] not in before.values()
    assert colours_of(list(reversed(world))) == before  # the same name, the same colour, in any report
