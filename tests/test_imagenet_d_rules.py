"""ImageNet-D rules on hand-made tables: k-of-n hard mining, the multi-id rule, the transfer table."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from pipeline.labels import imagenet_d
from pipeline.analyses import hard_mining as hm
from pipeline.labels import LabelSpace, label_space


# --------------------------------------------------------------------------- data
def test_released_vocabularies_have_the_paper_counts():
    assert [len(imagenet_d.nuisances(k)) for k in imagenet_d.NUISANCE_KINDS] == [468, 47, 32]
    assert imagenet_d.nuisances("material")[:3] == ("wood", "painted", "fabric")
    assert len(imagenet_d.classes()) == 113
    assert imagenet_d.nuisance_words("forest-broadleaf-s") == "forest broadleaf"
    assert imagenet_d.shift_name("plastic-opaque") == "plastic_opaque"
    assert imagenet_d.shift_name("poolroom-home-s") == "poolroom_home"


def test_imagenet_d_label_space_names_and_folders():
    space = label_space("imagenet_d")
    assert len(space) == 113
    # The original CLIP evaluation's class text.
    assert space.name(8) == "binder (closed)"
    assert space.name(19) == "coffee or french press"
    assert space.name(89) == "t shirt"
    # Release folder names resolve too.
    assert space.resolve("binder_closed") == 8
    assert space.resolve("banana") == 2
    assert space.imagenet_ids[16] == (423, 559, 765)  # chair


# --------------------------------------------------------------------------- multi-id
def test_multi_id_rule_maps_every_listed_id_to_its_class():
    space = label_space("imagenet_d")
    out = space.outputs_from_imagenet()
    assert len(out) == 1000
    assert out[423] == out[559] == out[765] == 16  # chair
    assert out[409] == out[530] == 0  # alarm clock
    assert out[954] == 2  # banana
    assert out[0] == -1  # tench is no ImageNet-D class
    assert sum(o >= 0 for o in out) == 125


def test_multi_id_rule_in_predictions():
    """A prediction is correct when the top-1 ImageNet id is any of the class's ids."""
    import torch

    from pipeline.models.classifiers import topk_predictions

    space = LabelSpace("toy", ("chair", "banana"), imagenet_ids=((423, 559, 765), (954,)))
    out = space.outputs_from_imagenet()
    logits = torch.full((4, 1000), -10.0)
    logits[0, 559] = 5  # chair id 2 of 3 -> chair
    logits[1, 765] = 5  # chair id 3 -> chair, but the image is a banana
    logits[2, 954] = 5  # banana
    logits[3, 0] = 5  # tench: no class -> -1
    truth = [0, 1, 1, 0]
    top1, top5, p_true = topk_predictions(logits, out, truth)
    assert top1 == [0, 0, 1, -1]
    assert [t == c for t, c in zip(top1, truth)] == [True, False, True, False]
    # p_true sums every output of the true class: row 0 puts almost all mass on 559.
    assert p_true[0] == pytest.approx(torch.softmax(logits[0], 0)[[423, 559, 765]].sum().item())


def test_a_1000_way_model_over_imagenet_d_uses_the_rule():
    from pipeline.config import ClassifierSpec
    from pipeline.models.classifiers import Classifier

    clf = Classifier(ClassifierSpec(name="m", model="x"), "cpu", label_space("imagenet_d"))
    clf._map_outputs(1000)
    assert clf.out_to_label[423] == 16 and clf.out_to_label[0] == -1


def test_an_id_in_two_classes_is_refused():
    with pytest.raises(ValueError, match="ImageNet id 5 belongs to classes 0 and 1"):
        LabelSpace("bad", ("a", "b"), imagenet_ids=((5,), (5, 6))).outputs_from_imagenet()


# --------------------------------------------------------------------------- k of n
WRONG = np.array(
    [
        [1, 1, 1],  # all three wrong
        [1, 1, 0],
        [0, 1, 0],
        [0, 0, 0],
        [1, 0, 1],
    ],
    dtype=bool,
)


@pytest.mark.parametrize(
    "k, expected",
    [(3, [True, False, False, False, False]), (2, [True, True, False, False, True]), (1, [True, True, True, False, True])],
)
def test_k_of_n(k, expected):
    assert hm.hard_mask(WRONG, k).tolist() == expected


