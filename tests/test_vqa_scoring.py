"""VQA protocols: ImageNet-D's two-choice scoring on hand-written answers, the other protocols, config checks."""

from __future__ import annotations

import pytest

from pipeline.models.vqa_protocols import (
    BOTH,
    FALSE,
    IMAGENET_D_PROMPT,
    NEITHER,
    TRUE,
    ProtocolError,
    build_protocol,
    named_among,
    resolve_protocol,
    two_choice_verdict,
)

SYN = resolve_protocol({"kind": "two_choice", "distractors": "questions"})


def verdict(truth: str, distractor: str, answer: str) -> str:
    return two_choice_verdict(truth, distractor, answer, build_protocol(SYN).synonyms)


@pytest.mark.parametrize(
    "truth, distractor, answer, expected",
    [
        ("banana", "apple", "The main object in this image is a banana.", TRUE),
        ("banana", "apple", "It is an Apple.", FALSE),  # the answer is lower-cased
        ("banana", "apple", "A banana next to an apple.", BOTH),
        ("banana", "apple", "I cannot tell.", NEITHER),
        # synonyms of the release's categories
        ("tv", "chair", "a television set", TRUE),
        ("chair", "tv", "a television set", FALSE),
        ("weight (exercise)", "hammer", "A dumbbell.", TRUE),
        ("coffee or french press", "kettle", "This is a coffee maker", TRUE),
        ("cellphone", "remote control", "a mobile phone", TRUE),
        ("t shirt", "towel", "a T-shirt", TRUE),
        ("pop can", "bottle", "a can of soda", TRUE),
        # a synonym that names both options is a double answer
        ("ladle", "spoon", "a spoon", BOTH),
        # pen / can opener: "pen" is inside "can opener", the longer name decides
        ("pen", "can opener", "It is a can opener.", FALSE),
        ("pen", "can opener", "It is a pen.", TRUE),
        ("pen", "can opener", "a pen and a can opener", FALSE),
        ("pen", "can opener", "a stapler", NEITHER),
        ("can opener", "pen", "It is a can opener.", TRUE),
        ("can opener", "pen", "It is a pen.", FALSE),
        ("can opener", "pen", "a stapler", NEITHER),
        # plate / drying rack for plates, the same way
        ("plate", "drying rack for plates", "a drying rack for plates", FALSE),
        ("plate", "drying rack for plates", "a white plate", TRUE),
        ("drying rack for plates", "plate", "a drying rack for plates", TRUE),
        ("drying rack for plates", "plate", "a plate", FALSE),
    ],
)
def test_two_choice_rules_of_the_release(truth, distractor, answer, expected):
    assert verdict(truth, distractor, answer) == expected


def test_without_the_special_rule_pen_would_be_a_double():
    # The reason the release special-cases the pair: plain substring matching sees both.
    assert verdict("pen", "stapler", "a can opener") == TRUE  # "pen" occurs in "can opener"
    assert verdict("pen", "can opener", "a can opener") == FALSE


def test_two_choice_distractor_rule_and_prompt():
    p = build_protocol(resolve_protocol({"kind": "two_choice", "distractors": "clip"}))
    names = ["zero", "one", "two", "three"]
    q = p.ask(2, names, "s", ranked=[1, 2, 3])  # top-1 wrong: the distractor is the top-1
    assert q.prompt == "What is the main object in this image? Choose from the following list: two, one."
    assert q.options == (2, 1)
    q = p.ask(2, names, "s", ranked=[2, 3, 1])  # top-1 right: the distractor is the top-2
    assert q.option_names == ("two", "three")
    assert p.score(q, "three").chosen == 3 and p.score(q, "three").correct is False
    assert p.score(q, "Two.").correct is True
    both = p.score(q, "two or three")
    assert both.excluded and both.correct is None and both.chosen == -1


def test_two_choice_takes_the_released_question_from_questions():
    p = build_protocol(resolve_protocol({"kind": "two_choice", "distractors": "questions"}))
    names = ["pen", "can opener", "plate"]
    released = {"gt_category": "pen", "top1_pred_cate": "pen", "top2_pred_cate": "can opener"}
    q = p.ask(0, names, "s", ranked=[2, 1], released=released)  # a ranking is not the source: ignored
    assert q.option_names == ("pen", "can opener") and q.options == (0, 1)
    assert p.score(q, "a can opener").verdict == FALSE
    released = {"gt_category": "pen", "top1_pred_cate": "plate", "top2_pred_cate": "pen"}
    assert p.ask(0, names, "s", released=released).options == (0, 2)


