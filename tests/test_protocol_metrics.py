"""The accuracy drop's sign and its two averages over shifts, on a hand-made case.

One classifier, scales 0 and 1.  ``snow`` has 1 evaluated trajectory, right at 0 and wrong
at 1; ``style`` has 3, all right at 0 and 2 of 3 right at 1:

* per shift: snow 1.0 -> 0.0 (drop 1), style 1.0 -> 2/3 (drop 1/3)
* mean over shifts (every shift weighs the same): (1 + 1/3) / 2 = 2/3
* pooled over the 4 trajectories' images: 4/4 -> 2/4, drop 1/2
"""

from __future__ import annotations

import pandas as pd
import pytest

from pipeline.aggregate.metrics import accuracy_table, summary_table

SCALES = [0.0, 1.0]


def tables():
    outcomes = {  # trajectory -> (shift, correct at 0, correct at 1)
        "snow/001/seed_0001": ("snow", True, False),
        "style/001/seed_0001": ("style", True, True),
        "style/001/seed_0002": ("style", True, False),
        "style/001/seed_0003": ("style", True, True),
    }
    samples, preds = [], []
    for tid, (shift, *correct) in outcomes.items():
        for scale, ok in zip(SCALES, correct):
            sid = f"{tid}_scale_{int(scale * 1000):04d}"
            samples.append({"sample_id": sid, "trajectory_id": tid, "shift": shift, "scale": scale, "kept": True})
            preds.append({"sample_id": sid, "classifier": "A", "correct": ok})
    return pd.DataFrame(samples), pd.DataFrame(preds)


def test_accuracy_drop_is_positive_for_a_drop_and_change_keeps_the_sign():
    acc = accuracy_table(*tables(), SCALES).set_index(["shift", "scale"])
    assert acc.loc[("snow", 1.0), "accuracy_drop"] == 1.0
    assert acc.loc[("snow", 1.0), "accuracy_change"] == -1.0
    assert acc.loc[("style", 1.0), "accuracy_drop"] == pytest.approx(1 / 3)
    assert acc.loc[("style", 1.0), "accuracy_change"] == pytest.approx(-1 / 3)
    assert acc.loc[("style", 0.0), "accuracy_drop"] == 0.0


def test_mean_over_shifts_and_pooled_drops_differ_as_computed_by_hand():
    row = summary_table(*tables(), SCALES).set_index("classifier").loc["A"]
    assert row["acc_drop_1000"] == pytest.approx(2 / 3)
    assert row["acc_drop_pooled_1000"] == pytest.approx(1 / 2)
    assert row["acc_drop_0000"] == 0.0 and row["acc_drop_pooled_0000"] == 0.0
