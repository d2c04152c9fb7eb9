"""Shift-realisation measures (CNS-Bench Fig. 3) against hand-computed values."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pandas as pd
import pytest

from pipeline.aggregate.metrics import compute_metrics
from pipeline.aggregate.realisation import REALISATION_TABLE_COLUMNS, shift_realisation
from pipeline.aggregate.report import write_report
from pipeline.plan import sample_id, trajectory_id
from pipeline.plan.schema import PREDICTIONS, SAMPLES

SCALES = [0.0, 1.0, 2.0]
NAN = math.nan
# (shift, seed) -> per scale (clip_shift_alignment, dino_image); None = no sample at that scale
TRAJ = {
    ("snow", 1): [(20.0, 1.0), (25.0, 0.9), (30.0, 0.7)],
    ("snow", 2): [(10.0, 1.0), (10.0, 0.8), (16.0, 0.5)],
    ("style", 1): [(30.0, 1.0), (NAN, 0.6), (28.0, NAN)],
    ("style", 2): [None, (12.0, 0.5), (14.0, 0.4)],  # no scale-0 reference: no deltas
}


def samples(kept_off: set[tuple[str, int, float]] = frozenset(), with_alignment: bool = True) -> pd.DataFrame:
    rows = []
    for (shift, seed), values in TRAJ.items():
        for scale, v in zip(SCALES, values):
            if v is None:
                continue
            row = {f.name: None for f in SAMPLES}
            row.update(
                sample_id=sample_id(shift, 1, seed, scale), trajectory_id=trajectory_id(shift, 1, seed), class_id=1,
                class_name="goldfish", seed=seed, shift=shift, scale=scale, shard="s", key="k",
                clip_shift_alignment=v[0], dino_image=v[1], n_pass=4, kept=(shift, seed, scale) not in kept_off,
            )
            rows.append(row)
    # a sample at a scale outside the benchmark's is ignored
    extra = dict(rows[0], sample_id="snow/001/seed_0001_scale_0500", scale=0.5, clip_shift_alignment=99.0, dino_image=0.0)
    rows.append(extra)
    df = pd.DataFrame(rows, columns=SAMPLES.names)
    return df if with_alignment else df.drop(columns=["clip_shift_alignment"])


def as_dict(table: pd.DataFrame) -> dict:
    return {(r.shift, r.scale): (r.n, r.clip_shift_alignment_delta, r.dino_similarity) for r in table.itertuples()}


def close(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k in a:
        assert a[k][0] == b[k][0], k
        for x, y in zip(a[k][1:], b[k][1:]):
            assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y), (k, a[k], b[k])


def test_hand_computed_means():
    table = shift_realisation(samples(), SCALES)
    assert list(table.columns) == REALISATION_TABLE_COLUMNS
    assert table["shift"].tolist() == ["snow"] * 3 + ["style"] * 3 and table["scale"].tolist() == SCALES * 2
    close(
        as_dict(table),
        {
            ("snow", 0.0): (2, 0.0, 1.0),
            ("snow", 1.0): (2, (5.0 + 0.0) / 2, (0.9 + 0.8) / 2),
            ("snow", 2.0): (2, (10.0 + 6.0) / 2, (0.7 + 0.5) / 2),
            ("style", 0.0): (1, 0.0, 1.0),
            # seed 1 has no alignment at scale 1, seed 2 no reference: no delta at all
            ("style", 1.0): (2, NAN, (0.6 + 0.5) / 2),
            ("style", 2.0): (2, 28.0 - 30.0, 0.4),
        },
    )


def test_kept_only_keeps_the_reference_of_unkept_scale0():
    table = shift_realisation(samples({("snow", 2, 2.0), ("snow", 1, 0.0)}), SCALES, kept_only=True)
    got = as_dict(table)
    assert got[("snow", 0.0)] == (1, 0.0, 1.0)  # only seed 2's scale 0 is kept
    assert got[("snow", 1.0)][1] == pytest.approx(2.5)  # seed 1 still measured against its scale 0
    assert got[("snow", 2.0)][0] == 1 and got[("snow", 2.0)][1] == pytest.approx(10.0)


def test_scale_noise_missing_column_and_empty():
    df = samples()
    df["scale"] = df["scale"] + 1e-7  # float noise from a CSV round trip
    close(as_dict(shift_realisation(df, SCALES)), as_dict(shift_realisation(samples(), SCALES)))
    old = shift_realisation(samples(with_alignment=False), SCALES)  # outputs from before the column
    assert old["clip_shift_alignment_delta"].isna().all()
    assert old["dino_similarity"].tolist()[:3] == pytest.approx([1.0, 0.85, 0.6])
    for empty in (pd.DataFrame(), pd.DataFrame(columns=SAMPLES.names)):
        out = shift_realisation(empty, SCALES)
        assert out.empty and list(out.columns) == REALISATION_TABLE_COLUMNS
    with pytest.raises(ValueError, match="several samples at scale"):
        shift_realisation(pd.concat([samples(), samples().iloc[:1]]), SCALES)
    with pytest.raises(ValueError, match="lacks columns"):
        shift_realisation(samples().drop(columns=["shift"]), SCALES)


def test_report_and_json_include_realisation(tmp_path: Path):
    s = samples()
    p = pd.DataFrame(
        [dict(sample_id=sid, classifier="A", top1=1, top5=[1, 2, 3, 4, 5], p_true=0.9, correct=True)
         for sid in s["sample_id"]],
        columns=PREDICTIONS.names,
    )
    m = compute_metrics(s, p, SCALES)
    assert m.shift_realisation.equals(shift_realisation(s, SCALES))
    doc = json.loads(json.dumps(m.to_json(), allow_nan=False))
    rec = {(r["shift"], r["scale"]): r for r in doc["shift_realisation"]}
    assert rec[("style", 1.0)]["clip_shift_alignment_delta"] is None and rec[("snow", 2.0)]["n"] == 2

    out = write_report(m, tmp_path / "report", title="t")
    assert {"shift_realisation.csv", "shift_realisation.png"} <= set(out)
    assert Path(out["shift_realisation.png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    csv = pd.read_csv(out["shift_realisation.csv"])
    assert list(csv.columns) == REALISATION_TABLE_COLUMNS and len(csv) == 6
    assert csv.loc[(csv["shift"] == "snow") & (csv["scale"] == 2.0), "clip_shift_alignment_delta"].item() == 8.0
    page = Path(out["index.html"]).read_text()
    assert "Shift realisation" in page and 'src="shift_realisation.png"' in page
    # without any realisation measure (filter off) the files and the section are left out
    s2 = s.assign(clip_shift_alignment=None, dino_image=None)
    out2 = write_report(compute_metrics(s2, p, SCALES), tmp_path / "report2", title="t")
    assert "shift_realisation.csv" not in out2 and "Shift realisation" not in Path(out2["index.html"]).read_text()


def test_filter_scores_alignment_without_touching_the_keep_rule(tmp_path: Path):
    from PIL import Image

    from pipeline.config import FilterSpec
    from pipeline.demo.tiny_eval_models import make_tiny_clip, make_tiny_dino
    from pipeline.models.detectors import SHIFT_ALIGNMENT_PROMPT, OOCFilter, keep_decision

    ooc = OOCFilter(FilterSpec(clip=make_tiny_clip(tmp_path), dino=make_tiny_dino(tmp_path)), "cpu")
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in SCALES]
    (res,) = ooc.evaluate([(images, SCALES, "goldfish", "heavy_snow")])
    assert len(res["clip_shift_alignment"]) == 3
    # by hand: CLIPScore of each image to "a picture in heavy snow"
    img = ooc.clip.encode_images(images)
    txt = ooc.clip.encode_texts([SHIFT_ALIGNMENT_PROMPT.format(shift_words="heavy snow")])[0]
    assert res["clip_shift_alignment"] == pytest.approx((100 * (img @ txt).clamp(min=0)).tolist(), abs=1e-4)
    # the keep decision is the 4-detector one
    four = {k: res[k] for k in ("clip_text", "clip_shift_text", "clip_image", "dino_image")}
    assert (res["n_pass"], res["kept"]) == keep_decision(four, ooc.spec.thresholds, ooc.spec.min_pass)
    assert set(ooc.score_trajectory(images, SCALES, "goldfish", "heavy_snow")) == set(four)  # unchanged contract
