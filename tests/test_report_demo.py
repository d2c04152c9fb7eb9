"""The report of the demo build: strips per shift, marks = failure points, intervals, compare,
and the page in headless Chromium.

The session's one demo build (``demo_world`` in conftest) serves the tests of what the build
wrote; the marks and the intervals, functions of the samples and predictions tables, are
checked on a synthetic output of the demo's plan aggregated here (``synthetic``: made-up
pixels and predictions, failure points at every scale, some images filtered).
"""

from __future__ import annotations

import base64
import json
import shutil
import tarfile
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from pipeline.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(demo_world) -> Path:
    return demo_world  # read-only here: tests that change an output copy it first


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    """configs/demo.yaml's plan written by the write stage with made-up pixels
    (``hostile.synthetic_output``), then aggregated: each trajectory fails at a scale of its
    own (or never); in a quarter of the trajectories the image at the fourth scale is filtered
    (those are incomplete: the metrics leave them out, the strips show them)."""
    from hostile import synthetic_output

    out = tmp_path_factory.mktemp("report-synthetic") / "out"
    synthetic_output(out, Path(__file__).resolve().parents[1] / "configs" / "demo.yaml", per_shard=4,
                     correct=lambda c, seed, shift, i: i < 1 + (c + seed + len(shift)) % 6,
                     kept=lambda c, seed, shift, i: not ((c + seed) % 4 == 0 and i == 3))
    assert main(["aggregate", str(out)]) == 0
    return out


