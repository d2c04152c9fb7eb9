"""bench/standins.py: the stand-in chain's classify stages get their modelled seconds per image
from the driver, so that their workers never import the classifier kinds' modules (torch)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _standins():
    spec = importlib.util.spec_from_file_location("bench_standins", ROOT / "bench" / "standins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_classify_seconds_per_image_come_from_the_driver():
    from pipeline.config import parse_config
    from pipeline.perf import data, latency

    standins = _standins()
    cfg = parse_config(yaml.safe_load((ROOT / "configs" / "cns_bench.yaml").read_text()))
    groups = [[0, 1], [2]]
    pool = {"actors": 1, "gpu_share": 0.25}
    pools = {"generate": pool, "filter": pool, "write": {"actors": 1, "gpu_share": 0.0},
             **{f"classify:{k}": pool for k in range(len(groups))}}
    chain = standins.standin_chain(cfg, {"gpu": "h100", "pools": pools, "groups": groups})
    classify = [s for s in chain if s.stage.__name__ == "StandInClassify"]
    assert [s.kwargs["classifiers"] for s in classify] == groups
    spec = data.gpu_spec("h100")
    for s, group in zip(classify, groups):
        expected = latency.image_seconds(cfg, spec, "classify", group)[0]
        assert expected > 0 and s.kwargs["per_image"] == expected
