"""Builders of hostile inputs for the safety tests: crafted manifests, foreign directories,
traversing annotations, bad configs, and a fingerprint of everything outside an output.

``synthetic_output`` writes a complete build output of ``configs/tiny.yaml``'s plan with
the real write stage and made-up pixels and scores (no model runs), so the tests can
resume, aggregate and repair real outputs in a second or two.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from buildproc import tiny_config

VICTIM_TEXT = b"precious data that is not ours\n"


HOLD = """
import sys, time
from pipeline.io.lease import hold_lease
with hold_lease(sys.argv[1], "build"):
    print("held", flush=True)
    time.sleep(600)
"""


def start_holder(out: Path) -> subprocess.Popen:
    """Another process on this host holding the lease of ``out`` (with the default timeout,
    so its heartbeat is slow) until it is killed."""
    env = {k: v for k, v in os.environ.items() if k != "CNSBENCH_LEASE_TIMEOUT_S"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "held"
    return proc


def tree_digest(root: Path, skip: Path | None = None) -> dict[str, str]:
    """{relative path: sha256 or link target or 'dir'} of everything under ``root`` except ``skip``."""
    out: dict[str, str] = {}
    skip_s = str(skip) if skip else None
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        if skip_s and (dirpath == skip_s or dirpath.startswith(skip_s + os.sep)):
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            if skip_s and (p == skip_s or p.startswith(skip_s + os.sep)):
                continue
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = "link:" + os.readlink(p)
            elif os.path.isdir(p):
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


def victim(tmp: Path) -> Path:
    """A file outside every output and source that nothing may read, change or delete."""
    d = tmp / "victim"
    d.mkdir(parents=True, exist_ok=True)
    f = d / "x"
    f.write_bytes(VICTIM_TEXT)
    return f


def png_bytes(value: int, size: int = 8) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), (value % 256, 40, 200)).save(buf, format="PNG")
    return buf.getvalue()


def tiny_cfg_path(tmp: Path, mutate=None, name: str = "tiny.yaml") -> Path:
    return tiny_config(tmp, mutate, name=name)


def synthetic_output(out: Path, cfg_path: Path, per_shard: int = 2, correct=None, kept=None) -> Any:
    """A committed output of the config's whole plan, written by the real write stage.

    By default every classifier is right at the first two scales and wrong from the third on,
    and every image is kept; ``correct`` / ``kept`` (``f(class_id, seed, shift, scale index)
    -> bool``) say otherwise."""
    from pipeline import plan
    from pipeline.output_run import write_config
    from pipeline.config import load_config
    from pipeline.io.ownership import claim_output
    from pipeline.io.store import OutputStore
    from pipeline.stages.write import WriteStage

    cfg = load_config(cfg_path)
    store = OutputStore(str(out))
    claim_output(store)
    write_config(store, cfg)
    stage = WriteStage(cfg, str(out))
    stage.setup()
    names = [c.name for c in cfg.classifiers]

    def right(unit, shift: str, i: int) -> bool:
        return i < 2 if correct is None else bool(correct(unit.class_id, unit.seed, shift, i))

    rows = []
    for unit in plan.plan_units(cfg):
        for shift in unit.shifts:
            scales = cfg.scales_of(shift)
            n = len(scales)
            k = len(rows)
            rows.append(
                {
                    "trajectory_id": plan.trajectory_id(shift, unit.class_id, unit.seed),
                    "unit_id": plan.unit_id(unit.class_id, unit.seed),
                    "class_id": unit.class_id,
                    "class_name": cfg.benchmark.class_name(unit.class_id),
                    "seed": unit.seed,
                    "shift": shift,
                    "scales": list(scales),
                    "sample_ids": [plan.sample_id(shift, unit.class_id, unit.seed, s) for s in scales],
                    "images": [png_bytes(k * 10 + i) for i in range(n)],
                    "clip_text": [30.0] * n,
                    "clip_shift_text": [36.0] * n,
                    "clip_image": [0.9] * n,
                    "dino_image": [0.9] * n,
                    "clip_shift_alignment": [0.1] * n,
                    "n_pass": [4] * n,
                    "kept": [True if kept is None else bool(kept(unit.class_id, unit.seed, shift, i)) for i in range(n)],
                    # right at scale 0, wrong from the third scale on: a real failure point
                    "pred_top1": [[unit.class_id if right(unit, shift, i) else 0 for _ in names] for i in range(n)],
                    "pred_top5": [[[unit.class_id, 0, 2, 3, 4] for _ in names] for i in range(n)],
                    "pred_p_true": [[0.9 if right(unit, shift, i) else 0.1 for _ in names] for i in range(n)],
                    "unet_evals": 0.0,
                    "gen_seconds": 0.0,
                    "error": None,
                }
            )
    rows.sort(key=lambda r: r["trajectory_id"])
    for i in range(0, len(rows), per_shard):
        stage.write_shard(rows[i : i + per_shard])
    return store


def manifest_paths(out: Path) -> list[Path]:
    return sorted((out / "manifest").glob("*.json"))


def tamper_manifest(path: Path, **changes: Any) -> dict:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))
    return data


def crafted_manifest(out: Path, shard: str, files: Any, trajectories: list[str] | None = None) -> Path:
    """A manifest written by someone else: ``files`` exactly as given."""
    path = out / "manifest" / f"{shard}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "shard": shard,
        "trajectories": trajectories or [],
        "files": files,
        "n_samples": 0,
        "failed": {},
        "stats": {},
        "classifiers": None,
    }
    path.write_text(json.dumps(doc))
    return path


def foreign_directory(d: Path) -> dict[str, str]:
    """A directory that is not a cnsbench output but holds names a build would touch."""
    (d / "images").mkdir(parents=True)
    (d / "samples").mkdir()
    (d / "report").mkdir()
    (d / "images" / "holiday.tar").write_bytes(b"not ours" * 10)
    (d / "images" / "shard-0123456789abcdef.tar").write_bytes(b"looks like ours, is not")
    (d / "samples" / "survey.parquet").write_bytes(b"parquet of someone else")
    (d / "report" / "index.html").write_text("<h1>their report</h1>")
    (d / "notes.txt").write_text("hello")
    return tree_digest(d)


def cns_source(root: Path, entries: list[dict[str, Any]], images: dict[str, bytes]) -> Path:
    """A published-layout source: ``annotations_cns.json`` with ``entries`` and the given files."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, data in images.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    doc = {"info": {}, "scales": [0, 1.0], "classes": [], "shifts": [], "images": entries}
    (root / "annotations_cns.json").write_text(json.dumps(doc))
    return root


def cns_entry(image: str, shift: str = "snow", cls: int = 1, seed: int = 0, scale: float = 0.0) -> dict[str, Any]:
    return {"image": image, "shift": shift, "class": cls, "seed": seed, "scale": scale}


def nested_json(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.fixture
def built(tmp_path):
    """(config path, output dir): a committed synthetic output of the tiny config (8 trajectories, 4 shards).
    A test module takes it with ``from hostile import built``."""
    cfg = tiny_cfg_path(tmp_path)
    out = tmp_path / "out"
    synthetic_output(out, cfg)
    return cfg, out
