"""Paths from data stay inside their root: manifests, annotations, samples tables, folders, patterns."""

from __future__ import annotations

import json
import os

import pytest
from hostile import VICTIM_TEXT, cns_entry, cns_source, nested_json, png_bytes, tree_digest, victim

from pipeline.io.fs import PathEscape, safe_relpath
from pipeline.io.manifest import ManifestError, is_own_file, parse_manifest
from pipeline.io.safejson import JSONInputError, loads
from pipeline.io.store import OutputStore
from pipeline.labels import label_space

SHARD = "shard-0123456789abcdef"
GOOD = {"size": 3, "sha256": "0" * 64}


@pytest.mark.parametrize(
    "entry", ["../x", "a/../../x", "/etc/passwd", "C:\\x", "s3://other/x", "~/x", "", ".", "a\x00b", 3, None, ["a"]]
)
def test_safe_relpath_refuses(tmp_path, entry):
    with pytest.raises(PathEscape) as err:
        safe_relpath(str(tmp_path), entry, what="f.json: images[3]")
    assert "f.json: images[3]" in str(err.value)


def test_safe_relpath_accepts_and_normalises(tmp_path):
    assert safe_relpath(str(tmp_path), "a/./b/../c.png") == os.path.join(str(tmp_path), "a", "c.png")
    assert safe_relpath("s3://bucket/pre/", "a/b.png") == "s3://bucket/pre/a/b.png"
    with pytest.raises(PathEscape):
        safe_relpath("s3://bucket/pre", "../other/b.png")


def test_symlink_leaving_the_root_needs_the_opt_in(tmp_path):
    secret = victim(tmp_path)
    root = tmp_path / "src"
    root.mkdir()
    (root / "link").symlink_to(secret.parent)
    with pytest.raises(PathEscape, match="symbolic link"):
        safe_relpath(str(root), "link/x", what="entry")
    assert safe_relpath(str(root), "link/x", follow_symlinks=True).endswith("link/x")


def test_store_refuses_paths_leaving_the_output(tmp_path):
    secret = victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    store = OutputStore(str(out))
    for bad in ("../victim/x", str(secret), "images/../../victim/x"):
        with pytest.raises(PathEscape):
            store.remove(bad)
        with pytest.raises(PathEscape):
            store.write_bytes(bad, b"x")
    (out / "images").symlink_to(secret.parent)  # a planted link inside our own output
    with pytest.raises(PathEscape, match="outside"):
        store.remove("images/x")
    assert secret.read_bytes() == VICTIM_TEXT


def test_opening_a_store_creates_nothing(tmp_path):
    OutputStore(str(tmp_path / "not-yet"))
    assert not (tmp_path / "not-yet").exists()


# --------------------------------------------------------------------------- manifests
def manifest_text(**changes):
    doc = {
        "shard": SHARD,
        "trajectories": ["snow/001/seed_0001"],
        "files": {f"images/{SHARD}.tar": GOOD},
        "n_samples": 6,
        "failed": {},
        "stats": {"unet_evals": 1.0},
        "classifiers": ["a"],
    }
    doc.update(changes)
    return json.dumps(doc)


def test_a_valid_manifest_parses():
    m = parse_manifest(manifest_text(), f"manifest/{SHARD}.json")
    assert m.shard == SHARD and m.files[f"images/{SHARD}.tar"]["size"] == 3


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"files": {"../../victim/x": GOOD}}, "../../victim/x"),
        ({"files": {"/etc/passwd": GOOD}}, "/etc/passwd"),
        ({"files": {"images/shard-ffffffffffffffff.tar": GOOD}}, "not a file of shard"),  # another shard's file
        ({"files": {"report/index.html": GOOD}}, "report/index.html"),
        ({"files": [f"images/{SHARD}.tar"]}, "'files' must map"),
        ({"files": {f"images/{SHARD}.tar": {"size": "3", "sha256": "0" * 64}}}, "size must be an integer"),
        ({"shard": "../x"}, "'shard' must look like"),
        ({"shard": "shard-ffffffffffffffff"}, "but the file is"),
        ({"trajectories": "snow/001"}, "'trajectories' must be a list"),
        ({"stats": {"x": float("inf")}}, "non-finite"),
        ({"extra": 1}, "unknown keys"),
    ],
)
def test_hostile_manifests_are_refused(changes, needle):
    with pytest.raises(ManifestError) as err:
        parse_manifest(manifest_text(**changes), f"manifest/{SHARD}.json")
    assert needle in str(err.value) and f"manifest/{SHARD}.json" in str(err.value)


def test_malformed_manifest_texts_are_refused():
    for text in ("[]", "{", nested_json(5000), b"\xff\xfe"):
        with pytest.raises(ManifestError, match=f"manifest/{SHARD}.json"):
            parse_manifest(text, f"manifest/{SHARD}.json")


def test_own_naming_scheme():
    assert is_own_file(f"images/{SHARD}.tar") and is_own_file(f"predictions/{SHARD}.0badcafe.parquet")
    assert is_own_file(f"samples/.tmp-{'a' * 32}-{SHARD}.parquet")
    for foreign in ("images/holiday.tar", "samples/survey.parquet", f"images/{SHARD}.tar.bak", "images/.tmp-x"):
        assert not is_own_file(foreign)


