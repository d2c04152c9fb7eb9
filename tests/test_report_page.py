"""The report page's assembly (pipeline.aggregate.page): contents, anchors, interval cells."""

from __future__ import annotations

import math

import pandas as pd

from pipeline.aggregate.page import ci_table, page_html


def test_contents_list_every_section_and_heading_with_unique_anchors():
    sections = [
        ("", "<h2>Summary</h2><p>x</p><h2>Plots</h2>"),
        ("Per-shift views", "<h2>Accuracy per shift</h2><h3>Summary</h3>"),
        ("Image strips", "<h3>snow &amp; fog</h3>"),
    ]
    text = page_html("t", "abc", sections, ["summary.csv"])
    # a titled section's own h2 moves one level down
    assert '<h3 id="accuracy-per-shift">Accuracy per shift</h3>' in text
    assert '<h2 id="summary">Summary</h2>' in text and '<h3 id="summary-2">Summary</h3>' in text
    assert '<h3 id="snow-fog">snow &amp; fog</h3>' in text
    toc = text[text.index('<nav class="toc"'):text.index("</nav>")]
    hrefs = [part.split('"')[0] for part in toc.split('href="#')[1:]]
    assert hrefs == ["summary", "plots", "per-shift-views", "accuracy-per-shift", "summary-2", "image-strips", "snow-fog", "files"]
    assert toc.count("<ol>") == 3  # top level, and the sublists of the two titled sections
    assert "http" not in text and "<script>" in text  # offline: nothing fetched


def test_interval_columns_fold_into_one_cell():
    df = pd.DataFrame({"classifier": ["a", "b"], "fp_avg": [1.25, math.nan], "fp_avg_ci_low": [1.0, math.nan],
                       "fp_avg_ci_high": [1.5, math.nan], "n": [3, 4]})
    html = ci_table(df, sortable=True, table_id="rank")
    assert html.startswith('<table class="sortable" id="rank">')
    assert "<th>fp_avg_ci_low</th>" not in html and "<th>fp_avg</th>" in html
    assert '<td>1.2500 <span class="ci">[1.0000, 1.5000]</span></td>' in html
    assert '<td data-sort="">n/a <span class="ci">[n/a, n/a]</span></td>' in html  # NaN sorts last


def test_strip_choice_random_is_seeded_and_robust_choices_rank_failure_points():
    from pipeline.analyses.strips import choose

    traj = pd.DataFrame({"trajectory_id": [f"s/00{c}/seed_000{k}" for c in (1, 2) for k in (1, 2, 3)],
                         "class_id": [1, 1, 1, 2, 2, 2], "seed": [1, 2, 3] * 2})
    fps = pd.DataFrame({
        "trajectory_id": ["s/001/seed_0001"] * 2 + ["s/001/seed_0002"] * 2 + ["s/002/seed_0001"] * 2,
        "classifier": ["a", "b"] * 3,
        "failure_point": [0.5, 1.0, math.nan, math.nan, 2.0, math.nan],  # means (never = 3): 0.75, 3, 2.5
    })
    a = choose(traj, fps, 4, "random", 0, "s", 3.0)
    assert a == choose(traj, fps, 4, "random", 0, "s", 3.0) and len(set(a)) == 4
    assert a == sorted(a)  # shown in class, seed order
    assert {tuple(choose(traj, fps, 4, "random", seed, "s", 3.0)) for seed in range(10)} != {tuple(a)}
    assert choose(traj, fps, 2, "most_robust", 0, "s", 3.0) == ["s/001/seed_0002", "s/002/seed_0001"]
    # incomplete trajectories (no failure points) only fill up
    assert choose(traj, fps, 4, "least_robust", 0, "s", 3.0) == [
        "s/001/seed_0001", "s/002/seed_0001", "s/001/seed_0002", "s/001/seed_0003"]
