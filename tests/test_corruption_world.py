"""The corruption world (configs/world_corruptions.yaml) builds and shows real effects.

One in-process build (slow): corruptions of the slider trajectories' scale-0 digits next
to the sliders; the CNN loses at least 30 points under Gaussian noise at severity 5,
classifiers fail at different severities, and the report carries the corruption error
and the comparison of the families.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
WORLD = REPO / "assets" / "world" / "world.json"


@pytest.fixture(scope="module")
def world_output(tmp_path_factory):
    if not WORLD.is_file():
        pytest.skip("assets/world not trained")
    from pipeline.cli import main

    out = tmp_path_factory.mktemp("corruption-world") / "out"
    # The tests read the report's tables; of its figures they draw the two this family adds
    # (the others are tests/test_report_*'s).  One slider shift of the config's three: what is
    # tested is the corruptions beside a slider family on the same base images, and the three
    # sliders' own effects are the demo world's (tests/test_world.py).
    assert main(["build", str(REPO / "configs" / "world_corruptions.yaml"), "--output", str(out), "--runner", "local",
                 "--set", "aggregate.plots=false", "--set", "benchmark.shifts=[thick_strokes]"]) == 0
    return out


@pytest.mark.slow
@pytest.mark.timeout(2400)  # about 3 CPU-minutes; a shared machine can stretch that a lot
def test_corruption_world(world_output):
    report = world_output / "report"
    acc = pd.read_csv(report / "accuracy.csv")
    from pipeline.families.corruption.params import ALL

    assert set(acc["shift"]) == set(ALL) | {"thick_strokes"}
    noise = acc[(acc["classifier"] == "cnn") & (acc["shift"] == "gaussian_noise")].set_index("scale")["accuracy"]
    assert noise[0.0] - noise[5.0] >= 0.30, noise.to_dict()

    # same base images: a corruption's scale 0 is the slider trajectories' scale 0
    samples = pd.concat([pd.read_parquet(p) for p in (world_output / "samples").glob("*.parquet")])
    by_id = samples.set_index("sample_id")

    def image_bytes(sample_id: str) -> bytes:
        import tarfile

        row = by_id.loc[sample_id]
        with tarfile.open(world_output / row["shard"]) as tar:
            member = next(m for m in tar.getmembers() if m.name.startswith(row["key"] + ".") and not m.name.endswith(".json"))
            return tar.extractfile(member).read()

    assert image_bytes("gaussian_noise/003/seed_0002_scale_0000") == image_bytes("thick_strokes/003/seed_0002_scale_0000")
    assert image_bytes("gaussian_noise/003/seed_0002_scale_5000") != image_bytes("gaussian_noise/003/seed_0002_scale_0000")
    params = json.loads(samples.set_index("sample_id").loc["fog/002/seed_0001_scale_2500", "params"])
    assert params["corruption"] == "fog" and params["severity"] == 2.5 and params["table"] == [2.25, 1.85]
    # corrupted images bypass the OOC filter (ImageNet-C keeps them all)
    cor = samples[samples["shift"].isin(ALL)]
    assert cor["kept"].all() and cor["clip_text"].isna().all()

    ce = pd.read_csv(report / "corruption_error.csv")
    means = ce[ce["corruption"] == "mean"].set_index("classifier")
    assert means.loc["linear", "ce_baseline"] == pytest.approx(1.0)  # the baseline normalises to 1
    fps = means["fp_mean"]
    assert fps.notna().all() and fps.max() - fps.min() > 0.1, fps.to_dict()  # classifiers fail at different severities

    comp = pd.read_csv(report / "family_comparison.csv")
    assert set(comp["family"]) == {"slider", "corruption"} and len(comp) == 8
    rho = pd.read_csv(report / "family_comparison_spearman.csv")
    assert set(rho["measure"]) >= {"mean_accuracy_drop", "fp_relative"}
    import matplotlib.pyplot as plt
    from PIL import Image

    from pipeline.aggregate.report import png_bytes
    from pipeline.analyses import corruption, family_comparison

    severity = pd.read_csv(report / "corruption_severity_error.csv")
    for fig in (corruption._figure(severity), family_comparison._figure(comp)):
        png = Image.open(io.BytesIO(png_bytes(fig)))
        plt.close(fig)
        assert png.width > 500 and png.height > 300
    metrics = json.loads((report / "metrics.json").read_text())
    assert set(metrics["analyses"]) >= {"corruption_error", "family_comparison"}


@pytest.mark.slow
def test_status_counts_each_family_with_its_own_scales(world_output, capsys):
    # Slider trajectories hold 6 images, corruption ones 11 (clean + 5 severities at half
    # steps): the status adds them up, and a report over both families counts as aggregated.
    from pipeline.cli import main

    samples = pd.concat([pd.read_parquet(p) for p in (world_output / "samples").glob("*.parquet")])
    per_traj = samples.groupby("trajectory_id").size()
    assert set(per_traj) == {6, 11}
    capsys.readouterr()
    assert main(["status", str(world_output)]) == 0
    text = capsys.readouterr().out
    n, t = len(samples), samples["trajectory_id"].nunique()
    assert f"generated   {n}/{n} images ({t}/{t} trajectories)" in text
    assert "aggregated  yes" in text
