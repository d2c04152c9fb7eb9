"""The released ImageNet-D ``questions/*.csv``: per image, the categories of its VQA question.

Each file (``questions/background.csv``, ...) is tab-separated UTF-8 with the columns
``image_dir`` (the image relative to the release root, e.g. ``background/banana/1.jpg``),
``gt_category``, ``top1_pred_cate`` and ``top2_pred_cate`` (CLIP's two best guesses), as
the release's ``eval_imagenet_d.py`` reads them (``pandas.read_csv(..., delimiter='\\t')``).
:func:`attach_questions` stores each image's question in its ``params``
(``{"question": {...}}``), so it travels with the image through the load stage to a ``vlm``
classifier (:mod:`pipeline.models.vlm`) whose ``two_choice`` protocol takes its distractor
from the release (``distractors: questions``), and into ``samples``.

A questions file is checked before anything runs, and every problem is a
:class:`pipeline.sources.common.SourceError` naming the file and line:

* parsing: bytes that are not UTF-8, a NUL byte, a field over the ``csv`` module's 128 KiB,
  a header without the four columns (commas instead of tabs are named as such), a row with
  more or fewer fields than the header, an empty value, an image listed twice;
* against the tree: a category that is not one of the 113 classes, a row whose
  ``gt_category`` is not the class of the folder the image is in, a distractor (the top-1,
  or the top-2 when the top-1 is the truth) that is the truth (``eval_imagenet_d.py``
  asserts it is not).  The first :data:`SHOWN` such rows are listed, with the count.

Rows naming images the tree does not hold are counted in the run's note, not refused (a
partial copy of the release is a valid source).
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import posixpath
from dataclasses import dataclass
from typing import Any

QUESTIONS_DIR = "questions"
COLUMNS = ("image_dir", "gt_category", "top1_pred_cate", "top2_pred_cate")
SHOWN = 10  # rows listed in an error about rows
DISTRACTOR_SOURCE = "questions"  # the protocol's ``distractors`` value that reads these files


@dataclass(frozen=True)
class QuestionRow:
    """One row of a questions file and where it is (``path:line``)."""

    where: str
    file: str  # the file's stem: the nuisance kind it was written for
    image_dir: str
    gt_category: str
    top1_pred_cate: str
    top2_pred_cate: str

    @property
    def distractor(self) -> str:
        """``eval_imagenet_d.py``: the top-1 guess, or the top-2 when the top-1 is the truth."""
        return self.top1_pred_cate if self.top1_pred_cate != self.gt_category else self.top2_pred_cate

    def params(self) -> dict[str, str]:
        return {"file": self.file, **{c: getattr(self, c) for c in COLUMNS[1:]}}


def _error(message: str) -> Exception:
    from pipeline.sources.common import SourceError

    return SourceError(message)


def image_key(path: str) -> str:
    """An image's identity across the file and the index: ``kind/class folder/file``."""
    return "/".join(path.replace("\\", "/").rstrip("/").split("/")[-3:])


def _decode(path: str, data: bytes) -> str:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        bom = " (it starts with a UTF-16 byte-order mark)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise _error(
            f"{path}:{line}: not UTF-8 text: byte {data[err.start]:#04x} at offset {err.start}{bom}; "
            "the release's questions files are UTF-8, tab-separated"
        ) from None
    if "\0" in text:
        raise _error(f"{path}:{text.count(chr(10), 0, text.index(chr(0))) + 1}: a NUL byte; not a questions file")
    return text


def parse_questions(path: str, data: bytes) -> list[QuestionRow]:
    """The rows of one questions file (``path`` only names it); SourceError naming the line otherwise."""
    text = _decode(path, data)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t")
    rows: list[QuestionRow] = []
    kind = posixpath.splitext(posixpath.basename(path))[0]
    try:
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            commas = len(header) == 1 and header[0].count(",") >= len(COLUMNS) - 1
            found = "commas instead of tabs: " if commas else ""
            raise _error(
                f"{path}:1: the header lacks the column(s) {', '.join(missing)}; a questions file is "
                f"tab-separated with the columns {', '.join(COLUMNS)} ({found}found {header!r:.200})"
            )
        at = {c: header.index(c) for c in COLUMNS}
        for fields in reader:
            line = reader.line_num
            if not fields or fields == [""]:
                continue  # a blank line, as pandas skips them
            if len(fields) != len(header):
                raise _error(f"{path}:{line}: {len(fields)} fields, the header has {len(header)} (tab-separated)")
            values = {c: fields[i].strip() for c, i in at.items()}
            empty = [c for c, v in values.items() if not v]
            if empty:
                raise _error(f"{path}:{line}: empty value(s) in {', '.join(empty)}")
            rows.append(QuestionRow(f"{path}:{line}", kind, **values))
    except csv.Error as err:  # a field over csv.field_size_limit(), an unterminated quote
        raise _error(f"{path}:{reader.line_num}: {err}") from None
    return rows