def test_k_outside_1_to_n_is_refused():
    with pytest.raises(ValueError, match="k must be in 1..3"):
        hm.hard_mask(WRONG, 4)
    with pytest.raises(hm.HardMiningError, match="k: 4 > the 3 surrogates"):
        hm.parse_options({"surrogates": ["a", "b", "c"], "k": 4}, ["a", "b", "c", "d"])
    with pytest.raises(hm.HardMiningError, match="surrogates"):
        hm.parse_options({"surrogates": ["a", "zz"]}, ["a", "b"])
    with pytest.raises(hm.HardMiningError, match="unknown_key"):
        hm.parse_options({"unknown_key": 1}, ["a"])
    opts, sur, k = hm.parse_options({}, ["a", "b"])
    assert sur == ["a", "b"] and k == 2  # default: every classifier, all wrong


# --------------------------------------------------------------------------- transfer
def _table() -> pd.DataFrame:
    # 6 candidates; surrogates s1, s2; held-out h.  1 = correct.
    return pd.DataFrame(
        {
            "s1": [0, 0, 1, 1, 0, 1],
            "s2": [0, 0, 0, 1, 1, 1],
            "h": [0, 1, 0, 1, 1, 1],
        },
        index=[f"img{i}" for i in range(6)],
        dtype=float,
    )


def test_transfer_table_by_hand():
    t = hm.transfer_table(_table(), ["s1", "s2"], k=2, repeats=50, seed=3).set_index(["role", "classifier"])
    held = t.loc[("held_out", "h")]
    # Hard for both surrogates: img0, img1.  h is right on img1 only.
    assert held["n_hard"] == 2 and held["n_candidates"] == 6
    assert held["acc_all"] == pytest.approx(4 / 6)
    assert held["acc_hard"] == pytest.approx(0.5)
    assert held["surrogates"] == "s1+s2" and held["k"] == 2
    # Random subsets of size 2 with the same generator, computed here independently.
    rng = np.random.default_rng(3)
    col = _table()["h"].to_numpy()
    accs = [col[rng.choice(6, size=2, replace=False)].mean() for _ in range(50)]
    assert held["acc_random_mean"] == pytest.approx(np.mean(accs))
    assert held["acc_random_std"] == pytest.approx(np.std(accs, ddof=1))
    assert held["drop_vs_random"] == pytest.approx(np.mean(accs) - 0.5)
    # Leave-one-out: s1 judged on the images s2 alone gets wrong (img0, img1, img2): s1 right on img2.
    loo = t.loc[("leave_one_out", "s1")]
    assert loo["surrogates"] == "s2" and loo["k"] == 1 and loo["n_hard"] == 3
    assert loo["acc_hard"] == pytest.approx(1 / 3)
    loo2 = t.loc[("leave_one_out", "s2")]  # images s1 gets wrong: img0, img1, img4; s2 right on img4
    assert loo2["n_hard"] == 3 and loo2["acc_hard"] == pytest.approx(1 / 3)


def test_transfer_with_an_empty_hard_set():
    t = hm.transfer_table(_table(), ["s1", "s2", "h"], k=3, repeats=5)
    # Every classifier is a surrogate: only leave-one-out rows; nothing is wrong for all 3.
    assert set(t["role"]) == {"leave_one_out"}
    assert hm.hard_mask(_table().to_numpy() == 0, 3).sum() == 1  # img0 only


def test_random_subset_accuracy_edges():
    assert all(math.isnan(v) for v in hm.random_subset_accuracy(np.ones(3), 0, 10, 0))
    mean, std = hm.random_subset_accuracy(np.array([1.0, 0.0]), 2, 4, 0)
    assert mean == 0.5 and std == 0.0


def test_shared_failures_by_kind_and_nuisance():
    cand = pd.DataFrame(
        {"kind": ["bg", "bg", "bg", "tex", "tex"], "shift": ["street", "street", "beach", "dotted", "dotted"]}
    )
    hard = np.array([True, True, False, True, False])
    t = hm.shared_failures(cand, hard)
    kinds = t[t["level"] == "kind"].set_index("kind")
    assert kinds.loc["bg", "n_hard"] == 2 and kinds.loc["bg", "n_candidates"] == 3
    assert kinds.loc["tex", "hard_rate"] == pytest.approx(0.5)
    assert kinds.loc["bg", "share_of_hard"] == pytest.approx(2 / 3)
    nuis = t[t["level"] == "nuisance"]
    assert nuis["shift"].tolist() == ["street", "dotted", "beach"]  # most shared failures first
    assert nuis.iloc[0]["hard_rate"] == 1.0


