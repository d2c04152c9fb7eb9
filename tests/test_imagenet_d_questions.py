"""The released ImageNet-D ``questions/*.csv`` checked against the tree, and file names that are not UTF-8.

Issue 43, failures 3, 6 and 8: a questions file whose ``gt_category`` is not the image's
class folder, or that names a class the label space does not know, is refused (exit 2,
the first rows listed); a file that cannot be parsed (a field over 128 KiB, bytes that are
not UTF-8, a missing column, commas instead of tabs) is an error naming the file and line,
never a note; an image whose file name is not UTF-8 is left out with a note naming it, and
the evaluation goes on.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from pipeline import cli
from pipeline.labels import label_space
from pipeline.sources import SourceError, open_source

REPO = Path(__file__).resolve().parents[1]
HEADER = "image_dir\tgt_category\ttop1_pred_cate\ttop2_pred_cate"
# kind/folder/file -> (gt, top1, top2) as the release writes them
IMAGES = {
    "background/banana/a1.png": ("banana", "banana", "lemon"),
    "background/banana/a2.png": ("banana", "orange", "banana"),
    "background/chair/c1.png": ("chair", "bench", "chair"),
    "texture/binder_closed/b1.png": ("binder (closed)", "envelope", "wallet"),
}


def make_tree(root: Path, questions: dict[str, str] | None = None) -> Path:
    """A release-shaped tree of :data:`IMAGES`; ``questions``: file name -> its text (default: one
    background.csv and one texture.csv, consistent with the tree)."""
    rng = np.random.default_rng(0)
    for rel in IMAGES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)).save(root / rel)
    if questions is None:
        questions = {}
        for rel, cats in IMAGES.items():
            kind = rel.split("/")[0]
            questions.setdefault(f"{kind}.csv", HEADER + "\n")
            questions[f"{kind}.csv"] += "\t".join([rel, *cats]) + "\n"
    (root / "questions").mkdir(exist_ok=True)
    for name, text in questions.items():
        (root / "questions" / name).write_text(text, encoding="utf-8")
    return root


def background(*rows: str) -> str:
    return "\n".join([HEADER, *rows]) + "\n"


def tiny_config(tmp_path: Path) -> Path:
    """configs/tiny.yaml with its one small timm classifier, asset paths made absolute."""
    from pipeline.demo.assets import ensure_tiny_assets

    ensure_tiny_assets()
    text = (REPO / "configs" / "tiny.yaml").read_text().replace("../assets", str(REPO / "assets"))
    raw = yaml.safe_load(text)
    raw["classifiers"] = [c for c in raw["classifiers"] if c["name"] == "tiny-resnet"]
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_consistent_questions_are_attached(tmp_path):
    src = open_source(str(make_tree(tmp_path / "r")), label_space("imagenet"))
    assert src.n_images == 4
    asked = [p for r in src.rows for p in (r.get("params") or []) if p]
    assert len(asked) == 4 and any("questions/: 4 questions, 4 of 4 images" in n for n in src.notes)


# --------------------------------------------------------------------------- failure 3
def test_gt_category_of_another_class_is_refused(tmp_path):
    """A banana image whose row says "chair": refused, naming the file, the line and both classes."""
    text = background(
        "background/banana/a1.png\tbanana\tbanana\tlemon",
        "background/banana/a2.png\tchair\tbench\tbanana",  # line 3: not the folder's class
        "background/chair/c1.png\tchair\tbench\tchair",
    )
    root = make_tree(tmp_path / "r", {"background.csv": text})
    with pytest.raises(SourceError) as err:
        open_source(str(root), label_space("imagenet"))
    msg = str(err.value)
    assert "background.csv:3" in msg and "'chair'" in msg and "banana" in msg
    assert "background.csv:2" not in msg and "background.csv:4" not in msg


def test_many_disagreeing_rows_list_the_first_and_count_the_rest(tmp_path):
    rows = [f"background/banana/a{i}.png\tchair\tbench\tbanana" for i in (1, 2)]
    rows += ["background/chair/c1.png\tbanana\tbanana\tlemon"]
    rows += [f"texture/binder_closed/b1.png\tpen\tpen\tlemon"]
    root = make_tree(tmp_path / "r", {"background.csv": background(*rows[:3]), "texture.csv": background(rows[3])})
    with pytest.raises(SourceError) as err:
        open_source(str(root), label_space("imagenet"))
    msg = str(err.value)
    assert msg.count("is in the class folder") == 4
    assert "4 question rows" in msg and "texture.csv:2" in msg


def test_unknown_category_names_are_refused(tmp_path):
    text = background(
        "background/banana/a1.png\tbanana\tspaceship\tlemon",  # line 2: not an ImageNet-D class
        "background/banana/a2.png\tbananna\tbanana\tlemon",  # line 3: a misspelt truth
    )
    root = make_tree(tmp_path / "r", {"background.csv": text})
    with pytest.raises(SourceError) as err:
        open_source(str(root), label_space("imagenet"))
    msg = str(err.value)
    assert "background.csv:2" in msg and "'spaceship'" in msg
    assert "background.csv:3" in msg and "'bananna'" in msg and "'banana'" in msg  # a close name offered


def test_a_distractor_equal_to_the_truth_is_refused(tmp_path):
    """eval_imagenet_d.py asserts that the distractor (top-1, else top-2) is not the truth."""
    root = make_tree(tmp_path / "r", {"background.csv": background("background/banana/a1.png\tbanana\tbanana\tbanana")})
    with pytest.raises(SourceError, match=r"background\.csv:2.*distractor"):
        open_source(str(root), label_space("imagenet"))


def test_evaluate_exits_2_before_anything_is_written(tmp_path, capsys):
    root = make_tree(tmp_path / "r", {"background.csv": background("background/banana/a1.png\tchair\tchair\tbench")})
    rc = cli.main(["evaluate", str(root), "--config", str(tiny_config(tmp_path)), "--output", str(tmp_path / "o"),
                   "--runner", "local"])
    err = capsys.readouterr().err
    assert rc == 2 and "background.csv:2" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- failure 8
BIG = "x" * (128 * 1024 + 10)


@pytest.mark.parametrize(
    "content, where, says",
    [
        (background("background/banana/a1.png\tbanana\tbanana\tlemon", f"background/banana/a2.png\tbanana\t{BIG}\tx"),
         "background.csv:3", "field"),
        (background("background/banana/a1.png\tbanana\tbanana\tlemon").encode("utf-16"), "background.csv:1", "UTF-8"),
        (background("background/banana/a1.png\tbanana\tbanana\tlemon", "background/banana/a2.png\tbanana\tcaf\xe9\tx"
                    ).encode("latin-1"), "background.csv:3", "UTF-8"),
        ("image_dir\tgt_category\ttop1_pred_cate\nbackground/banana/a1.png\tbanana\tlemon\n", "background.csv:1",
         "top2_pred_cate"),
        (background("background/banana/a1.png\tbanana\tbanana\tlemon").replace("\t", ","), "background.csv:1",
         "commas"),
        (background("background/banana/a1.png\tbanana\tbanana\tlemon\textra"), "background.csv:2", "5 fields"),
        (background("background/banana/a1.png\tbanana\tbanana\tlemon", "background/banana/a2.png\tbanana\0\tx\ty"),
         "background.csv:3", "NUL"),
    ],
    ids=["field-over-128k", "utf-16", "latin-1", "missing-column", "commas", "extra-field", "nul-byte"],
)
def test_unparseable_questions_file_is_an_error_naming_file_and_line(tmp_path, content, where, says):
    root = make_tree(tmp_path / "r", {})
    path = root / "questions" / "background.csv"
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    with pytest.raises(SourceError) as err:
        open_source(str(root), label_space("imagenet"))
    msg = str(err.value)
    assert f"{root}/questions/{where}" in msg and says in msg


@pytest.mark.parametrize("kind", ["field-over-128k", "utf-16", "commas"])
def test_unparseable_questions_file_exits_2_from_the_cli(tmp_path, capsys, kind):
    text = {
        "field-over-128k": background(f"background/banana/a1.png\tbanana\t{BIG}\tlemon").encode(),
        "utf-16": background("background/banana/a1.png\tbanana\tbanana\tlemon").encode("utf-16"),
        "commas": background("background/banana/a1.png\tbanana\tbanana\tlemon").replace("\t", ",").encode(),
    }[kind]
    root = make_tree(tmp_path / "r", {})
    (root / "questions" / "background.csv").write_bytes(text)
    rc = cli.main(["evaluate", str(root), "--config", str(tiny_config(tmp_path)), "--output", str(tmp_path / "o"),
                   "--runner", "local"])
    err = capsys.readouterr().err
    assert rc == 2 and "questions/background.csv:" in err and "Traceback" not in err


# --------------------------------------------------------------------------- failure 6
def _bad_name(folder: Path) -> bytes:
    path = os.path.join(os.fsencode(folder), b"\xffbad\xfe.png")
    try:
        Image.new("RGB", (24, 24)).save(path)
    except OSError:  # a file system that only stores UTF-8 names
        pytest.skip("this file system refuses file names that are not UTF-8")
    return path


def test_a_file_name_that_is_not_utf8_is_left_out_with_a_note(tmp_path):
    root = make_tree(tmp_path / "r")
    bad = _bad_name(root / "background" / "banana")
    src = open_source(str(root), label_space("imagenet"))
    assert src.n_images == 4  # the four named images; the fifth is left out
    paths = [p for r in src.rows for p in r["paths"]]
    assert all(p.encode("utf-8") for p in paths)
    note = next(n for n in src.notes if "not UTF-8" in n)
    assert repr(bad) in note  # named as bytes, the way the file system spells it


def test_folders_source_leaves_it_out_too(tmp_path):
    root = tmp_path / "folders"
    for name in ("banana", "chair"):
        (root / name).mkdir(parents=True)
        Image.new("RGB", (24, 24)).save(root / name / "ok.png")
    bad = _bad_name(root / "banana")
    src = open_source(str(root), label_space("imagenet_d"))
    assert src.n_images == 2 and any(repr(bad) in n for n in src.notes)


def test_evaluate_goes_on_past_a_file_name_that_is_not_utf8(tmp_path, capsys):
    root = make_tree(tmp_path / "r")
    bad = _bad_name(root / "background" / "banana")
    out = tmp_path / "o"
    rc = cli.main(["evaluate", str(root), "--config", str(tiny_config(tmp_path)), "--output", str(out),
                   "--runner", "local"])
    said = capsys.readouterr()
    assert rc == 0, said.err
    assert repr(bad) in said.out
    import pandas as pd

    assert len(pd.read_parquet(out / "samples")) == 4