def read_questions(fs: Any, root: str) -> dict[str, QuestionRow]:
    """``{kind/folder/file: row}`` from every ``questions/*.csv`` under ``root`` ({} when none).

    Raises :class:`pipeline.sources.common.SourceError` naming the file and line of anything
    that cannot be parsed, and of an image listed twice.
    """
    folder = posixpath.join(root, QUESTIONS_DIR)
    if not fs.isdir(folder):
        return {}
    out: dict[str, QuestionRow] = {}
    for path in sorted(p for p in fs.ls(folder, detail=False) if p.endswith(".csv")):
        for row in parse_questions(path, fs.cat_file(path)):
            key = image_key(row.image_dir)
            if key in out:
                raise _error(f"{row.where}: image {row.image_dir!r} has a question already ({out[key].where})")
            out[key] = row
    return out


def _class_lookup() -> dict[str, int]:
    """Category text (the 113 names, lower case, and the release's folder names) -> ImageNet-D class id."""
    from pipeline.labels import imagenet_d, label_space

    space = label_space("imagenet_d")
    names = {space.name(i).lower(): i for i in range(len(space))}
    return {**{f.lower(): i for f, i in imagenet_d.folder_ids().items()}, **names}


def _unknown(value: str, lookup: dict[str, int]) -> str:
    close = difflib.get_close_matches(value.lower(), list(lookup), n=3, cutoff=0.6)
    return f"{value!r} is not an ImageNet-D class" + (f" (close: {', '.join(map(repr, close))})" if close else "")


def check_rows(questions: dict[str, QuestionRow], classes: dict[str, tuple[int, str]]) -> list[str]:
    """One line per row that names an unknown class, whose truth is not the class of the image's
    folder (``classes``: key -> (class id, folder name) of the images in the tree), or whose
    distractor is the truth."""
    lookup = _class_lookup()
    bad = []
    for key, row in questions.items():
        problems = [_unknown(v, lookup) for v in (row.gt_category, row.top1_pred_cate, row.top2_pred_cate)
                    if v.lower() not in lookup]
        if problems:
            bad.append(f"{row.where}: {'; '.join(dict.fromkeys(problems))}")
            continue
        truth = lookup[row.gt_category.lower()]
        if key in classes and classes[key][0] != truth:
            bad.append(
                f"{row.where}: {row.image_dir!r} is in the class folder {classes[key][1]!r}, "
                f"but its gt_category is {row.gt_category!r}"
            )
        elif lookup[row.distractor.lower()] == truth:
            bad.append(
                f"{row.where}: the distractor (top1_pred_cate, or top2_pred_cate when the top-1 is the truth) "
                f"is the truth {row.gt_category!r}"
            )
    return bad


def attach_questions(fs: Any, root: str, rows: list[dict[str, Any]]) -> str | None:
    """Store each image's released question in the rows' ``params``; returns a note for the run, or None.

    Raises SourceError listing the first rows that disagree with the tree (:func:`check_rows`).
    """
    questions = read_questions(fs, root)
    if not questions:
        return None
    classes = {}
    for row in rows:
        for path in row["paths"]:
            classes[image_key(path)] = (int(row["class_id"]), image_key(path).split("/")[1])
    bad = check_rows(questions, classes)
    if bad:
        shown = "\n  ".join(bad[:SHOWN])
        more = f"\n  ... and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
        raise _error(
            f"{root}/{QUESTIONS_DIR}: {len(bad)} question rows disagree with the images or name unknown classes "
            f"(the first {min(len(bad), SHOWN)}):\n  {shown}{more}"
        )
    asked = 0
    for row in rows:
        params = []
        for path in row["paths"]:
            q = questions.get(image_key(path))
            asked += q is not None
            params.append(None if q is None else json.dumps({"question": q.params()}, sort_keys=True))
        row["params"] = params
    n_images = sum(len(r["paths"]) for r in rows)
    return (
        f"{QUESTIONS_DIR}/: {len(questions)} questions, {asked} of {n_images} images have one; "
        f"a two_choice vlm with distractors: {DISTRACTOR_SOURCE} asks them (an image without one is not asked)"
    )


def has_questions(rows: list[dict[str, Any]]) -> bool:
    """True when any row carries a released question in its ``params``."""
    for row in rows:
        for p in row.get("params") or ():
            if p and "question" in json.loads(p):
                return True
    return False


def check_distractor_sources(classifiers: list[dict[str, Any]], rows: list[dict[str, Any]], location: str) -> None:
    """Each vlm's distractor source fits the source being evaluated (ConfigError naming the key).

    Naming a classifier (``classifier:NAME``) for ``two_choice`` while the release's questions
    are present is refused: the release fixes each image's distractor, and taking another
    silently would not be its protocol.  ``questions`` on a source without any is refused
    too: no image could be asked.
    """
    from pipeline.config import ConfigError

    present = has_questions(rows)
    for entry in classifiers:
        protocol = entry.get("protocol") or {}
        if entry.get("kind") != "vlm" or protocol.get("kind") != "two_choice":
            continue
        source = protocol.get("distractors")
        where = f"classifiers[{entry['name']}].protocol.distractors"
        if present and isinstance(source, str) and source.startswith("classifier:"):
            raise ConfigError(
                f"{where}: {source!r}, but {location} holds the release's questions/*.csv, which fix each "
                f"image's distractor; set distractors: {DISTRACTOR_SOURCE} (ImageNet-D's protocol) or random"
            )
        if not present and source == DISTRACTOR_SOURCE:
            raise ConfigError(
                f"{where}: {DISTRACTOR_SOURCE!r}, but {location} has no questions (no {QUESTIONS_DIR}/*.csv "
                "naming its images); set distractors: classifier:NAME or random"
            )
