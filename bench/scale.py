"""A CNS-scale build on a simulated multi-node GPU cluster: the pipeline's efficiency at scale.

What runs once for the whole cluster is real: the driver (``pipeline.build.build``: lease,
manifest scan, plan, the Ray Data executor, the shard tally), Ray Data's scheduling, the
object store and the writers (WebDataset tars, Parquet tables, manifests).  What runs inside
each GPU node's actors is modelled as time (``bench/standins.py``, ``bench/scale_model.py``):
the models (the latency model on the simulated GPU), the real stages' CPU work (measured
here once with the real code), the actors' start-up (the rehearsal's measurement); the
stand-ins carry real 256 px PNGs through the object store into the shards.  The cluster is
``ray start`` nodes on this machine declaring GPUs they do not have (``bench/simcluster.py``).

    python bench/scale.py --gpus 16 --images 84000 --json      # the contract's run
    python bench/scale.py --plan-only --images 420000 --json   # the paper's plan: the driver alone
    python bench/scale.py --cluster none --gpus 1 --classes 1 --seeds 1 --shifts 2 --compression 50 --json

Modelled time is divided by the time compression.  Unless ``--compression`` is given, a
calibration build (``--calibrate-units`` units) measures the simulation's CPU on this machine,
a base and a cost per image (:func:`calibrate`), and the main run's compression is the one that
keeps it at ``--cpu-target`` of the machine (at most 0.6).  Efficiency = the modelled GPU work / (GPUs x the wall time),
both compressed; the wall time from the moment every actor of the chain has started (on a
cluster each node starts its own actors at once; this machine starts them one after
another) to the last shard committed, the actors' modelled start-up inside it.
``efficiency_without_startup`` leaves the first unit's start-up out (what ``cnsbench
estimate`` divides by, adding the start-up itself).  ``python -m pipeline.perf.efficiency
--write RESULT.json`` records a run for the estimate; this script writes only its own output.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "bench"))  # after the root: bench/pipeline.py must not shadow the package

import scale_model  # noqa: E402
from simcluster import CpuMeter, SimCluster, descendants  # noqa: E402

BASE_CONFIG = ROOT / "configs" / "cns_bench.yaml"
# The paper has 14 shifts; the config names the 10 the public code names.
EXTRA_SHIFTS = ["dust_storm", "fog", "autumn_style", "night"]
STAGES = ("generate", "filter", "classify", "write")
GPU_STAGES = ("generate", "filter", "classify")
SCALES = 6
MAX_CPU = 0.6


# ---------------------------------------------------------------- the simulated build
def plan_size(args) -> tuple[int, int, int]:
    """(classes, seeds, shifts): ``--images`` rounded up to whole classes of ``--seeds`` x ``--shifts`` x 6."""
    if args.images:
        return math.ceil(args.images / (args.seeds * args.shifts * SCALES)), args.seeds, args.shifts
    return args.classes, args.seeds, args.shifts


def sim_raw(args, classes: int) -> dict:
    """``configs/cns_bench.yaml`` with the simulated plan, as a dict (classify actors at a quarter GPU)."""
    import yaml

    raw = yaml.safe_load(BASE_CONFIG.read_text())
    shifts = (raw["benchmark"]["shifts"] + EXTRA_SHIFTS)[: args.shifts]
    raw["benchmark"].update(classes=list(range(classes)), seeds=list(range(1, args.seeds + 1)), shifts=shifts)
    if args.classifiers:
        raw["classifiers"] = raw["classifiers"][: args.classifiers]
    res = raw.setdefault("resources", {})
    for stage in ("filter", "classify"):  # quarter-GPU actors, a quarter of a logical CPU each
        res[stage] = {**res.get(stage, {}), "num_gpus": scale_model.QUARTER, "num_cpus": scale_model.QUARTER}
    res["write"] = {**res.get("write", {}), "pool_size": args.writers, "num_cpus": 1.0}
    return raw


def prepare(args, workdir: Path) -> dict:
    """What every run of this invocation shares: the config, the palette, the CPU parts, the groups."""
    from pipeline.config import parse_config

    classes, _, _ = plan_size(args)
    raw = sim_raw(args, classes)
    cfg = parse_config(raw)
    actors = scale_model.actors(cfg, args.gpu)
    groups = [a.members for a in actors if a.stage == "classify"]
    startup = {a.stage if a.stage != "classify" else "classify:" + "-".join(map(str, a.members)): a.startup_s
               for a in actors}
    paths = scale_model.palette(workdir / "palette")
    cpu = scale_model.cpu_parts(cfg, paths)
    return {"raw": raw, "groups": groups, "startup_s": startup, "palette": paths, "cpu": cpu,
            "seconds": scale_model.per_image(cfg, args.gpu, cpu, groups),
            "images_per_unit": args.shifts * SCALES, "units": classes * args.seeds}


def layout_for(shared: dict, n_gpus: int) -> dict[str, dict]:
    pools = scale_model.pool_layout(n_gpus, shared["seconds"])
    return {**pools, "write": {"actors": shared["writers"], "gpu_share": 0.0}}


def peak_rss_mb() -> float:
    """This process's peak resident set (``VmHWM``; ``ru_maxrss`` would keep the forking parent's across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def hold_model_libraries() -> None:
    """Import the model libraries a real build's driver holds before its run: it projects its
    pools' memory with them (``pipeline.perf.memory``), and its weights check (which classifier
    files make the predictions, ``OutputRun.start``) reads the classifier kinds from them.  The
    stand-in chain projects no memory, so without this the driver's figures would count the
    import (about 2 CPU-seconds on the 2-core reference machine, once per run) as work of the run."""
    import timm  # noqa: F401

    import pipeline.models.classifiers  # noqa: F401


