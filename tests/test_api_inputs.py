"""The Python API's own words for bad input: each case gives its input and checks the error.

Unknown runners, a configured classifier passed as a held model to ``refine``, a preprocess
that fits none of its documented forms, ``card``'s ``refine=``, messages that name the API's
arguments (the command keeps its flags), and no model library's progress bar without ``-v``.
Each check runs against a synthetic output of the demo's plan (``synthetic_demo``: its config
and made-up images, written by the write stage), since every refusal comes before a model
runs; nothing here writes to it (its bytes are compared).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from shared_bench import tree_digest

import cnsbench
from pipeline.errors import CnsbenchError

REPO = Path(__file__).resolve().parents[1]
PRE = {"resize": 32, "crop": 32, "interpolation": "bilinear", "mean": [0.5] * 3, "std": [0.5] * 3}


class Tiny:
    def __call__(self, x):
        import torch

        return torch.zeros(x.shape[0], 10)


@pytest.fixture()
def bench(synthetic_demo):
    before = tree_digest(synthetic_demo)
    yield Path(synthetic_demo)
    assert tree_digest(synthetic_demo) == before


def test_an_unknown_runner_names_the_api_argument(bench, tmp_path):
    calls = [
        lambda: cnsbench.evaluate("cnn", bench, output=tmp_path / "ev", runner="nonsense"),
        lambda: cnsbench.refine("cnn", bench, runner="nonsense"),
        lambda: cnsbench.card("cnn", bench, output=tmp_path / "card", runner="nonsense"),
        lambda: cnsbench.build(REPO / "configs" / "demo.yaml", tmp_path / "b", runner="nonsense"),
    ]
    for call in calls:
        with pytest.raises(CnsbenchError, match=r"^runner: .*nonsense") as err:
            call()
        assert "--runner" not in str(err.value)
    assert not any(tmp_path.iterdir())


def test_refine_refuses_a_configured_classifier_passed_as_a_held_model(bench):
    with pytest.raises(CnsbenchError, match=r"models: 'linear' .*configured classifiers.*in memory only"):
        cnsbench.refine("linear", bench, rounds=1, models={"linear": Tiny()})


@pytest.mark.parametrize("preprocess, says", [
    ("bogus", r"preprocess 'bogus': as a word it is 'cns'"),
    ({**PRE, "crop": 64}, r"preprocess \(the numbers form: resize, crop, interpolation, mean, std\): .*crop"),
    ({**PRE, "mean": [0.5]}, r"the numbers form.*mean"),
    ({**PRE, "colour": 1}, r"the numbers form.*colour"),
    (3, r"'cns' or a mapping of resize, crop, interpolation, mean, std, got a int"),
])
def test_a_preprocess_error_says_which_form_was_meant_and_what_is_wrong(bench, tmp_path, preprocess, says):
    with pytest.raises(CnsbenchError, match=says) as err:
        cnsbench.evaluate(Tiny(), bench, output=tmp_path / "ev", name="t", preprocess=preprocess)
    for noise in ("literal[", "function-after", "union_tag", "PreprocessSpec"):
        assert noise not in str(err.value)
    assert not (tmp_path / "ev").exists()


def test_card_takes_refine_as_its_command_does(bench, tmp_path):
    assert "refine" in inspect.signature(cnsbench.card).parameters
    with pytest.raises(CnsbenchError, match=r"^card: refine must be 1\.\.8 rounds, got 99"):
        cnsbench.card("cnn", bench, output=tmp_path / "card", refine=99, runner="local")
    assert not (tmp_path / "card").exists()


def test_api_messages_name_the_apis_arguments_and_the_command_its_flags(bench, tmp_path, capsys):
    from pipeline.api.common import user_errors
    from pipeline.cli import main

    with pytest.raises(CnsbenchError) as err:
        with user_errors():
            raise CnsbenchError("--output x holds another build: pass --new-version, or --name for another name")
    assert str(err.value) == "output x holds another build: pass new_version=True, or name for another name"
    assert err.value.command_line == "--output x holds another build: pass --new-version, or --name for another name"

    with pytest.raises(CnsbenchError, match=r"^output .* is the source itself.*pass in_place=True") as err:
        cnsbench.evaluate("cnn", bench, output=bench)
    assert "--" not in str(err.value)
    with pytest.raises(CnsbenchError, match=r"^output is empty") as err:
        cnsbench.leaderboard([tmp_path], output="")
    assert main(["evaluate", str(bench), "--output", str(bench)]) == 2
    assert "pass --in-place" in capsys.readouterr().err


def test_no_model_librarys_progress_bar_without_verbose():
    import transformers  # imported first, as a notebook may

    from pipeline.runtime import progress

    transformers.utils.logging.enable_progress_bar()
    progress.quiet_unless_verbose()
    assert not transformers.utils.logging.is_progress_bar_enabled()
