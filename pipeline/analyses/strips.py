"""Analysis ``strips``: per shift a contact sheet of trajectories (rows) across scales (columns).

What a benchmark made of images should show first: the images.  For every shift of the
build one PNG, ``report/strip_<shift>.png``, holds thumbnails of ``aggregate.strips.count``
trajectories at every scale of their family.  Under each thumbnail a row of small squares
marks the classifiers whose failure point (:func:`pipeline.aggregate.metrics.first_failure`)
is that scale, one square position and colour per classifier (the legend on the page;
the colours of the report's plots).  Images the OOC filter removed are drawn greyed and
faded; on the page, hovering one names the detectors that failed it (score not above its
threshold in ``filter.thresholds``).  Marks exist only on complete trajectories, the only
ones the metrics evaluate; a row of an incomplete trajectory says so.

Which trajectories (``aggregate.strips.choice``): ``random`` (seeded by ``seed`` and the
shift name, so a sheet does not change between aggregations), ``most_robust`` /
``least_robust`` (largest / smallest mean failure point over the classifiers, never-failed
trajectories counted at the margin's maximum scale; incomplete trajectories only fill
what is left).  ``count: 0`` turns the strips off.

Files: ``strip_<shift>.png`` per shift and ``strips.csv`` (``shift, row, trajectory_id,
complete, classifier, failure_point``: what the marks show).  The page overlays each
sheet with an HTML grid (title attributes, ``data-*`` for tests and scripts).
"""

from __future__ import annotations

import html
import io
import math
import re
import zlib
from typing import Any, NamedTuple, Sequence

import numpy as np
import pandas as pd

from pipeline.aggregate.analysis import AnalysisContext, AnalysisResult, read_images
from pipeline.plan.schema import SCORE_COLUMNS

STRIPS_CSV_COLUMNS = ["shift", "row", "trajectory_id", "complete", "classifier", "failure_point"]

# Sheet geometry (pixels, besides the thumbnail edge).
PAD = 4
LABEL_W = 118
HEADER_H = 18
MARK = 7  # edge of a failure mark square


def strip_file(shift: str) -> str:
    return f"strip_{re.sub(r'[^A-Za-z0-9_.-]+', '_', shift)}.png"


def _hex(rgba: Sequence[float]) -> str:
    return "#" + "".join(f"{round(255 * v):02x}" for v in rgba[:3])


def choose(
    trajectories: pd.DataFrame, fps: pd.DataFrame, count: int, choice: str, seed: int, shift: str, margin_max: float
) -> list[str]:
    """Ids of the trajectories on a shift's sheet, in display order.

    ``trajectories``: ``trajectory_id, class_id, seed, complete`` of the shift;
    ``fps``: the failure points of its evaluated trajectories.
    """
    ids = sorted(trajectories["trajectory_id"].astype(str))
    if choice != "random":
        # Ranked order is the message of these sheets: keep it.
        censored = fps.assign(fp=fps["failure_point"].fillna(margin_max)).groupby("trajectory_id")["fp"].mean()
        ranked = sorted(censored.index, key=lambda t: (-censored[t] if choice == "most_robust" else censored[t], t))
        rest = [t for t in ids if t not in censored.index]
        return [str(t) for t in (ranked + rest)[:count]]
    if count >= len(ids):
        chosen = ids
    else:
        rng = np.random.default_rng([seed, zlib.crc32(shift.encode())])
        chosen = [ids[i] for i in rng.choice(len(ids), size=count, replace=False)]
    order = trajectories.set_index("trajectory_id").loc[chosen].sort_values(["class_id", "seed"]).index
    return [str(t) for t in order]


def failing_detectors(row: Any, thresholds: Any) -> list[str]:
    """Detectors whose score is not above its threshold (the filter's pass rule)."""
    out = []
    for name in SCORE_COLUMNS:
        value = row.get(name)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        if not value > getattr(thresholds, name):
            out.append(name)
    return out