# --------------------------------------------------------------------------- config checks
def _world_config(tmp_path, edit) -> str:
    import yaml
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "configs" / "world_imagenet_d.yaml"
    text = src.read_text().replace("../assets/", str(src.parent.parent / "assets") + "/")
    raw = yaml.safe_load(text)
    edit(raw)
    path = tmp_path / "world.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: r["aggregate"]["analyses"][1].update(surrogates=["linear", "resnet"]), "surrogates"),
        (lambda r: r["aggregate"]["analyses"][1].update(k=4), "k: 4 > the 3 surrogates"),
        (lambda r: r["aggregate"]["analyses"][1].update(repeat=3), "repeat"),
        (lambda r: r["benchmark"].update(shifts=["rotation", "rotatoin"]), "'rotatoin' is not a nuisance of the vocabulary (close: rotation)"),
        (lambda r: r["generator"]["options"].update(templates={"pose": "a {nuisance}"}), "must name the object"),
        (lambda r: r["generator"]["options"].update(vocabulary="imagenet_e"), "vocabulary must be 'imagenet_d'"),
    ],
)
def test_bad_world_config_is_refused_before_models_load(tmp_path, capsys, edit, message):
    from pipeline import cli
    path = _world_config(tmp_path, edit)
    assert cli.main(["validate", path]) in (1, 2)  # 2: invalid config, 1: problems found by validate
    captured = capsys.readouterr()
    assert message in captured.out + captured.err


def test_released_vocabulary_checks_shift_names():
    from pipeline.families.prompt_nuisance import PromptNuisanceFamily, PromptNuisanceOptions, nuisance_kinds

    opts = PromptNuisanceOptions()
    assert PromptNuisanceFamily.check_shifts(["beach", "forest_broadleaf", "dotted", "plastic_opaque"], opts) == []
    assert nuisance_kinds(opts, ["beach", "dotted", "wood"]) == {"beach": "background", "dotted": "texture", "wood": "material"}
    assert opts.template("material").format(token="backpack", nuisance="wood") == "a backpack made of wood"
    problems = PromptNuisanceFamily.check_shifts(["polka_doted"], opts)
    assert problems and "polka_dotted" in problems[0]


# --------------------------------------------------------------------------- the analysis end to end
def _context(options):
    """A hand-made output: 4 trajectories (shift, class, seed), scale 0 and 1; classifiers a, b, h."""
    import io
    import json as _json
    from types import SimpleNamespace

    from PIL import Image

    from pipeline.aggregate.analysis import AnalysisContext
    from pipeline.plan import sample_id, trajectory_id

    trajs = [("street", 0, 1), ("street", 1, 1), ("dotted", 0, 2), ("wood", 1, 2)]
    kinds = {"street": "background", "dotted": "texture", "wood": "material"}
    samples, preds = [], []
    # correct[(traj index, scale)] = (a, b, h)
    correct = {
        (0, 0): (1, 1, 1), (0, 1): (0, 0, 0),  # hard for a and b; h wrong too
        (1, 0): (0, 1, 1), (1, 1): (0, 0, 1),  # hard, but a is wrong on the plain reference
        (2, 0): (1, 1, 1), (2, 1): (0, 1, 1),  # one surrogate wrong: not hard for k = 2
        (3, 0): (1, 1, 1), (3, 1): (1, 1, 0),
    }
    for i, (shift, cls, seed) in enumerate(trajs):
        for scale in (0.0, 1.0):
            sid = sample_id(shift, cls, seed, scale)
            samples.append({
                "sample_id": sid, "trajectory_id": trajectory_id(shift, cls, seed), "class_id": cls,
                "class_name": "ab"[cls], "seed": seed, "shift": shift, "scale": scale, "kept": True,
                "params": _json.dumps({"kind": kinds[shift]}),
            })
            for name, ok in zip("abh", correct[(i, scale)]):
                preds.append({"sample_id": sid, "classifier": name, "top1": cls if ok else 9, "correct": bool(ok)})
    cfg = SimpleNamespace(classifiers=[SimpleNamespace(name=n) for n in "abh"])

    def read_image(sid):
        buf = io.BytesIO()
        Image.new("RGB", (4, 4), (len(sid), 0, 0)).save(buf, format="PNG")
        return buf.getvalue()

    return AnalysisContext(cfg, pd.DataFrame(samples), pd.DataFrame(preds), options=options, read_image=read_image)


