"""A build on an autoscaling cluster, measured: GPU nodes from zero under the GPU budget, the ramp
with and without the request up front, how busy the GPU nodes were, how soon they were given back.

The cluster is Ray's fake multi-node provider (``tests/raycluster.py`` ``AutoscalingCluster``: a
head with CPUs only and a GPU node type, min 0, max ``--max-gpus``, idle timeout 15 s, in its own
PID namespace).  The build is ``bench/scale.py``'s stand-in build (``bench/standins.py``: the real
driver, Ray Data, object store and writers; GPU work modelled as time at ``--compression``) with
``--max-gpus``: every GPU pool starts at one actor and grows to its share of the budget as nodes
join.  Generation actors hold three quarters of a GPU (``GENERATE_SHARE``), so that every 1-GPU
node holds one of them and a quarter-GPU filter or classify actor.  Three runs:

* ``upfront``: the build requests its whole budget at its start (what a build does);
* ``paced``: ``CNSBENCH_UPFRONT_REQUEST=0``, the autoscaler adding nodes as pending actors ask;
* ``fixed``: the same build on a fixed simulated cluster of ``--max-gpus`` GPUs
  (``bench/simcluster.py``, as ``bench/scale.py``), its pools at their largest from the start,
  with as many logical CPUs per GPU as the fake GPU nodes (2) and 2 more for the driver.

    python bench/autoscale.py --max-gpus 4 --json       # the contract's run
    python bench/autoscale.py --max-gpus 8 --images 2520 --json

Reported: ``gpu_nodes_max``, ``generate_actors_max``, seconds from the build's start to the first
and to the last GPU node (both ways), ``gpu_busy_share`` (GPU-seconds the stand-ins worked / GPU
node-seconds up during the build; ``gpu_node_s_split``: those node-seconds before the first GPU
work, while working, and after the last), ``scaled_down_s`` (build end to 0 GPU nodes), the wall
time against the fixed cluster's, and ``digest_equal`` (the outputs' content digests).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "bench"))
sys.path.append(str(ROOT / "tests"))

import scale  # noqa: E402
import scale_model  # noqa: E402

GIB = 2**30
IDLE_TIMEOUT_MIN = 0.25
SCALE_DOWN_LIMIT_S = 300


# Generation on half a GPU, the filter's and the classifier groups' actors on a quarter each: at
# 4 GPUs the budget holds 7 generation actors and the two quarter-GPU actors, all 4 GPUs, and any
# node holds two generation actors or one beside up to two quarter-GPU ones.  Layouts measured
# (BENCHMARKS.md, "Autoscaling" and "Pools that start at their share (2026-11-28)"): on whole GPUs
# (cns_bench.yaml's num_gpus 1) generation held 3 GPUs and the quarter-GPU actors the fourth,
# mostly idle (GPU busy share 0.535); on three quarters, 4 generation actors each beside a
# quarter-GPU actor (0.626); on seven eighths with the others on an eighth, two small actors on
# one node left it no room for generation (0.556); on half, with the others on an eighth, a
# quarter of a GPU was left over and the filter's one actor was busy 0.78 (0.712).
GENERATE_SHARE = 0.5
AUX_SHARE = scale_model.QUARTER


def autoscale_layout(shared: dict) -> dict[str, dict]:
    """Every pool at one actor (the budget grows the GPU pools)."""
    pools = {k: {"actors": 1, "gpu_share": AUX_SHARE} for k in shared["seconds"] if k != "generate"}
    return {"generate": {"actors": 1, "gpu_share": GENERATE_SHARE}, **pools, "write": {"actors": 1, "gpu_share": 0.0}}


class Sampler(threading.Thread):
    """GPU nodes and alive generate actors, sampled about once a second with their time."""

    def __init__(self, cluster) -> None:
        super().__init__(daemon=True)
        self.cluster, self.stop_ = cluster, threading.Event()
        self.samples: list[tuple[float, int, int]] = []  # (time, GPU nodes, generate actors)

    def run(self) -> None:
        from ray.util.state.common import ListApiOptions, StateResource

        while not self.stop_.is_set():
            try:
                nodes = len(self.cluster.gpu_nodes())
                actors = self.cluster._state().list(StateResource.ACTORS, options=ListApiOptions(
                    filters=[("state", "=", "ALIVE")], detail=True), raise_on_missing_output=False)
                gen = sum("StandInGenerate" in (a.class_name or "") for a in actors)
                self.samples.append((time.time(), nodes, gen))
            except Exception:  # noqa: BLE001 - the state API is busy: sample again
                pass
            self.stop_.wait(1.0)


def machine_cpu_seconds() -> float:
    """CPU-seconds this machine has spent working since boot (every process: user, nice, system, irq)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:8]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / os.sysconf("SC_CLK_TCK")