def drive(raw: dict, output: str, sim: dict, address: str | None, echo=None) -> dict:
    """Run the real build of ``raw`` into ``output`` with the stand-in stages; return its figures."""
    import ray.cloudpickle

    import bench.standins as standins
    from pipeline.build import Stages, build
    from pipeline.config import parse_config

    hold_model_libraries()
    t_start = time.time()
    cpu_main0, cpu_proc0 = time.thread_time(), time.process_time()
    ray.cloudpickle.register_pickle_by_value(standins)  # the workers need not find bench/
    cfg = parse_config(raw)
    stages = Stages(chain=lambda cfg, commit: standins.standin_chain(cfg, sim, commit),
                    check=lambda cfg, todo: None)  # no weights or sliders: the stand-ins load none
    summary = build(cfg, output, address=address, runner="ray", aggregate=False, echo=echo or (lambda line: None),
                    stages=stages)
    return {
        "t_start": t_start,
        "t_end": time.time(),
        "images": summary.images_written,
        "shards": summary.shards_written,
        "failed": summary.trajectories_failed,
        "driver_peak_rss_mb": peak_rss_mb(),
        "driver_main_thread_cpu_s": time.thread_time() - cpu_main0,
        "driver_other_threads_cpu_s": (time.process_time() - cpu_proc0) - (time.thread_time() - cpu_main0),
    }


