"""cnsbench digest: an output's content digest, and whether two outputs hold the same."""

from __future__ import annotations

import json

from hostile import synthetic_output, tiny_cfg_path

from pipeline.cli import main
from pipeline.io.digest import output_digest


def test_digest_compares_content_not_shard_layout(tmp_path, capsys):
    cfg = tiny_cfg_path(tmp_path)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    synthetic_output(a, cfg, per_shard=2)
    synthetic_output(b, cfg, per_shard=4)  # the same rows in other shards
    synthetic_output(c, cfg, correct=lambda *_: True)  # the same images, other predictions
    capsys.readouterr()
    assert main(["digest", str(a)]) == 0
    assert json.loads(capsys.readouterr().out) == output_digest(str(a))
    assert main(["digest", str(a), str(b)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("the same output")
    assert main(["digest", str(a), str(c)]) == 1
    out = capsys.readouterr().out
    assert out.rstrip().endswith("different: predictions")
    assert "images " in out and out.count("equal") == 2


def test_digest_of_something_that_is_no_output_exits_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["digest", str(tmp_path / "nowhere")]) == 2
    assert "nowhere: not found" in capsys.readouterr().err
    assert main(["digest", str(tmp_path / "empty")]) == 2
    assert "empty: no committed shards" in capsys.readouterr().err