def run_build(args, shared: dict, pools: dict, address: str, env: dict, workdir: Path, tag: str) -> dict:
    """One stand-in build with the driver in a subprocess; its figures and output."""
    out, stats = workdir / f"out-{tag}", workdir / f"stats-{tag}"
    raw = json.loads(json.dumps(shared["raw"]))
    raw.setdefault("resources", {})["max_gpus"] = args.max_gpus
    sim = {"gpu": args.gpu, "compression": args.compression, "stats_dir": str(stats), "palette": shared["palette"],
           "shares": {k: p["gpu_share"] for k, p in pools.items() if ":" not in k}
           | {"classify": AUX_SHARE},
           "pools": pools, "groups": shared["groups"], "actors": sum(p["actors"] for p in pools.values()),
           "cpu_model_s": shared["cpu"], "startup_s": shared["startup_s"], "hold_s": 0.0}
    job, result, log = workdir / f"job-{tag}.json", workdir / f"result-{tag}.json", workdir / f"driver-{tag}.log"
    job.write_text(json.dumps({"raw": raw, "output": str(out), "sim": sim, "address": address, "result": str(result)}))
    cpu0, t0 = machine_cpu_seconds(), time.time()
    with open(log, "w") as fh:
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "scale.py"), "--driver", str(job)], env=env,
                              stdout=fh, stderr=subprocess.STDOUT, text=True)
    cpu_share = (machine_cpu_seconds() - cpu0) / ((time.time() - t0) * (os.cpu_count() or 1))
    if proc.returncode:
        raise RuntimeError(f"the {tag} build failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
    driver = json.loads(result.read_text())
    work, spans = 0.0, []
    for stage, lines in scale.read_stats(stats).items():
        share = sim["shares"].get(stage, 0.0)
        work += sum((ln["end"] - ln["start"]) * share for ln in lines)
        spans += [(ln["start"], ln["end"]) for ln in lines] if share > 0 else []
    first, last = (min(a for a, _ in spans), max(b for _, b in spans)) if spans else (None, None)
    busy = {stage: round(sum(ln["end"] - ln["start"] for ln in lines) / max(1e-9, (last - first) * n), 3)
            for stage, lines in scale.read_stats(stats).items()
            if lines and first is not None and (n := len({ln["pid"] for ln in lines}))}
    return {**driver, "gpu_work_s": work, "first_work": first, "last_work": last, "output": str(out),
            "machine_cpu_share": round(cpu_share, 3), "busy": busy, "log": log.read_text()}


def node_seconds(samples: list[tuple[float, int, int]], t0: float, t1: float) -> float:
    """GPU-node-seconds up between ``t0`` and ``t1`` (each sample's count held to the next)."""
    during = [s for s in samples if t0 <= s[0] <= t1]
    return sum((b[0] - a[0]) * a[1] for a, b in zip(during, during[1:]))


def timeline(samples: list[tuple[float, int, int]], t0: float, t1: float) -> dict:
    """First and last GPU node (seconds after ``t0``), the most nodes and actors, node-seconds to ``t1``."""
    during = [s for s in samples if t0 <= s[0] <= t1]
    peak = max((s[1] for s in during), default=0)
    first = next((s[0] - t0 for s in during if s[1] >= 1), None)
    last = next((s[0] - t0 for s in during if s[1] >= peak), None) if peak else None
    return {"gpu_nodes_max": peak, "generate_actors_max": max((s[2] for s in during), default=0),
            "first_gpu_node_s": None if first is None else round(first, 1),
            "last_gpu_node_s": None if last is None else round(last, 1), "gpu_node_s": node_seconds(samples, t0, t1)}


def autoscaling_run(args, shared: dict, workdir: Path, tag: str, upfront: bool, cluster=None) -> dict:
    """One build on a fake autoscaling cluster (``cluster``, a running ``AutoscalingCluster`` with
    no GPU node up, else a new one of ``--max-gpus`` GPU nodes at most)."""
    from raycluster import AutoscalingCluster

    own = cluster is None
    base = Path(tempfile.mkdtemp(prefix="cnsb-", dir="/tmp"))
    if own:
        cluster = AutoscalingCluster(base, {"CPU": 2, "GPU": 1, "memory": 2 * GIB}, max_workers=args.max_gpus,
                                     idle_timeout_minutes=IDLE_TIMEOUT_MIN)
    try:
        if own:
            cluster.start()
        env = {**cluster.env, "PYTHONPATH": str(ROOT), "CNSBENCH_UPFRONT_REQUEST": "1" if upfront else "0"}
        sampler = Sampler(cluster)
        sampler.start()
        try:
            build = run_build(args, shared, autoscale_layout(shared), cluster.gcs_address, env, workdir, tag)
            end = time.time()
            while cluster.gpu_nodes() and time.time() - end < SCALE_DOWN_LIMIT_S:
                time.sleep(1)
            scaled_down = time.time() - end
        finally:
            sampler.stop_.set()
            sampler.join()
        t0, t1 = build["t_start"], build["t_end"]
        line = timeline(sampler.samples, t0, t1)
        # Where the GPU-node-seconds went: before the first GPU work (nodes starting, actors
        # starting and loading), during it, and after the last (the build's own end).
        a, b = build["first_work"] or t1, build["last_work"] or t1
        split = {"before_work": node_seconds(sampler.samples, t0, a), "working": node_seconds(sampler.samples, a, b),
                 "after_work": node_seconds(sampler.samples, b, t1)}
        return {**line, "scaled_down_s": round(scaled_down, 1), "wall_s": round(t1 - t0, 1),
                "gpu_busy_share": round(build["gpu_work_s"] / line["gpu_node_s"], 3) if line["gpu_node_s"] else None,
                "gpu_work_s": round(build["gpu_work_s"], 1),
                "gpu_node_s_split": {k: round(v, 1) for k, v in split.items()},
                "first_work_s": round(a - t0, 1), "machine_cpu_share": build["machine_cpu_share"],
                "busy": build["busy"], "images": build["images"], "output": build["output"]}
    finally:
        if own:
            cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


def fixed_run(args, shared: dict, workdir: Path) -> dict:
    """The same build (the same budget) on a fixed simulated cluster of ``--max-gpus`` GPUs: its
    GPU pools grow to their shares at once, every GPU being there from the start."""
    from simcluster import SimCluster

    # As many logical CPUs per GPU as the fake GPU nodes declare (2), and the head's 2 for the
    # driver's reservations: its actors wait for no CPU the autoscaling run's did not.
    cluster = SimCluster(nodes=2, gpus=args.max_gpus, cpus_per_node=2 * math.ceil(args.max_gpus / 2) + 2)
    try:
        build = run_build(args, shared, autoscale_layout(shared), cluster.address,
                          {**cluster.env, "PYTHONPATH": str(ROOT)}, workdir, "fixed")
        return {"wall_s": round(build["t_end"] - build["t_start"], 1), "images": build["images"],
                "output": build["output"]}
    finally:
        cluster.stop()


def main(argv: list[str] | None = None, cluster=None) -> dict:
    """``cluster``: a running ``AutoscalingCluster`` to build on (the test suite's), instead of one per run."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-gpus", type=int, default=4, help="GPU budget = the GPU node type's max_workers")
    p.add_argument("--gpu", default="h100", help="GPU kind the stand-ins' latencies are modelled on")
    p.add_argument("--images", type=int, default=None, help="plan size (rounded up to whole classes)")
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--shifts", type=int, default=2)
    p.add_argument("--classifiers", type=int, default=4, help="only the config's first N classifiers")
    p.add_argument("--compression", type=float, default=3.0, help="time compression of the modelled work")
    p.add_argument("--writers", type=int, default=1)
    p.add_argument("--skip-paced", action="store_true", help="leave out the run without the request up front")
    p.add_argument("--skip-fixed", action="store_true", help="leave out the fixed cluster's run (no digest, no ratio)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from pipeline.io.digest import output_digest

    workdir = Path(tempfile.mkdtemp(prefix="cnsbench-autoscale-"))
    try:
        shared = scale.prepare(args, workdir)
        shared["writers"] = args.writers
        upfront = autoscaling_run(args, shared, workdir, "upfront", upfront=True, cluster=cluster)
        paced = None if args.skip_paced else autoscaling_run(args, shared, workdir, "paced", upfront=False,
                                                             cluster=cluster)
        fixed = None if args.skip_fixed else fixed_run(args, shared, workdir)
        digests = [output_digest(r["output"]) for r in (upfront, fixed)] if fixed else None
        result = {
            "max_gpus": args.max_gpus, "images": upfront["images"], "compression": args.compression,
            "gpu_nodes_max": upfront["gpu_nodes_max"], "generate_actors_max": upfront["generate_actors_max"],
            "first_gpu_node_s": upfront["first_gpu_node_s"], "last_gpu_node_s": upfront["last_gpu_node_s"],
            "first_gpu_node_s_without_request": paced and paced["first_gpu_node_s"],
            "last_gpu_node_s_without_request": paced and paced["last_gpu_node_s"],
            "gpu_busy_share": upfront["gpu_busy_share"], "gpu_work_s": upfront["gpu_work_s"],
            "gpu_node_s_split": upfront["gpu_node_s_split"], "first_work_s": upfront["first_work_s"],
            "busy_while_working": upfront["busy"], "machine_cpu_share": upfront["machine_cpu_share"],
            "scaled_down_s": upfront["scaled_down_s"],
            "wall_s": upfront["wall_s"], "wall_s_without_request": paced and paced["wall_s"],
            "wall_s_fixed": fixed and fixed["wall_s"],
            "wall_vs_fixed": fixed and round(upfront["wall_s"] / fixed["wall_s"], 3),
            "digest_equal": digests[0] == digests[1] if digests else None,
            "command": "python bench/autoscale.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": scale.machine(),
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result, indent=1) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return result


if __name__ == "__main__":
    main()