def read_stats(stats_dir: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {s: [] for s in STAGES}
    for f in stats_dir.glob("*.jsonl"):
        stage = f.name.split("-", 1)[0]
        for line in f.read_text().splitlines():
            if line.strip():
                out[stage].append({**json.loads(line), "pid": f.stem.split("-", 1)[1]})
    return out


def one_run(args, shared: dict, cluster, n_gpus: int, compression: float, workdir: Path, tag: str,
            classes: int | None = None, calibrating: float = 0.0) -> dict:
    """One simulated build (in a driver subprocess on a cluster, else in this process), measured.

    ``calibrating``: every actor idles that many seconds once all have started (the base), the
    start-up is not modelled, and the generation's progress is marked (20 % of the units
    generated, all of them), so that the CPU per image is read off the steady part."""
    raw = shared["raw"] if classes is None else sim_raw(args, classes)
    units = len(raw["benchmark"]["classes"]) * len(raw["benchmark"]["seeds"])
    pools = layout_for(shared, n_gpus)
    out, stats = workdir / f"out-{tag}", workdir / f"stats-{tag}"
    sim = {"gpu": args.gpu, "compression": compression, "stats_dir": str(stats), "palette": shared["palette"],
           "shares": {"generate": pools["generate"]["gpu_share"], "filter": scale_model.QUARTER,
                      "classify": scale_model.QUARTER, "write": 0.0},
           "pools": pools, "groups": shared["groups"], "actors": sum(p["actors"] for p in pools.values()),
           "cpu_model_s": shared["cpu"], "startup_s": {} if calibrating else shared["startup_s"],
           "hold_s": calibrating}
    pids: list[int] = []
    meter = CpuMeter((lambda: cluster.our_pids() + descendants(pids)) if cluster else (lambda: []))
    stop = threading.Event()

    def watch_barrier() -> None:  # the measured window opens when every actor has started
        mark = stats / "barrier.json"
        while not stop.wait(0.5):
            if mark.exists():
                released = json.loads(mark.read_text())["released"]
                meter.mark("barrier", at=released)
                if calibrating and not stop.wait(max(0.0, released + calibrating - 0.5 - time.time())):
                    meter.mark("held")
                    for name, share in (("g20", 0.2), ("g100", 1.0)):  # units generated so far: one line each
                        while not stop.wait(0.25):
                            done = sum(f.read_text().count("\n") for f in stats.glob("generate-*.jsonl"))
                            if done >= share * units:
                                meter.mark(name)
                                progress[name] = done
                                break
                return

    progress: dict[str, int] = {}
    watcher = threading.Thread(target=watch_barrier, daemon=True)
    watcher.start()
    try:
        if cluster is None:
            driver = drive(raw, str(out), sim, None)
        else:
            job, result = workdir / f"job-{tag}.json", workdir / f"result-{tag}.json"
            job.write_text(json.dumps({"raw": raw, "output": str(out), "sim": sim, "address": cluster.address,
                                       "result": str(result)}))
            log = workdir / f"driver-{tag}.log"
            with open(log, "w") as fh:  # the workers' output reaches the driver's: the figures go to a file
                proc = subprocess.Popen([sys.executable, __file__, "--driver", str(job)], env=cluster.env,
                                        stdout=fh, stderr=subprocess.STDOUT, text=True)
                pids.append(proc.pid)
                proc.wait()
            if proc.returncode:
                raise RuntimeError(f"the driver failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
            driver = json.loads(result.read_text())
        meter.mark("end")
    finally:
        stop.set()
        meter.stop()
    if "barrier" not in meter.marks:
        meter.mark("barrier", at=json.loads((stats / "barrier.json").read_text())["released"])
    measured = measure(read_stats(stats), meter, driver, n_gpus, shared, pools, compression)
    measured["cpu_s_by_process"] = {k: round(v, 1) for k, v in meter.by_process("barrier", "end").items() if v >= 0.5}
    if "g100" in meter.marks:
        measured["idle"], measured["steady"] = meter.window("barrier", "held"), meter.window("g20", "g100")
        measured["steady_images"] = (progress["g100"] - progress["g20"]) * shared["images_per_unit"]
    shutil.rmtree(out, ignore_errors=True)  # the shards were checked by the build; free the disk
    return measured


def measure(stats: dict[str, list[dict]], meter: CpuMeter, driver: dict, n_gpus: int, shared: dict,
            pools: dict, compression: float) -> dict:
    t0 = meter.marks["barrier"][0]
    t1 = max(b["end"] for b in stats["write"])
    window = t1 - t0
    work = sum(b["work"] for s in GPU_STAGES for b in stats[s])
    startup = shared["startup_s"]
    # The first unit's path: each stage loads at its first batch (pipeline.perf.startup.chain_seconds).
    chain = sum(startup.values()) / compression
    busy = {}
    for stage in STAGES:
        actors = sum(p["actors"] for k, p in pools.items() if k.split(":")[0] == stage)
        busy[stage] = round(sum(b["end"] - b["start"] for b in stats[stage]) / (max(1, actors) * window), 3)
    images = driver["images"]
    per_k = 1000 / max(1, images)
    cpu = meter.window("barrier", "end")
    return {
        "images": images,
        "shards": driver["shards"],
        "failed": driver["failed"],
        "efficiency": work / n_gpus / window,
        "efficiency_without_startup": work / n_gpus / max(1e-9, window - chain),
        "efficiency_from_driver_start": work / n_gpus / (t1 - driver["t_start"]),
        "efficiency_bound": scale_model.bound(n_gpus, pools, shared["seconds"], shared["units"],
                                              shared["images_per_unit"]),
        "wall_s": window,
        "startup_s": chain,
        "actors_started_after_s": t0 - driver["t_start"],
        "gpu_work_s": work,
        "busy": busy,
        "cpu": cpu,
        "cpu_s_per_image": cpu["cpu_seconds"] / max(1, images),
        "cpu_s_per_1000_images": {
            "driver": driver["driver_main_thread_cpu_s"] * per_k,
            "ray_data_scheduling": driver["driver_other_threads_cpu_s"] * per_k,
            "writer": sum(b["cpu"] for b in stats["write"]) * per_k,
            **{f"{stage}_batches": sum(b["cpu"] for b in stats[stage]) * per_k for stage in GPU_STAGES},
        },
        "driver_peak_rss_mb": driver["driver_peak_rss_mb"],
    }


# ---------------------------------------------------------------- the plan alone
def plan_only(args) -> dict:
    """The driver's cost of the plan without the stages: an output with half the trajectories
    committed (real manifests, stand-in files), then the real build's lease, manifest scan,
    plan and resume diff in a fresh driver process, stopped before the stages start."""
    from pipeline.config import parse_config

    classes, _, _ = plan_size(args)
    raw = sim_raw(args, classes)
    workdir = Path(tempfile.mkdtemp(prefix="cnsplan-"))
    try:
        cfg = parse_config(raw)
        commit_half(cfg, workdir / "out")
        job = workdir / "job.json"
        job.write_text(json.dumps({"raw": raw, "output": str(workdir / "out"), "plan_only": True}))
        t0 = time.time()
        proc = subprocess.run([sys.executable, __file__, "--driver", str(job)], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"the planning driver failed:\n{proc.stderr[-3000:]}")
        driver = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"images": classes * args.seeds * args.shifts * SCALES, "seconds": round(driver["seconds"], 2),
            "process_seconds": round(driver["t_planned"] - t0, 2), "driver_peak_rss_mb": driver["driver_peak_rss_mb"],
            "trajectories_planned": driver["planned"], "trajectories_done_before": driver["done_before"]}


def commit_half(cfg, output: Path) -> None:
    """Every other trajectory of ``cfg`` committed in ``output`` as the writer commits shards."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline import plan
    from pipeline.output_run import write_config
    from pipeline.io.ownership import claim_output
    from pipeline.io.store import OutputStore, ShardManifest
    from pipeline.plan import schema
    from pipeline.stages.write import shard_name

    store = OutputStore(str(output))
    claim_output(store)
    write_config(store, cfg)
    ids = [plan.trajectory_id(s, c, seed) for c, seed, s in plan.iter_trajectories(cfg)][::2]
    per_shard = cfg.output.trajectories_per_shard
    tables: dict[tuple[str, int], bytes] = {}
    for lo in range(0, len(ids), per_shard):
        chunk = ids[lo: lo + per_shard]
        name, n = shard_name(chunk), len(chunk) * SCALES
        files = {f"images/{name}.tar": store.write_bytes(f"images/{name}.tar", b"x" * 16)}
        for kind, sch in (("samples", schema.SAMPLES), ("predictions", schema.PREDICTIONS)):
            if (kind, n) not in tables:
                buf = io.BytesIO()
                pq.write_table(pa.table({f.name: pa.nulls(n, f.type) for f in sch}, schema=sch), buf)
                tables[kind, n] = buf.getvalue()
            files[f"{kind}/{name}.parquet"] = store.write_bytes(f"{kind}/{name}.parquet", tables[kind, n])
        store.commit_manifest(ShardManifest(name, chunk, files, n, {}, {}))


def run_driver_job(path: str) -> None:
    job = json.loads(Path(path).read_text())
    if not job.get("plan_only"):
        figures = drive(job["raw"], job["output"], job["sim"], job["address"],
                        echo=lambda line: print(line, file=sys.stderr, flush=True))
        Path(job["result"]).write_text(json.dumps(figures))
        return
    from pipeline.build import Stages, build
    from pipeline.config import parse_config

    class Planned(Exception):
        pass

    seen: dict = {}

    def stop(cfg, commit):  # the stages would start here: the plan is done
        seen["t"] = time.time()
        raise Planned

    def note(line: str) -> None:
        if "trajectories planned" in line:
            words = line.split()
            seen["planned"], seen["done_before"] = int(words[1]), int(words[4])

    t0 = time.time()
    try:
        build(parse_config(job["raw"]), job["output"], runner="ray", aggregate=False, echo=note,
              stages=Stages(chain=stop, check=lambda cfg, todo: None))
    except Planned:
        pass
    print(json.dumps({"seconds": seen["t"] - t0, "t_planned": seen["t"], "planned": seen.get("planned"),
                      "done_before": seen.get("done_before"),
                      "driver_peak_rss_mb": round(peak_rss_mb(), 1)}))


# ---------------------------------------------------------------- main
def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU")
    return f"{os.cpu_count()}-core {model}, no GPU"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=16, help="simulated GPUs (the cluster declares this many)")
    p.add_argument("--gpu", default="h100", help="GPU kind the stand-ins' latencies are modelled on")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--images", type=int, default=None, help="plan size (rounded up to whole classes)")
    p.add_argument("--classes", type=int, default=20)
    p.add_argument("--seeds", type=int, default=50)
    p.add_argument("--shifts", type=int, default=14)
    p.add_argument("--classifiers", type=int, default=None, help="only the config's first N classifiers")
    p.add_argument("--compression", type=float, default=None, help="time compression (default: calibrated)")
    p.add_argument("--cpu-target", type=float, default=0.5, help="the simulation's CPU share of the machine to aim at")
    p.add_argument("--calibrate-units", type=int, default=100, help="units of the calibration build")
    p.add_argument("--calibrate-only", action="store_true", help="print the calibration and stop")
    p.add_argument("--calibrate-hold-s", type=float, default=12.0,
                   help="seconds the calibration's actors idle, started, to measure the base CPU")
    p.add_argument("--writers", type=int, default=2, help="writer actors (resources.write.pool_size)")
    p.add_argument("--sweep", type=int, nargs="*", default=None, help="also run these GPU counts (same image rate)")
    p.add_argument("--plan-only", action="store_true", help="the driver's plan, manifest scan and resume diff only")
    p.add_argument("--cluster", choices=("ray", "none"), default="ray", help="none: this process's Ray (tests)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--driver", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.driver:
        run_driver_job(args.driver)
        return {}
    if args.shifts > 14 or not 0 < args.cpu_target <= MAX_CPU:
        raise SystemExit(f"--shifts <= 14 and 0 < --cpu-target <= {MAX_CPU}")
    command = " ".join(["python bench/scale.py", *(argv if argv is not None else sys.argv[1:])])
    if args.plan_only:
        result = {**plan_only(args), "command": command, "date": time.strftime("%Y-%m-%d"), "machine": machine()}
        print(json.dumps(result) if args.json else json.dumps(result, indent=1))
        return result

    t_begin = time.time()
    workdir = Path(tempfile.mkdtemp(prefix="cnsscale-"))
    counts = list(dict.fromkeys([*(args.sweep or []), args.gpus]))
    cluster = None
    if args.cluster == "ray":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the cluster is stopped on the way out
    try:
        shared = {**prepare(args, workdir), "writers": args.writers}
        if args.cluster == "ray":
            gpus = max(counts)
            cluster = SimCluster(args.nodes, gpus, cpus_per_node=math.ceil(gpus / args.nodes) + 6)
        cluster_s = time.time() - t_begin
        calibration = None
        compression = args.compression
        if compression is None:
            compression, calibration = calibrate(args, shared, cluster, workdir, args.calibrate_hold_s)
        if args.calibrate_only:
            print(json.dumps(calibration))
            return calibration
        runs = {n: one_run(args, shared, cluster, n, compression * n / args.gpus, workdir, f"g{n}") for n in counts}
    finally:
        if cluster:
            cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    main_run = runs[args.gpus]
    result = {
        **summary(main_run, args.gpus, compression * 1.0),
        "gpu_model": args.gpu,
        "nodes": args.nodes if cluster else 1,
        "pool_layout": layout_for(shared, args.gpus),
        "classifier_groups": shared["groups"],
        "cpu_model_ms": {k: (round(v * 1e3, 3) if isinstance(v, float) else v) for k, v in shared["cpu"].items()
                         if k != "classifier_preprocess"}
                        | {"classifier_preprocess_sum": round(sum(shared["cpu"]["classifier_preprocess"]) * 1e3, 3)},
        "startup_modelled_s": {k: round(v, 1) for k, v in shared["startup_s"].items()},
        "calibration": calibration,
        "cluster_start_s": round(cluster_s, 1),
        "total_s": round(time.time() - t_begin, 1),
        "load": round(os.getloadavg()[0], 1),
        "command": command,
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
    }
    if args.sweep:
        result["sweep"] = {str(n): summary(r, n, compression * n / args.gpus) for n, r in runs.items()}
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return result


def calibrate(args, shared: dict, cluster, workdir: Path, hold_s: float = 12.0) -> tuple[float, dict]:
    """The compression that keeps the simulation's CPU at ``--cpu-target`` of this machine.

    The simulation's CPU is a base (the cluster's processes and the chain's actors, idle) plus
    a cost per image times the image rate, which the compression sets.  A calibration build
    of ``--calibrate-units`` units measures both: its actors idle ``hold_s`` once all have
    started (the base), then it runs without start-up; the cost per image is read between 20 %
    and all of its units generated."""
    c0 = 8.0
    small = argparse.Namespace(**{**vars(args), "seeds": min(args.seeds, args.calibrate_units)})
    classes = max(1, math.ceil(args.calibrate_units / small.seeds))
    run = one_run(small, shared, cluster, args.gpus, c0, workdir, "calibrate", classes=classes, calibrating=hold_s)
    if "steady" not in run:
        raise RuntimeError("the calibration build never marked its steady part; give --compression")
    base, after = run["idle"]["cpu_utilisation"], run["steady"]
    per_image = max(1e-5, (after["cpu_seconds"] - base * after["cores"] * after["wall_s"]) / max(1, run["steady_images"]))
    pools = layout_for(shared, args.gpus)
    rate = pools["generate"]["actors"] / sum(shared["seconds"]["generate"])  # images/s at real speed
    compression = round(max(1.0, (args.cpu_target - base) * after["cores"] / (per_image * rate)), 1)
    found = {"compression": c0, "images": run["images"], "idle_cpu_utilisation": round(base, 3),
             "cpu_utilisation": round(after["cpu_utilisation"], 3), "cpu_s_per_image": round(per_image, 5),
             "images_per_s_real_speed": round(rate, 2), "target": args.cpu_target, "chosen": compression,
             "cpu_s_by_process": run["cpu_s_by_process"], "cpu_s_per_1000_images": run["cpu_s_per_1000_images"]}
    print(f"[scale] calibration: {json.dumps(found)}", file=sys.stderr, flush=True)
    return compression, found


def summary(run: dict, n_gpus: int, compression: float) -> dict:
    return {
        "images": run["images"],
        "gpus": n_gpus,
        "compression": compression,
        "efficiency": round(run["efficiency"], 4),
        "efficiency_without_startup": round(run["efficiency_without_startup"], 4),
        "efficiency_from_driver_start": round(run["efficiency_from_driver_start"], 4),
        "efficiency_bound": round(run["efficiency_bound"], 4),
        "cpu_utilisation": round(run["cpu"]["cpu_utilisation"], 3),
        "cpu_utilisation_machine": round(run["cpu"]["cpu_utilisation_machine"], 3),
        "cpu_s_per_1000_images": {k: round(v, 3) for k, v in run["cpu_s_per_1000_images"].items()},
        "driver_peak_rss_mb": round(run["driver_peak_rss_mb"], 1),
        "busy": run["busy"],
        "wall_s": round(run["wall_s"], 1),
        "startup_s": round(run["startup_s"], 2),
        "actors_started_after_s": round(run["actors_started_after_s"], 1),
        "shards": run["shards"],
        "failed": run["failed"],
        "cpu_s_by_process": run["cpu_s_by_process"],
    }


if __name__ == "__main__":
    main()