class Page(HTMLParser):
    """Elements of index.html: images, strip overlay cells, links, ids."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.imgs: list[dict] = []
        self.cells: list[dict] = []
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.figure_shift: str | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "figure" and "data-shift" in a:
            self.figure_shift = a["data-shift"]
        if tag == "img":
            self.imgs.append({**a, "shift": self.figure_shift})
        if tag == "div" and "cell" in a.get("class", "").split() and "data-sample" in a:
            self.cells.append({**a, "shift": self.figure_shift})
        if tag == "a" and "href" in a:
            self.links.append(a["href"])


def read_tables(out: Path, kind: str) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(p) for p in sorted((out / kind).glob("*.parquet"))], ignore_index=True)


def test_every_shift_has_a_strip_image_under_report(demo):
    report = demo / "report"
    page = Page((report / "index.html").read_text())
    samples = read_tables(demo, "samples")
    strips = {img["shift"]: img["src"] for img in page.imgs if img["src"].startswith("strip_")}
    assert set(strips) == set(samples["shift"])
    from PIL import Image

    for shift, src in strips.items():
        assert (report / src).is_file()
        with Image.open(report / src) as im:
            img = next(i for i in page.imgs if i["src"] == src)
            assert im.size == (int(img["width"]), int(img["height"]))
    for img in page.imgs:  # every image the page shows is a file of the report, none inline
        assert not img["src"].startswith("data:") and (report / img["src"]).is_file(), img["src"]
    for href in page.links:  # contents links point at ids, file links at files
        assert href[1:] in page.ids if href.startswith("#") else (report / href).is_file(), href


def test_marks_match_the_failure_points(synthetic):
    from pipeline.aggregate.images import ImageReader
    from pipeline.aggregate.metrics import failure_points
    from pipeline.aggregate.run import load_output_config
    from pipeline.analyses import strips
    from pipeline.aggregate.analysis import AnalysisContext
    from pipeline.io.store import OutputStore

    report = synthetic / "report"
    samples, preds = read_tables(synthetic, "samples"), read_tables(synthetic, "predictions")
    cfg = load_output_config(OutputStore(str(synthetic)))
    fps = failure_points(samples, preds, cfg.benchmark.scales)
    fp_of = {(t, c): f for t, c, f in zip(fps["trajectory_id"], fps["classifier"], fps["failure_point"])}

    page = Page((report / "index.html").read_text())
    assert len(page.cells) == 3 * cfg.aggregate.strips.count * len(cfg.benchmark.scales)
    kept = samples.set_index("sample_id")["kept"]
    n_marks = 0
    for cell in page.cells:
        tid, scale = cell["data-trajectory"], float(cell["data-scale"])
        marks = [m for m in cell["data-marks"].split(",") if m]
        expected = [c.name for c in cfg.classifiers if fp_of.get((tid, c.name)) == scale]
        assert marks == expected, (tid, scale)
        n_marks += len(marks)
        filtered = "filtered" in cell["class"].split()
        assert filtered == (not kept[cell["data-sample"]])
        if filtered:  # the failing detectors are named, and are those not above threshold
            row = samples.set_index("sample_id").loc[cell["data-sample"]]
            th = cfg.filter.thresholds
            failing = [k for k in ("clip_text", "clip_shift_text", "clip_image", "dino_image") if not row[k] > getattr(th, k)]
            assert cell["data-failing"].split(",") == failing and "failing detectors: " + ", ".join(failing) in cell["title"]
    assert n_marks > 0
    table = pd.read_csv(report / "strips.csv")
    for t, c, f in zip(table["trajectory_id"], table["classifier"], table["failure_point"]):
        assert (pd.isna(f) and pd.isna(fp_of[(t, c)])) or f == fp_of[(t, c)]

    # With every trajectory on the sheets the marks add up to failure_points.csv.
    cfg_all = cfg.model_copy(update={"aggregate": cfg.aggregate.model_copy(update={"strips": cfg.aggregate.strips.model_copy(update={"count": 200})})})
    store = OutputStore(str(synthetic))
    result = strips.run(AnalysisContext(cfg_all, samples, preds, read_image=ImageReader(store, samples)))
    full = Page(result.html)
    counts: dict[tuple[str, str, float], int] = {}
    for cell in full.cells:
        for m in filter(None, cell["data-marks"].split(",")):
            key = (m, cell["shift"], float(cell["data-scale"]))
            counts[key] = counts.get(key, 0) + 1
    fpt = pd.read_csv(report / "failure_points.csv")
    fpt = fpt[fpt["shift"] != "all"]
    assert fpt["fp_count"].sum() == sum(counts.values()) > 0
    for c, s, sc, n in zip(fpt["classifier"], fpt["shift"], fpt["scale"], fpt["fp_count"]):
        assert counts.get((c, s, float(sc)), 0) == n, (c, s, sc)


def test_csvs_carry_bootstrap_intervals(synthetic):
    report = synthetic / "report"
    summary = pd.read_csv(report / "summary.csv")
    fpt = pd.read_csv(report / "failure_points.csv")
    acc = pd.read_csv(report / "accuracy.csv")
    for df, col in ((summary, "fp_avg"), (summary, "acc_drop_2500"), (fpt, "fp_ratio"), (acc, "accuracy_drop")):
        low, high = df[f"{col}_ci_low"], df[f"{col}_ci_high"]
        ok = df[col].notna()
        assert ((low[ok] <= df[col][ok] + 1e-12) & (df[col][ok] <= high[ok] + 1e-12)).all(), col
    assert (summary["fp_avg_ci_high"] > summary["fp_avg_ci_low"]).any()
    pairwise = pd.read_csv(report / "pairwise.csv")
    n = len(summary)
    assert len(pairwise) == 2 * n * (n - 1) // 2 and set(pairwise["excludes_zero"]) <= {True, False}
    doc = json.loads((report / "metrics.json").read_text())
    assert len(doc["pairwise"]) == len(pairwise) and "fp_avg_ci_low" in doc["summary"][0]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("report"))
    return dst


def test_compare_writes_one_report_and_refuses_other_benchmarks(demo, tmp_path, capsys):
    other = _copy(demo, tmp_path / "again")
    assert main(["compare", str(demo), str(other), "--output", str(tmp_path / "cmp"), "--labels", "zoo,new"]) == 0
    index = tmp_path / "cmp" / "index.html"
    text = index.read_text()
    assert "zoo.cnn" in text and "new.cnn" in text and "Outputs compared" in text
    page = Page(text)
    assert all((tmp_path / "cmp" / img["src"]).is_file() for img in page.imgs)
    summary = pd.read_csv(tmp_path / "cmp" / "summary.csv").set_index("classifier")
    # the same predictions on the same images: identical rows for both labels
    assert summary.loc["zoo.vit", "fp_avg"] == summary.loc["new.vit", "fp_avg"]

    # other scales
    scales = _copy(demo, tmp_path / "scales")
    doc = json.loads((scales / "config.json").read_text())
    doc["config"]["benchmark"]["scales"] = [0, 0.5, 1.0, 1.5, 2.0, 3.0]
    (scales / "config.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["compare", str(demo), str(scales), "--output", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "different scales" in err and "2.5" in err and "3" in err

    # other images at the same coordinates (one image replaced in its tar)
    pixels = _copy(demo, tmp_path / "pixels")
    tar_path = sorted((pixels / "images").glob("*.tar"))[0]
    with tarfile.open(tar_path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    from PIL import Image
    import io

    name, data = next((m.name, d) for m, d in members if m.name.endswith(".png"))
    im = Image.open(io.BytesIO(data)).convert("RGB")
    im.putpixel((0, 0), (255, 0, 0) if im.getpixel((0, 0)) != (255, 0, 0) else (0, 255, 0))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    with tarfile.open(tar_path, "w") as tar:
        for m, d in members:
            d = buf.getvalue() if m.name == name else d
            m.size = len(d)
            tar.addfile(m, io.BytesIO(d))
    capsys.readouterr()
    assert main(["compare", str(demo), str(pixels), "--output", str(tmp_path / "y"), "--image-check", "0"]) == 2
    err = capsys.readouterr().err
    assert "different images" in err and name[: -len(".png")] in err

    # fewer trajectories (a shard not committed)
    fewer = _copy(demo, tmp_path / "fewer")
    sorted((fewer / "manifest").glob("*.json"))[0].unlink()
    assert main(["compare", str(demo), str(fewer), "--output", str(tmp_path / "z")]) == 2
    assert "sample ids differ" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "z").exists()


# --------------------------------------------------------------------------- the page in a browser
CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium: apt-get install -y chromium")
def test_page_in_headless_chromium(demo, tmp_path):
    from test_serve_browser import Chromium

    browser = Chromium(tmp_path / "profile", tmp_path / "chromium.log")
    try:
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": 1366, "height": 768, "deviceScaleFactor": 1, "mobile": False})
        browser.send("Page.navigate", {"url": (demo / "report" / "index.html").as_uri()})
        browser.wait_for("document.readyState === 'complete'", what="the page")
        images = browser.js("[...document.images].map(i => [i.getAttribute('src'), i.complete && i.naturalWidth > 0])")
        assert images and all(ok for _, ok in images), [src for src, ok in images if not ok]
        assert sum(src.startswith("strip_") for src, _ in images) == 3
        # fits a laptop screen: no horizontal scrolling of the page
        assert browser.js("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
        toc = browser.js("[...document.querySelectorAll('nav.toc a')].map(a => a.getAttribute('href'))")
        assert len(toc) >= 10 and all(browser.js(f"!!document.getElementById({json.dumps(h[1:])})") for h in toc)
        # the ranking table sorts by a clicked column
        col = browser.js("[...document.querySelectorAll('#ranking th')].findIndex(th => th.textContent === 'classifier')")
        browser.js(f"document.querySelectorAll('#ranking th')[{col}].click()")
        names = browser.js(f"[...document.querySelectorAll('#ranking tbody tr')].map(r => r.cells[{col}].textContent)")
        assert names == sorted(names)
        browser.js(f"document.querySelectorAll('#ranking th')[{col}].click()")
        assert browser.js(f"[...document.querySelectorAll('#ranking tbody tr')].map(r => r.cells[{col}].textContent)") == sorted(names, reverse=True)
        # hovering a greyed image names its failing detectors
        title = browser.js("(document.querySelector('.sheet .cell.filtered') || {}).title")
        assert title and "failing detectors" in title
        # the overlay lies on its image
        box = browser.js("(() => { const s = document.querySelector('.sheet'); const i = s.querySelector('img').getBoundingClientRect();"
                         " const r = s.getBoundingClientRect(); return [i.width, r.width, i.height, r.height]; })()")
        assert abs(box[0] - box[1]) < 1 and abs(box[2] - box[3]) < 1
        shot = browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        png = base64.b64decode(shot["data"])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
        (tmp_path / "report.png").write_bytes(png)
        assert browser.problems() == []
    finally:
        browser.close()