def test_safejson_bounds():
    assert loads('{"a": [1, 2]}', "f") == {"a": [1, 2]}
    for text, needle in (("NaN", "non-finite"), ('{"s": Infinity}', "non-finite"), (nested_json(100), "nested deeper")):
        with pytest.raises(JSONInputError, match=needle):
            loads(text, "f.json")


# --------------------------------------------------------------------------- sources
def test_annotations_escaping_the_source_are_refused(tmp_path):
    from pipeline.sources import SourceError, open_source

    secret = victim(tmp_path)
    (secret.parent / "secret.png").write_bytes(png_bytes(1))
    root = tmp_path / "CNS"
    ok = {"snow/001_goldfish/seed_0000_scale_0000.png": png_bytes(2)}
    for bad in (
        "snow/../../victim/secret.png",
        "snow/001_goldfish/../../../victim/secret.png",
        str(secret.parent / "secret.png"),
    ):
        cns_source(root, [cns_entry("snow/001_goldfish/seed_0000_scale_0000.png"), cns_entry(bad, seed=1)], ok)
        with pytest.raises(SourceError) as err:
            open_source(str(root), label_space())
        assert "images[1]" in str(err.value) and "annotations_cns.json" in str(err.value)
        assert "not found" not in str(err.value)  # nothing said about files outside


def test_symlinked_images_leaving_the_source_need_the_opt_in(tmp_path):
    from pipeline.sources import SourceError, open_source

    outside = tmp_path / "outside"
    (outside / "001_goldfish").mkdir(parents=True)
    (outside / "001_goldfish" / "seed_0000_scale_0000.png").write_bytes(png_bytes(3))
    root = tmp_path / "CNS"
    cns_source(root, [cns_entry("snow/001_goldfish/seed_0000_scale_0000.png")], {})
    (root / "snow").mkdir()
    (root / "snow" / "001_goldfish").symlink_to(outside / "001_goldfish")
    with pytest.raises(SourceError, match="symbolic link"):
        open_source(str(root), label_space())
    src = open_source(str(root), label_space(), follow_symlinks=True)
    assert src.n_images == 1

    folders = tmp_path / "folders"
    folders.mkdir()
    (folders / "001_goldfish").symlink_to(outside / "001_goldfish")
    with pytest.raises(SourceError, match="symbolic link"):
        open_source(str(folders), label_space(), kind="folders")
    assert open_source(str(folders), label_space(), kind="folders", follow_symlinks=True).n_images == 1


@pytest.mark.parametrize("scale", ["Infinity", "NaN", "1e999"])
def test_non_finite_annotation_scales_are_refused(tmp_path, scale):
    from pipeline.sources import SourceError, open_source

    root = tmp_path / "CNS"
    cns_source(root, [], {"snow/001_goldfish/a.png": png_bytes(1)})
    text = json.dumps({"images": [cns_entry("snow/001_goldfish/a.png")]}).replace('"scale": 0.0', f'"scale": {scale}')
    (root / "annotations_cns.json").write_text(text)
    with pytest.raises(SourceError) as err:
        open_source(str(root), label_space())
    assert "annotations_cns.json" in str(err.value)


def test_deeply_nested_annotations_are_refused(tmp_path):
    from pipeline.sources import SourceError, open_source

    root = tmp_path / "CNS"
    root.mkdir()
    (root / "annotations_cns.json").write_text('{"images": ' + nested_json(10_000) + "}")
    with pytest.raises(SourceError, match="nested deeper"):
        open_source(str(root), label_space())


def test_samples_table_cannot_name_a_shard_outside_the_source(tmp_path):
    from hostile import synthetic_output, tiny_cfg_path

    from pipeline.sources import SourceError, open_source

    out = tmp_path / "out"
    store = synthetic_output(out, tiny_cfg_path(tmp_path))
    # a samples table (committed, hashes updated) whose 'shard' column leaves the source
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    man = next(store.manifests())
    rel = f"samples/{man.shard}.parquet"
    table = pq.read_table(io.BytesIO(store.read_bytes(rel)))
    col = pa.array(["../victim/x.tar"] * table.num_rows)
    table = table.set_column(table.schema.get_field_index("shard"), "shard", col)
    buf = io.BytesIO()
    pq.write_table(table, buf)
    meta = store.write_bytes(rel, buf.getvalue())
    man.files[rel] = meta
    store.commit_manifest(man)
    before = tree_digest(tmp_path, skip=out)
    with pytest.raises(SourceError, match="leaves its root"):
        open_source(str(out), label_space())
    assert tree_digest(tmp_path, skip=out) == before


def test_slider_pattern_cannot_leave_the_store():
    from pipeline.config import GeneratorSpec
    from pipeline.models.diffusion import slider_path

    spec = GeneratorSpec(slider_store="/stores/sliders", slider_pattern="{class_name}/{shift}.safetensors")
    assert slider_path(spec, 1, "snow", "goldfish") == "/stores/sliders/goldfish/snow.safetensors"
    with pytest.raises(PathEscape, match="slider_pattern"):
        slider_path(spec, 1, "snow", "../../../etc")
