"""The released ImageNet-D ``questions/*.csv``: per image, the categories of its VQA question.

Each file (``questions/background.csv``, ...) is tab-separated with the columns
``image_dir`` (the image relative to the release root, e.g. ``background/banana/1.jpg``),
``gt_category``, ``top1_pred_cate`` and ``top2_pred_cate`` (CLIP's two best guesses), as
the release's ``eval_imagenet_d.py`` reads them.  :func:`attach_questions` stores each
image's question in its ``params`` (``{"question": {...}}``), so it travels with the image
through the load stage to a ``vlm`` classifier (:mod:`pipeline.models.vlm`), whose
``two_choice`` protocol then takes the distractor from the file, and into ``samples``.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
from typing import Any

QUESTIONS_DIR = "questions"
COLUMNS = ("image_dir", "gt_category", "top1_pred_cate", "top2_pred_cate")


def _key(path: str) -> str:
    """An image's identity across the file and the index: ``kind/class folder/file``."""
    return "/".join(path.replace("\\", "/").rstrip("/").split("/")[-3:])


def read_questions(fs: Any, root: str, notes: list[str] | None = None) -> dict[str, dict[str, str]]:
    """``{kind/folder/file: question}`` from every ``questions/*.csv`` under ``root`` ({} when none).

    A file without the release's columns is skipped, saying so in ``notes``.  Raises
    :class:`pipeline.sources.common.SourceError` naming the file and line of an empty value
    or an image listed twice.
    """
    from pipeline.sources.common import SourceError

    folder = posixpath.join(root, QUESTIONS_DIR)
    if not fs.isdir(folder):
        return {}
    out: dict[str, dict[str, str]] = {}
    for path in sorted(p for p in fs.ls(folder, detail=False) if p.endswith(".csv")):
        text = fs.cat_file(path).decode("utf-8-sig")
        reader = csv.DictReader(io.StringIO(text), delimiter="\t")
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            if notes is not None:
                notes.append(f"{path}: skipped, not a questions file (no tab-separated column(s) {', '.join(missing)})")
            continue
        kind = posixpath.splitext(posixpath.basename(path))[0]
        for line, row in enumerate(reader, start=2):
            if any(not (row.get(c) or "").strip() for c in COLUMNS):
                raise SourceError(f"{path}:{line}: empty or missing values in {', '.join(COLUMNS)}")
            key = _key(row["image_dir"].strip())
            if key in out:
                raise SourceError(f"{path}:{line}: image {row['image_dir']!r} has a question already")
            out[key] = {"file": kind, **{c: row[c].strip() for c in COLUMNS[1:]}}
    return out


def attach_questions(fs: Any, root: str, rows: list[dict[str, Any]]) -> str | None:
    """Store each image's released question in the rows' ``params``; returns a note for the run, or None."""
    notes: list[str] = []
    questions = read_questions(fs, root, notes)
    if not questions:
        return "; ".join(notes) or None
    asked = 0
    for row in rows:
        params = []
        for path in row["paths"]:
            q = questions.get(_key(path))
            asked += q is not None
            params.append(None if q is None else json.dumps({"question": q}, sort_keys=True))
        row["params"] = params
    n_images = sum(len(r["paths"]) for r in rows)
    notes.append(
        f"{QUESTIONS_DIR}/: {len(questions)} questions, {asked} of {n_images} images have one; "
        "vlm classifiers take the two-choice distractor from them"
    )
    return "; ".join(notes)