def test_resolved_protocol_records_the_verbatim_prompt_and_parameters():
    assert SYN["prompt"] == IMAGENET_D_PROMPT
    assert IMAGENET_D_PROMPT.format(options="a, b") == (
        "What is the main object in this image? Choose from the following list: a, b."
    )
    assert SYN["temperature"] == 0.2 and SYN["order"] == "original" and SYN["synonyms"] == "imagenet_d"


def test_multiple_choice_is_seeded_and_uses_the_ranking_first():
    p = build_protocol(resolve_protocol({"kind": "multiple_choice", "k": 3, "distractors": "clip"}))
    names = [f"c{i}" for i in range(10)]
    q1 = p.ask(4, names, "sample-a", ranked=[4, 7, 8, 9])
    assert sorted(q1.options) == [4, 7, 8] and q1 == p.ask(4, names, "sample-a", ranked=[4, 7, 8, 9])
    orders = {p.ask(4, names, f"s{i}", ranked=[4, 7, 8]).options for i in range(20)}
    assert len(orders) > 1  # the order depends on the sample id
    q = p.ask(4, names, "x", ranked=[4])  # the ranking runs out: the rest from the label space
    assert len(set(q.options)) == 3 and 4 in q.options
    assert p.score(q1, "c7").verdict == FALSE and p.score(q1, "c4").verdict == TRUE
    assert p.score(q1, "c7 or c8").verdict == BOTH


def test_open_answers_match_class_names_and_synonyms():
    p = build_protocol(resolve_protocol({"kind": "open"}))
    names = ["pen", "can opener", "tv", "chair"]
    q = p.ask(0, names, "s")
    assert "Choose" not in q.prompt
    assert p.score(q, "a can opener").chosen == 1  # "pen" inside "can opener" is not a second name
    assert p.score(q, "a pen").verdict == TRUE
    assert p.score(q, "a television").chosen == 2
    assert p.score(q, "a chair and a pen").verdict == BOTH
    assert p.score(q, "nothing").verdict == NEITHER
    assert named_among("The Chair", names, {}) == [3]


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"kind": "five_choice"}, "protocol.kind"),
        ({"kind": "two_choice"}, "protocol.distractors"),
        ({"kind": "two_choice", "distractors": "classifier:"}, "protocol.distractors"),
        ({"kind": "two_choice", "distractors": "clip", "prompt": "Which?"}, "protocol.prompt"),
        ({"kind": "multiple_choice", "k": 1}, "protocol.k"),
        ({"kind": "open", "distractors": "clip"}, "protocol"),
        ({"kind": "open", "temperature": -1}, "protocol.temperature"),
    ],
)
def test_bad_protocols_name_the_key(raw, key):
    with pytest.raises(ProtocolError, match=key.replace(".", r"\.")):
        resolve_protocol(raw)


@pytest.mark.parametrize(
    "protocol, key",
    [
        ({"kind": "five_choice"}, "protocol.kind"),
        ({"kind": "two_choice"}, "protocol.distractors"),
        ({"kind": "two_choice", "distractors": "nope"}, "(vlm).protocol.distractors"),
    ],
)
def test_validate_exits_2_naming_the_key(tmp_path, capsys, protocol, key):
    from pathlib import Path

    import yaml

    from pipeline import cli
    repo = Path(__file__).resolve().parents[1]
    raw = yaml.safe_load((repo / "configs" / "world_imagenet_d.yaml").read_text().replace("../assets", str(repo / "assets")))
    vlm = next(c for c in raw["classifiers"] if c["kind"] == "vlm")
    vlm["protocol"] = protocol
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert cli.main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err


def test_ls_lists_the_vlm_kind_and_its_protocols(capsys):
    from pipeline import cli
    assert cli.main(["ls"]) == 0
    out = capsys.readouterr().out
    assert "\n  vlm " in out and "VQA protocols" in out
    assert all(f"\n  {p} " in out for p in ("two_choice", "multiple_choice", "open"))


def test_a_classifier_asks_by_its_kinds_role_and_a_protocol_is_read_from_its_options():
    """Who asks questions is the kind's class-level role (``AskingClassifier.asks``) through the
    registry; an entry's protocol is read from its options model alone (no kind's class loaded)."""
    from pipeline.config.classifiers import ClassifierSpec
    from pipeline.config.vqa import asks, protocol_of

    assert asks("vlm") and not asks("timm") and not asks("module") and not asks("no-such-kind")
    vlm = ClassifierSpec.model_validate({"name": "v", "kind": "vlm", "model": "llava-hf/llava-1.5-7b-hf",
                                         "protocol": {"kind": "two_choice", "distractors": "questions"}})
    timm = ClassifierSpec.model_validate({"name": "r", "kind": "timm", "model": "resnet18"})
    assert protocol_of(vlm)["distractors"] == "questions" and protocol_of(timm) is None
