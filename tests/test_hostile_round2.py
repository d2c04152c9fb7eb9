"""Second round of hostile inputs: one writer per output really means one, `compare` and
`build` never overwrite files we did not write, damaged data shards are seen by `status`,
template widths are bounded, names are matched whole, lease times are bounded, and bad
numbers and wrong-typed preprocessing keys are named."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hostile import (  # noqa: F401 (built: a fixture)
    built,
    manifest_paths,
    start_holder,
    synthetic_output,
    tiny_cfg_path,
    tree_digest,
)

from pipeline.cli import main
from pipeline.io.store import OutputStore


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def write_lease(out, **fields) -> dict:
    now = time.time()
    doc = {"host": "elsewhere", "pid": 4242, "command": "build", "started": now - 60, "heartbeat": now,
           "token": "f" * 32, **fields}
    (out / "lease.json").write_text(json.dumps(doc))
    return doc


# --------------------------------------------------------------------------- 1. two writers
def test_a_live_lease_on_this_host_is_never_taken_over(built, tmp_path, capsys, monkeypatch):
    cfg, out = built
    holder = start_holder(out)
    try:
        time.sleep(1.5)  # the holder's heartbeat (every 30 s) is now older than the timeout below
        monkeypatch.setenv("CNSBENCH_LEASE_TIMEOUT_S", "1")
        before = tree_digest(out, skip=out / "lease.json")
        assert main(["build", str(cfg), "--output", str(out), "--runner", "local"]) == 2
        err = capsys.readouterr().err
        assert f"pid {holder.pid}" in err and "being written by" in err
        # --new-version with another config archives nothing while the holder lives
        other = tiny_cfg_path(tmp_path, lambda r: r["generator"].update(steps=7), name="other.yaml")
        assert main(["build", str(other), "--output", str(out), "--runner", "local", "--new-version"]) == 2
        assert f"pid {holder.pid}" in capsys.readouterr().err
        assert not (out / "previous").exists() and tree_digest(out, skip=out / "lease.json") == before
        assert json.loads((out / "lease.json").read_text())["pid"] == holder.pid
    finally:
        stop(holder)


def test_a_writer_that_lost_its_lease_commits_nothing(built, tmp_path):
    from pipeline.config import load_config
    from pipeline.io.lease import LeaseLost, hold_lease
    from pipeline.stages.write import WriteStage

    cfg_path, out = built
    cfg = load_config(cfg_path)
    with hold_lease(str(out), "build") as lease:
        write_lease(out)  # a writer elsewhere took the lease over (ours had expired there)
        stage = WriteStage(cfg, str(out), lease_token=lease.info.token)
        stage.setup()
        rows = [{"trajectory_id": "painting_style/001/seed_0009", "unit_id": "001/seed_0009", "error": "[generate] x"}]
        n = len(manifest_paths(out))
        with pytest.raises(LeaseLost, match="taken over by cnsbench build on host elsewhere, pid 4242"):
            stage.write_shard(rows)
        assert len(manifest_paths(out)) == n


def test_a_build_that_loses_its_lease_stops_and_says_so(built, tmp_path, capsys, monkeypatch):
    import pipeline.output_run as B

    cfg, out = built
    config_json = (out / "config.json").read_bytes()
    clean = B.clean_uncommitted

    def taken_over_meanwhile(store, echo):
        clean(store, echo)
        write_lease(out)

    monkeypatch.setattr(B, "clean_uncommitted", taken_over_meanwhile)
    rc = main(["build", str(cfg), "--output", str(out), "--runner", "local"])
    out_text, err = capsys.readouterr()
    assert rc not in (0, 2, 3), (out_text, err)
    assert "lease" in err and "taken over" in err and "host elsewhere" in err and "Traceback" not in err
    assert (out / "config.json").read_bytes() == config_json  # no further commit
    assert not (out / "runs").exists() and not (out / "report").exists()
    assert json.loads((out / "lease.json").read_text())["host"] == "elsewhere"  # theirs stays


def test_status_sees_shards_larger_than_config_json_allows(built, capsys):
    from pipeline.output_run import committed_trajectories

    _, out = built
    doc = json.loads((out / "config.json").read_text())
    doc["config"]["output"]["trajectories_per_shard"] = 1  # as a second writer left it
    (out / "config.json").write_text(json.dumps(doc))
    assert main(["status", str(out)]) == 3
    text = capsys.readouterr().out
    assert "trajectories_per_shard" in text and "0/8 trajectories" in text and "cnsbench build" in text
    done, _ = committed_trajectories(OutputStore(str(out)), repair=True, echo=print)
    assert done == set() and len(list((out / "previous" / "quarantine").rglob("shard-*.json"))) == 4


@pytest.mark.slow
def test_two_cli_builds_on_one_output(tmp_path, capsys, monkeypatch):
    """The contract with two builds in two processes: the second (lease timeout 1 s) exits 2
    naming the first, the first finishes, and `status` finds the output complete and consistent."""
    from buildproc import ForkedBuild, env_with

    cfg = tiny_cfg_path(tmp_path)
    # The first build has work to do: a third classifier on the images committed with two.
    two = tiny_cfg_path(tmp_path, lambda r: r.update(classifiers=r["classifiers"][:2]), name="two.yaml")
    out = tmp_path / "out"
    synthetic_output(out, two)
    faults = tmp_path / "faults"
    faults.mkdir()
    env = env_with(CNSBENCH_FAULT_INJECT="reclassify:start:*:hold", CNSBENCH_FAULT_DIR=str(faults))
    log = tmp_path / "first.log"
    first = ForkedBuild(["build", cfg, "--output", out, "--runner", "local"], log, env=env)  # a process of its own
    try:
        deadline = time.time() + 300
        while not (faults / "paused-reclassify-start").exists():
            assert first.poll() is None, log.read_text()
            assert time.time() < deadline
            time.sleep(0.2)
        time.sleep(1.2)
        monkeypatch.setenv("CNSBENCH_LEASE_TIMEOUT_S", "1")  # the second build, in this process
        assert main(["build", str(cfg), "--output", str(out), "--runner", "local"]) == 2
        err = capsys.readouterr().err
        assert f"pid {first.pid}" in err and "Traceback" not in err
        monkeypatch.delenv("CNSBENCH_LEASE_TIMEOUT_S")
        (faults / "release").touch()
        first.wait(timeout=300)
        text = log.read_text()
        assert first.returncode == 0, text
        assert "taken over" not in text
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert main(["status", str(out)]) == 0
    text = capsys.readouterr().out
    assert "8/8 trajectories" in text and "aggregated  yes" in text and "lease       none" in text


# --------------------------------------------------------------------------- 2. compare --output
def _report_like(d) -> dict[str, str]:
    d.mkdir(parents=True, exist_ok=True)
    (d / "index.html").write_text("<h1>my page</h1>")
    (d / "metrics.json").write_text('{"mine": 1}')
    (d / "accuracy.csv").write_text("a,b\n1,2\n")
    return tree_digest(d)


def test_compare_refuses_a_foreign_directory_and_a_build_output(built, tmp_path, capsys):
    cfg, a = built
    b = tmp_path / "b"
    synthetic_output(b, cfg)
    theirs = tmp_path / "theirs"
    before = _report_like(theirs)
    assert main(["compare", str(a), str(b), "--output", str(theirs)]) == 2
    err = capsys.readouterr().err
    assert str(theirs) in err and "not empty" in err and "index.html" in err
    assert tree_digest(theirs) == before
    before_a = tree_digest(a)
    assert main(["compare", str(a), str(b), "--output", str(a)]) == 2
    assert "build output" in capsys.readouterr().err
    assert tree_digest(a) == before_a


@pytest.mark.slow
def test_compare_writes_into_a_new_dir_which_is_then_its_own(built, tmp_path, capsys):
    cfg, a = built
    b = tmp_path / "b"
    synthetic_output(b, cfg)
    dest = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "--output", str(dest), "--image-check", "4"]) == 0
    assert (dest / "index.html").is_file() and (dest / "compare.json").is_file()
    from pipeline.io.ownership import claim_compare_output

    claim_compare_output(OutputStore(str(dest)))  # its own earlier comparison: a new one may go there


# --------------------------------------------------------------------------- 3. a foreign config.yaml
@pytest.mark.parametrize("extra", ["config.yaml only", "with previous/ and a junk lease"])
def test_build_never_overwrites_a_users_config_yaml(tmp_path, capsys, extra):
    cfg = tiny_cfg_path(tmp_path)
    d = tmp_path / "mine"
    d.mkdir()
    (d / "config.yaml").write_text("# my own notes\nlr: 0.1\n")
    if extra != "config.yaml only":
        (d / "previous").mkdir()
        (d / "previous" / "draft.txt").write_text("old draft")
        (d / "lease.json").write_text("not a lease")
    before = tree_digest(d)
    assert main(["build", str(cfg), "--output", str(d), "--runner", "local"]) == 2
    err = capsys.readouterr().err
    assert "not a cnsbench output" in err and "config.yaml" in err
    assert tree_digest(d) == before


def test_what_a_build_leaves_before_its_marker_is_still_ours(built, tmp_path):
    from pipeline.output_run import archive_previous
    from pipeline.io.ownership import claim_output

    _, out = built
    write_lease(out, heartbeat=time.time() - 900)  # a build that died long ago
    store = OutputStore(str(out))
    archive_previous(store)  # --new-version moved the old build away, then the run stopped
    assert sorted(os.listdir(out)) == ["lease.json", "previous"]
    assert claim_output(store) is None  # ours: a new build may start here


# --------------------------------------------------------------------------- 4. template widths
@pytest.mark.parametrize(
    ("key", "template"),
    [
        ("filter.class_prompt", "a photo of a {class_name:>999999999}"),
        ("filter.class_prompt", "a photo of a {class_name:>20000000000}"),
        ("filter.shift_prompt", "{shift_words:.99999999}"),
        ("generator.slider_pattern", "{shift}/{class_id:0999999999d}.safetensors"),
        ("filter.class_prompt", "a photo of a {class_name:>{class_name}}"),
    ],
)
def test_template_widths_are_bounded(tmp_path, capsys, key, template):
    section, name = key.split(".")
    cfg = tiny_cfg_path(tmp_path, lambda r: r.setdefault(section, {}).update({name: template}), name="c.yaml")
    assert main(["validate", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err and ("width" in err or "format spec" in err)


def test_small_format_specs_still_pass():
    from pipeline.io.bounds import check_template

    check_template("{shift}/{class_id:03d}.safetensors", {"shift", "class_id"})
    check_template("a photo of a {class_name:>12}", {"class_name"})


# --------------------------------------------------------------------------- 5. names matched whole
@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r["benchmark"].update(shifts=["painting_style\n", "heavy_snow"]),
        lambda r: r["classifiers"][0].update(name="tiny-resnet\n"),
    ],
    ids=["shift", "classifier"],
)
def test_a_trailing_newline_in_a_name_is_refused(tmp_path, capsys, mutate):
    cfg = tiny_cfg_path(tmp_path, mutate, name="c.yaml")
    assert main(["validate", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "\\n'" in err and "match" in err and "missing slider" not in err and "Traceback" not in err


def test_every_name_pattern_is_matched_whole():
    from pipeline.config.base import SHIFT_NAME
    from pipeline.io.manifest import OWN_FILE, SHARD_NAME, is_own_file, own_file_shard
    from pipeline.serve.review import Review, ReviewError
    from pipeline.sources.checks import check_shift
    from pipeline.sources.common import SourceError

    assert SHIFT_NAME.fullmatch("painting_style") and not SHIFT_NAME.fullmatch("painting_style\n")
    assert own_file_shard("images/shard-0123456789abcdef.tar") == "shard-0123456789abcdef"
    assert own_file_shard("images/shard-0123456789abcdef.tar\n") is None
    assert not is_own_file("manifest/.tmp-" + "0" * 32 + "-shard-0123456789abcdef.json\n")
    assert SHARD_NAME.fullmatch("shard-0123456789abcdef") and OWN_FILE.pattern.startswith("(?:")
    with pytest.raises(ReviewError, match="must match"):
        Review("/nonexistent").check_set("rules_1\n")
    with pytest.raises(SourceError, match="must match"):
        check_shift("snow\n", "annotations_cns.json")


def test_no_name_check_uses_match_with_a_dollar():
    """`^...$` with .match accepts a final newline; names are matched with fullmatch.  (Pydantic's
    ``pattern=`` runs on Rust's regex, where ``$`` is the end of the text: the classifier test above.)"""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "pipeline"
    bad = []
    for path in root.rglob("*.py"):
        text = path.read_text()
        for m in re.finditer(r"re\.(?:compile|match)\(r?f?\"\^[^\"]*\$\"", text):
            bad.append(f"{path.relative_to(root)}: {m.group(0)}")
    assert not bad, bad


# --------------------------------------------------------------------------- 6. damaged data shards
def _damage(out, kind: str, how: str) -> str:
    """Damage the ``kind`` Parquet of the first shard; returns the shard's name."""
    path = sorted((out / kind).glob("*.parquet"))[0]
    data = path.read_bytes()
    if how == "garbage":
        path.write_bytes(bytes((b * 7 + 13) % 256 for b in data))  # same size, not Parquet
    elif how == "schema":
        buf = io.BytesIO()
        pq.write_table(pa.table({"x": list(range(10))}), buf)
        path.write_bytes(buf.getvalue())
    elif how == "duplicates":
        table = pq.read_table(io.BytesIO(data))
        buf = io.BytesIO()
        pq.write_table(pa.concat_tables([table] * 5000), buf)
        path.write_bytes(buf.getvalue())
    # keep the manifest's size and hash in step, as a writer of these bytes would have
    man = out / "manifest" / f"{path.stem}.json"
    doc = json.loads(man.read_text())
    rel = f"{kind}/{path.name}"
    if how != "garbage":
        doc["files"][rel] = {"size": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        man.write_text(json.dumps(doc))
    return path.stem


@pytest.mark.parametrize(
    ("kind", "how"), [("samples", "garbage"), ("predictions", "duplicates"), ("samples", "schema")]
)
def test_status_sees_a_shard_not_readable_as_its_schema(built, capsys, kind, how):
    from pipeline.output_run import committed_trajectories

    _, out = built
    shard = _damage(out, kind, how)
    assert main(["status", str(out)]) == 3
    text = capsys.readouterr().out
    assert shard in text and "damaged" in text and "cnsbench build" in text and "6/8 trajectories" in text
    # aggregate reports from the rest, naming the shard (its page: one case, the report takes a while)
    if how == "duplicates":
        assert main(["aggregate", str(out)]) == 0
        said = capsys.readouterr().out
        assert shard in said and "regenerating" not in said
        page = (out / "report" / "index.html").read_text()
        assert shard in page and "left out" in page
        assert json.loads((out / "report" / "metrics.json").read_text())["counts"]["n_trajectories_total"] == 6
    else:
        from pipeline.aggregate.run import load_sound_tables

        samples, predictions, left_out = load_sound_tables(OutputStore(str(out)))
        assert list(left_out) == [shard] and samples["trajectory_id"].nunique() == 6
        assert set(predictions["sample_id"]) == set(samples["sample_id"])
    # a build quarantines the shard (nothing deleted) and plans its trajectories again
    done, _ = committed_trajectories(OutputStore(str(out)), repair=True, echo=print)
    assert len(done) == 6 and not (out / "manifest" / f"{shard}.json").exists()
    assert list((out / "previous" / "quarantine").rglob(f"{shard}.parquet"))
    assert "quarantine" in capsys.readouterr().out


# --------------------------------------------------------------------------- 7. lease times
@pytest.mark.parametrize(
    ("heartbeat", "needle"),
    [("now+1e8", "in the future"), ("1e400", "finite"), ("nan-string", "finite")],
)
def test_lease_times_from_files_are_bounded(built, capsys, monkeypatch, heartbeat, needle):
    from pipeline.io.lease import acquire, read_lease

    _, out = built
    monkeypatch.setenv("CNSBENCH_LEASE_TIMEOUT_S", "600")
    if heartbeat == "now+1e8":
        write_lease(out, heartbeat=time.time() + 1e8)
    elif heartbeat == "1e400":
        doc = write_lease(out, heartbeat=0)
        (out / "lease.json").write_text(json.dumps(doc).replace('"heartbeat": 0', '"heartbeat": 1e400'))
    else:
        write_lease(out, heartbeat="NaN")
    assert main(["status", str(out)]) == 0
    text = capsys.readouterr().out
    assert "STALE" in text and needle in text and "-3153" not in text
    msgs: list[str] = []
    held = acquire(OutputStore(str(out)), "build", msgs.append)
    try:
        assert needle in msgs[0] and read_lease(held.store).token == held.info.token
    finally:
        held.release()


# --------------------------------------------------------------------------- 8. numbers and preprocessing keys
@pytest.mark.parametrize("flag", ["--num-gpus", "--num-cpus"])
def test_submit_refuses_negative_resources(tmp_path, capsys, flag):
    cfg = tiny_cfg_path(tmp_path)
    rc = main(["submit", str(cfg), "--output", "s3://b/x", "--address", "http://127.0.0.1:1", flag, "-3"])
    err = capsys.readouterr().err
    assert rc == 2 and flag in err and "Failed to connect" not in err


@pytest.mark.parametrize(
    ("preprocess", "key"),
    [({"input_size": 224}, "input_size"), ({"input_size": [3, 8, 8], "mean": 0.5}, "mean"),
     ({"input_size": [3, 8, 8], "interpolation": 3}, "interpolation"),
     ({"input_size": [3, "8", 8]}, "input_size")],
)
def test_torchscript_preprocess_json_keys_are_checked(tmp_path, preprocess, key):
    import torch

    from pipeline.config import ClassifierSpec
    from pipeline.labels import label_space
    from pipeline.registry import CLASSIFIERS

    path = tmp_path / "m.pt"
    torch.jit.save(torch.jit.script(torch.nn.Flatten()), str(path), _extra_files={"preprocess.json": json.dumps(preprocess)})
    spec = ClassifierSpec(name="lin", kind="torchscript", model="linear", checkpoint=str(path))
    with pytest.raises(ValueError, match=rf"preprocess\.json.*{key}|{key}.*preprocess\.json") as err:
        CLASSIFIERS.get("torchscript")(spec, "cpu", label_space(["a", "b"]))
    assert str(path) in str(err.value)


def test_torchscript_model_kwargs_keys_are_checked(tmp_path):
    import torch

    from pipeline.config import ClassifierSpec
    from pipeline.labels import label_space
    from pipeline.registry import CLASSIFIERS

    path = tmp_path / "m.pt"
    torch.jit.save(torch.jit.script(torch.nn.Flatten()), str(path))
    spec = ClassifierSpec(name="lin", kind="torchscript", model="linear", checkpoint=str(path),
                          model_kwargs={"input_size": [3, 8, -8]})
    with pytest.raises(ValueError, match="model_kwargs.input_size"):
        CLASSIFIERS.get("torchscript")(spec, "cpu", label_space(["a", "b"]))