def test_analysis_on_a_hand_made_output():
    import io

    from pipeline.io.webdataset import iter_tar

    res = hm.run(_context({"surrogates": ["a", "b"], "repeats": 10}))
    hard = pd.read_parquet(io.BytesIO(res.files["hard_set.parquet"]))
    assert hard["sample_id"].tolist() == ["street/000/seed_0001_scale_1000", "street/001/seed_0001_scale_1000"]
    assert hard["kind"].tolist() == ["background", "background"] and hard["n_wrong"].tolist() == [2, 2]
    held = res.tables["transfer"].set_index("classifier").loc["h"]
    assert (held["n_candidates"], held["n_hard"]) == (4, 2)
    assert held["acc_all"] == pytest.approx(0.5) and held["acc_hard"] == pytest.approx(0.5)
    shared = res.tables["shared_failures"]
    assert shared.iloc[0][["level", "kind", "n_hard"]].tolist() == ["kind", "background", 2]
    members = dict(iter_tar(res.files["hard_set/hard_set-000000.tar"]))
    meta = json.loads(members["street/001/seed_0001_scale_1000"]["json"])
    assert meta == {"class_id": 1, "class_name": "b", "shift": "street", "kind": "background", "seed": 1,
                    "scale": 0.0, "source_sample_id": "street/001/seed_0001_scale_1000"}
    assert res.json["n_hard"] == 2 and res.json["exported"]
    from PIL import Image

    sheet = Image.open(io.BytesIO(res.files["hard_set.png"]))  # reference | hard image, 4 pairs per row
    assert sheet.size == (4 * (2 * 64 + 4 + 8), 64 + 14 + 6) and 'src="hard_set.png"' in res.html


def test_reference_correct_keeps_nuisance_caused_failures_only():
    res = hm.run(_context({"surrogates": ["a", "b"], "reference_correct": True, "repeats": 10}))
    hard = pd.read_parquet(__import__("io").BytesIO(res.files["hard_set.parquet"]))
    # street/001 is dropped: surrogate a is already wrong on its plain reference.
    assert hard["sample_id"].tolist() == ["street/000/seed_0001_scale_1000"]
    assert res.json["n_candidates"] == 3


def test_analysis_skips_when_no_surrogate_is_in_the_output():
    res = hm.run(_context({"surrogates": ["x", "y"]}))
    assert "skipped" in res.json and not res.files


def test_user_vocabulary_from_csv_and_lists(tmp_path):
    from pipeline.families.prompt_nuisance import PromptNuisanceOptions

    csv_file = tmp_path / "scenes.csv"
    csv_file.write_text("code,name\n1,red-barn-s\n2,ice_rink-outdoor-s\n")
    opts = PromptNuisanceOptions(
        vocabulary={"background": str(csv_file), "weather": ["heavy snow", "fog"]},
        templates={"weather": "a {token} in {nuisance}"},
    )
    assert opts.nuisances() == {
        "red_barn": ("background", "red barn"),
        "ice_rink_outdoor": ("background", "ice rink outdoor"),
        "heavy_snow": ("weather", "heavy snow"),
        "fog": ("weather", "fog"),
    }
    assert opts.template("background") == "a {token} in the {nuisance}"  # the released kind's default
    assert opts.template("weather") == "a {token} in {nuisance}"
    clash = PromptNuisanceOptions(vocabulary={"a": ["heavy snow"], "b": ["heavy-snow"]})
    with pytest.raises(ValueError, match="shift name 'heavy_snow'"):
        clash.nuisances()
    with pytest.raises(ValueError, match="file not found"):
        PromptNuisanceOptions(vocabulary={"a": str(tmp_path / "none.csv")}).nuisances()


def test_kinds_come_from_the_vocabulary_without_params():
    from types import SimpleNamespace

    from pipeline.families.prompt_nuisance import PromptNuisanceOptions

    ctx = _context({"surrogates": ["a", "b"], "repeats": 2, "export": False})
    ctx.samples = ctx.samples.assign(params=None)
    group = SimpleNamespace(kind="prompt_nuisance", options=PromptNuisanceOptions(), shifts=("street", "dotted", "wood"))
    ctx.config.family_groups = lambda: [group]
    shared = hm.run(ctx).tables["shared_failures"]
    assert set(shared.loc[shared["level"] == "kind", "kind"]) == {"background", "texture", "material"}