def _thumb(data: bytes, px: int, filtered: bool):
    from PIL import Image, ImageOps

    img = Image.open(io.BytesIO(data)).convert("RGB")
    resample = Image.NEAREST if max(img.size) < px else Image.LANCZOS
    img = ImageOps.contain(img, (px, px), method=resample)
    if filtered:
        grey = ImageOps.grayscale(img).convert("RGB")
        img = Image.blend(grey, Image.new("RGB", grey.size, (255, 255, 255)), 0.55)
    canvas = Image.new("RGB", (px, px), (255, 255, 255))
    canvas.paste(img, ((px - img.width) // 2, (px - img.height) // 2))
    return canvas


def render_sheet(
    rows: list[dict[str, Any]], scales: Sequence[float], images: dict[str, bytes], classifiers: list[str],
    colours: dict[str, str], px: int,
) -> tuple[bytes, dict[str, Any]]:
    """One shift's sheet as PNG bytes, and its geometry (for the page's overlay).

    ``rows``: per trajectory ``label`` and ``cells`` (per scale ``sample_id`` or None,
    ``filtered``, ``marks``: classifiers failing there).
    """
    from PIL import Image, ImageDraw, ImageFont

    per = max(1, px // (MARK + 2))  # marks per line under a thumbnail
    mark_h = math.ceil(len(classifiers) / per) * (MARK + 2) + 1
    cell_w, cell_h = px + PAD, px + mark_h + PAD
    width = LABEL_W + len(scales) * cell_w + PAD
    height = HEADER_H + len(rows) * cell_h + PAD
    sheet = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    for j, scale in enumerate(scales):
        draw.text((LABEL_W + j * cell_w + 2, 3), f"scale {scale:g}", fill=(60, 60, 60), font=font)
    for i, row in enumerate(rows):
        y = HEADER_H + i * cell_h
        for k, line in enumerate(row["label"].split("\n")[:3]):
            draw.text((PAD, y + 4 + 12 * k), line[:19], fill=(40, 40, 40), font=font)
        for j, cell in enumerate(row["cells"]):
            x = LABEL_W + j * cell_w
            if cell["sample_id"] is None:
                draw.rectangle([x, y, x + px - 1, y + px - 1], outline=(200, 200, 200))
                draw.line([x, y, x + px - 1, y + px - 1], fill=(200, 200, 200))
                continue
            sheet.paste(_thumb(images[cell["sample_id"]], px, cell["filtered"]), (x, y))
            for name in cell["marks"]:
                k = classifiers.index(name)
                mx, my = x + 1 + (k % per) * (MARK + 2), y + px + 2 + (k // per) * (MARK + 2)
                draw.rectangle([mx, my, mx + MARK - 1, my + MARK - 1], fill=colours[name], outline=(0, 0, 0))
    buf = io.BytesIO()
    sheet.save(buf, format="PNG")
    geometry = {"width": width, "height": height, "cell_w": cell_w, "cell_h": cell_h, "px": px, "mark_h": mark_h}
    return buf.getvalue(), geometry


def _pct(v: float, total: float) -> str:
    return f"{100.0 * v / total:.3f}%"


def sheet_html(shift: str, fname: str, rows: list[dict[str, Any]], scales: Sequence[float], geo: dict[str, Any]) -> str:
    """The sheet with a transparent overlay grid: one element per image and per row label."""
    e = html.escape
    w, h = geo["width"], geo["height"]
    parts = [
        f'<figure class="strip" data-shift="{e(shift, quote=True)}">',
        f'<div class="sheet" style="position:relative;display:inline-block;max-width:100%;width:{w}px">',
        f'<img src="{e(fname, quote=True)}" width="{w}" height="{h}" alt="trajectories of {e(shift, quote=True)}"'
        ' style="display:block;width:100%;height:auto;margin:0">',
    ]
    for i, row in enumerate(rows):
        y = HEADER_H + i * geo["cell_h"]
        style = f"left:0;top:{_pct(y, h)};width:{_pct(LABEL_W - 2, w)};height:{_pct(geo['px'], h)}"
        parts.append(
            f'<div class="cell label" style="{style}" data-trajectory="{e(row["trajectory_id"], quote=True)}"'
            f' data-complete="{int(row["complete"])}" title="{e(row["title"], quote=True)}"></div>'
        )
        for j, cell in enumerate(row["cells"]):
            if cell["sample_id"] is None:
                continue
            x = LABEL_W + j * geo["cell_w"]
            style = f"left:{_pct(x, w)};top:{_pct(y, h)};width:{_pct(geo['px'], w)};height:{_pct(geo['px'] + geo['mark_h'], h)}"
            cls = "cell filtered" if cell["filtered"] else "cell"
            parts.append(
                f'<div class="{cls}" style="{style}" data-trajectory="{e(row["trajectory_id"], quote=True)}"'
                f' data-sample="{e(cell["sample_id"], quote=True)}" data-scale="{scales[j]:g}"'
                f' data-failing="{e(",".join(cell["failing"]), quote=True)}"'
                f' data-marks="{e(",".join(cell["marks"]), quote=True)}" title="{e(cell["title"], quote=True)}"></div>'
            )
    parts.append("</div></figure>")
    return "".join(parts)


STRIP_CSS = (
    "<style>.sheet .cell{position:absolute;box-sizing:border-box}"
    ".sheet .cell:hover{outline:2px solid #1a73e8}.legend span.sw{display:inline-block;width:0.8em;height:0.8em;"
    "border:1px solid #000;margin:0 0.3em 0 0.9em;vertical-align:-0.05em}</style>"
)


def _legend(classifiers: list[str], colours: dict[str, str]) -> str:
    e = html.escape
    items = "".join(
        f'<span class="sw" style="background:{colours[c]}"></span>{i + 1}. {e(c)}' for i, c in enumerate(classifiers)
    )
    return (
        f'<p class="legend">Failure point marks (square position and colour under the image where the classifier first '
        f"fails):{items}. Greyed images were removed by the OOC filter (hover for the failing detectors).</p>"
    )


class _Sheet(NamedTuple):
    """One shift's sheet, planned before any image is read."""

    at: int  # its place in the page's sections
    shift: str
    rows: list[dict[str, Any]]
    wanted: list[str]  # sample ids of its images
    marks_rows: list[list[Any]]
    scales: list[float]
    classifiers: list[str]
    colours: dict[str, str]


def run(ctx: AnalysisContext) -> AnalysisResult:
    from pipeline.aggregate.report import colours_of
    from pipeline.analyses.cns import group_metrics

    spec = ctx.config.aggregate.strips
    result = AnalysisResult(title="Image strips")
    if spec.count == 0:
        result.title = ""
        return result
    if ctx.read_image is None or ctx.samples.empty:
        result.html = "<p>No images available to this aggregation.</p>"
        return result
    thresholds = ctx.config.filter.thresholds
    filter_on = ctx.config.filter.enabled and ctx.config.filter.kind != "none"
    table_rows: list[list[Any]] = []
    sections = [STRIP_CSS]
    sheets: list[_Sheet] = []
    for group, metrics in group_metrics(ctx):
        classifiers = list(metrics.classifiers) or [c.name for c in ctx.config.classifiers]
        colours = {c: _hex(v) for c, v in colours_of(classifiers).items()}
        sections.append(_legend(classifiers, colours))
        fps = metrics.failure_points
        samples = ctx.samples_of(group).copy()
        samples["milli"] = (samples["scale"].astype(float) * 1000).round().astype("int64")
        scales = list(metrics.scales)
        for shift in group.shifts:
            sub = samples[samples["shift"] == shift]
            if sub.empty:
                continue
            traj = sub.drop_duplicates("trajectory_id")[["trajectory_id", "class_id", "class_name", "seed"]].copy()
            complete = set(fps.loc[fps["shift"] == shift, "trajectory_id"])
            traj["complete"] = traj["trajectory_id"].isin(complete)
            chosen = choose(traj, fps[fps["shift"] == shift], spec.count, spec.choice, spec.seed, shift, metrics.margin_max_scale)
            rows, wanted, marks_rows = [], [], []
            info = traj.set_index("trajectory_id")
            for r, tid in enumerate(chosen):
                tf = fps[fps["trajectory_id"] == tid]
                fp_of = dict(zip(tf["classifier"], tf["failure_point"]))
                at = sub[sub["trajectory_id"] == tid].set_index("milli")
                cells = []
                for scale in scales:
                    m = round(scale * 1000)
                    if m not in at.index:
                        cells.append({"sample_id": None, "filtered": False, "marks": [], "failing": [], "title": ""})
                        continue
                    s = at.loc[m]
                    kept = bool(s["kept"]) if pd.notna(s["kept"]) else False
                    failing = failing_detectors(s, thresholds) if (not kept and filter_on) else []
                    marks = [c for c in classifiers if c in fp_of and pd.notna(fp_of[c]) and round(fp_of[c] * 1000) == m]
                    title = f"{s['sample_id']}: "
                    if kept:
                        title += "kept by the filter"
                    else:
                        n_pass = s.get("n_pass")
                        title += "removed by the filter; failing detectors: " + (", ".join(failing) or "none recorded")
                        if n_pass is not None and pd.notna(n_pass):
                            title += f" ({int(n_pass)} of 4 pass, {ctx.config.filter.min_pass} needed)"
                    if marks:
                        title += "; first wrong here: " + ", ".join(marks)
                    cells.append({"sample_id": str(s["sample_id"]), "filtered": not kept, "marks": marks,
                                  "failing": failing, "title": title})
                    wanted.append(str(s["sample_id"]))
                is_complete = bool(info.at[tid, "complete"])
                label = f"{info.at[tid, 'class_name']}\nseed {int(info.at[tid, 'seed'])}"
                if is_complete:
                    never = [c for c in classifiers if c in fp_of and pd.isna(fp_of[c])]
                    title = f"{tid}: complete trajectory" + (f"; never failed: {', '.join(never)}" if never else "")
                else:
                    label += "\nincomplete"
                    title = f"{tid}: incomplete (an image removed or missing): not evaluated, no marks"
                rows.append({"trajectory_id": tid, "complete": is_complete, "label": label, "title": title, "cells": cells})
                for c in classifiers:
                    if c in fp_of:
                        marks_rows.append([shift, r, tid, is_complete, c, fp_of[c]])
            sheets.append(_Sheet(len(sections), shift, rows, wanted, marks_rows, scales, classifiers, colours))
            sections.append("")  # the sheet's place, after its group's legend: filled below
    # The images of every sheet in one read (each tar read once); where that fails, each
    # sheet reads its own, and a sheet whose images cannot be read says so in its place.
    try:
        every = read_images(ctx.read_image, [sid for sheet in sheets for sid in sheet.wanted])
    except (KeyError, ValueError, OSError):
        every = None
    for sheet in sheets:
        head = f"<h3>{html.escape(sheet.shift)}</h3>"
        try:
            wanted = sheet.wanted
            images = {sid: every[sid] for sid in wanted} if every is not None else read_images(ctx.read_image, wanted)
        except (KeyError, ValueError, OSError) as err:  # a report without a sheet beats no report
            msg = err.args[0] if isinstance(err, KeyError) and err.args else err
            sections[sheet.at] = f"{head}<p>No strip: {html.escape(str(msg))}</p>"
            continue
        table_rows.extend(sheet.marks_rows)
        png, geo = render_sheet(sheet.rows, sheet.scales, images, sheet.classifiers, sheet.colours, spec.thumb_px)
        fname = strip_file(sheet.shift)
        result.files[fname] = png
        sections[sheet.at] = head + sheet_html(sheet.shift, fname, sheet.rows, sheet.scales, geo)
    how = {"random": f"chosen at random (seed {spec.seed})", "most_robust": "the most robust (latest failure points)",
           "least_robust": "the least robust (earliest failure points)"}[spec.choice]
    sections.insert(1, f"<p>Per shift, {spec.count} trajectories {how}; rows are trajectories, columns scales. "
                       "Hover an image for its sample id, filter decision and failures.</p>")
    result.tables["strips"] = pd.DataFrame(table_rows, columns=STRIPS_CSV_COLUMNS)
    result.html = "\n".join(sections)
    return result
