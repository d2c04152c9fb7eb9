"""What a build costs on N GPUs of a kind: whether each actor fits, GPU time, start-up, wall time, money.

First every stage actor's projected memory is checked against its share of the GPU's usable
memory (:mod:`pipeline.perf.device`): the generate actor, the filter's, each classifier
group's (vlms with their own dtype and generation cache, :mod:`pipeline.perf.memory`); an
actor that does not fit is reported with the setting that would make it fit
(:class:`DoesNotFit`), before any time is estimated.  Then:

* GPU time per stage from the latency model (:mod:`pipeline.perf.latency`: FLOPs over the
  GPU's peak times the measured utilisation; the UNet evaluations the build makes,
  :mod:`pipeline.perf.evals`);
* start-up: each actor's process, imports and model loading as the rehearsal measured them
  (:mod:`pipeline.perf.startup`), summed along the first unit's path (each stage loads its
  models at its first batch);
* the GPU pools' actor ranges under a budget of N GPUs (:func:`pipeline.perf.budget.split`,
  the split the build makes);
* wall time = the ramp (a GPU node's start-up; every node at once, the budget requested up
  front) + start-up + the slowest pool's GPU time at its largest / the pipeline's efficiency
  without start-up, as measured on a simulated cluster (:mod:`pipeline.perf.efficiency`);
  cost = (wall time + the idle tail until the autoscaler releases the nodes) x GPUs x the
  price of a GPU-hour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from pipeline.errors import CnsbenchError
from pipeline.perf import data, efficiency, latency, startup
from pipeline.perf.device import ALLOCATOR_RESERVE, MIN_RESERVE_BYTES, Device, gpu_device
from pipeline.perf.evals import unit_evals
from pipeline.perf.report import significant

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import BuildConfig, FamilyGroup
    from pipeline.perf.budget import PoolRange
    from pipeline.perf.evals import UnetCost

GIB = 1024**3
MAX_GPUS = 100_000
BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
MEASURED_RESOLUTION = 768  # the generate actor's activation figures of data/gpus.json (SD2, bf16, an H100)
STORED_BYTES = 4  # weights as the hub's float32 files hold them (what start-up reads)
# A cloud GPU node's start-up, request to Ray joined.  Not measured by this project (no cloud
# here): the fake autoscaling cluster of bench/autoscale.py starts a node in seconds.
NODE_START_S = 300.0
NODE_START_SOURCE = ("an assumption, not a measurement: a GPU VM's boot and the pull of the project's image "
                     "(docker/) take minutes; replace it with a measured figure (BENCHMARKS.md, "
                     "\"Autoscaling\")")
IDLE_TIMEOUT_MIN = 10.0  # idle_timeout_minutes of deploy/{aws,gcp}/cluster.yaml


@dataclass
class Actor:
    """One stage actor on the GPU: its projected memory against what its share may use."""

    name: str
    stage: str
    projected: int | None  # bytes; None: not projectable here
    allowed: int | None  # bytes of its GPU share; None: it asks for no GPU (runs on a CPU)
    num_gpus: float
    detail: str
    remedy: str = ""
    startup_s: float = 0.0
    members: list[int] = field(default_factory=list)  # a classify group's classifiers

    @property
    def fits(self) -> bool:
        return self.projected is None or self.allowed is None or self.projected <= self.allowed


def _allowance(device: Device, num_gpus: float) -> int | None:
    return device.allowance(num_gpus) if num_gpus > 0 else None


class DoesNotFit(CnsbenchError):
    """Actors whose projected memory exceeds their share of the GPU."""

    def __init__(self, gpu: dict, device: Device, actors: list[Actor]) -> None:
        self.actors = actors
        lines = [f"{len(actors)} stage actor(s) do not fit an {gpu['name']}: {device.describe()}"]
        for a in actors:
            share = "the whole GPU" if a.num_gpus >= 1 else f"its share of the GPU (num_gpus {a.num_gpus:g})"
            lines.append(f"  {a.name}: projected {a.projected / GIB:.1f} GiB, more than the {a.allowed / GIB:.1f} GiB "
                         f"of {share} ({a.detail}); {a.remedy}")
        super().__init__("\n".join(lines))


# --------------------------------------------------------------------------- memory
def _with_resource(cfg: "BuildConfig", stage: str, **update) -> "BuildConfig":
    res = cfg.resources.model_copy(update={stage: getattr(cfg.resources, stage).model_copy(update=update)})
    return cfg.model_copy(update={"resources": res})


def _largest(fits: Callable[[int], bool], below: int) -> int:
    """The largest n in 1..below-1 with ``fits(n)`` (``fits`` monotone); 0 if none."""
    lo, hi = 0, below - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def unet_costs(cfg: "BuildConfig") -> list[tuple["FamilyGroup", "UnetCost | None"]]:
    """Each family group of ``cfg`` with what one unit of it costs the UNet, as its family
    states it (``Family.unet_cost``, looked up in the registry; None: it runs no UNet)."""
    from pipeline.registry import FAMILIES

    return [(g, FAMILIES.get(g.kind).unet_cost(cfg, g)) for g in cfg.family_groups()]


def base_cost(cfg: "BuildConfig") -> "UnetCost | None":
    """What the build's image source costs the UNet per unit (``ImageSource.unet_cost``): it is
    asked for each unit's base image when no family of the build makes its own scale 0."""
    from pipeline.registry import FAMILIES, SOURCES

    if any(FAMILIES.get(g.kind).generates_base for g in cfg.family_groups()):
        return None
    return SOURCES.get(cfg.source.kind).unet_cost(cfg)


def generates(cfg: "BuildConfig") -> bool:
    """Whether a family of ``cfg`` or its image source runs the UNet (the generate actor then holds the
    diffusion model)."""
    return any(cost is not None for _, cost in unet_costs(cfg)) or base_cost(cfg) is not None


def generate_bytes(cfg: "BuildConfig", branch_batch_size: int | None = None) -> tuple[int, str]:
    """The generate actor on a GPU: the pipeline's weights at its dtype, the larger of one
    branch batch's UNet forward (with CFG) and its VAE decode, and the actor's runtime.

    A generator in the FLOP table (SD2) takes the peaks measured in bf16 at 768 px on an H100
    (``data/gpus.json``), scaled by the pixels and the dtype; another is projected on the meta
    device from its diffusers configs (:func:`pipeline.perf.memory.project_stage_memory`)."""
    from pipeline.perf.memory import RUNTIME_BYTES, project_stage_memory

    gen = cfg.generator
    batch_size = branch_batch_size or gen.branch_batch_size
    e = unit_evals(cfg, max(len(g.shifts) for g in cfg.family_groups()))
    batch = min(batch_size, e["branches"])
    if latency.generator_source(gen.model, gen.resolution) == "counted":
        other = cfg.model_copy(update={"generator": gen.model_copy(update={"branch_batch_size": batch_size})})
        projected = project_stage_memory(other, "cuda", ("generate",))["generate"]
        if projected is not None:
            return projected, (f"projected on the meta device from its configs: weights in {gen.dtype}, a UNet forward "
                               f"and a VAE decode of {batch} branches at {gen.resolution} px, runtime "
                               f"{RUNTIME_BYTES / GIB:g} GiB")
    flops = latency.generator_flops(gen.model, gen.resolution)
    util = data.utilisation()
    params = (flops["unet_params_m"] + flops["text_encoder_params_m"] + flops["vae_params_m"]) * 1e6
    nbytes = BYTES.get(gen.dtype, 2)
    scale = (gen.resolution / MEASURED_RESOLUTION) ** 2 * nbytes / 2
    samples = (2 if gen.guidance_scale > 1.0 else 1) * batch
    unet = util["unet_activation_gib_per_sample"] * samples * scale * GIB
    decode = util["vae_decode_activation_gib_per_image"] * batch * scale * GIB
    total = int(params * nbytes + max(unet, decode)) + RUNTIME_BYTES
    return total, (f"weights {params * nbytes / GIB:.1f} GiB in {gen.dtype}, the larger of a UNet forward of {samples} "
                   f"samples ({unet / GIB:.1f}) and a VAE decode of {batch} images ({decode / GIB:.1f}) at "
                   f"{gen.resolution} px, runtime {RUNTIME_BYTES / GIB:g} GiB")


def _generate_actor(cfg: "BuildConfig", device: Device) -> Actor:
    share = cfg.resources.generate.num_gpus
    allowed = _allowance(device, share)
    projected, detail = generate_bytes(cfg)
    remedy = ""
    if allowed is not None and projected > allowed:
        fits = _largest(lambda b: generate_bytes(cfg, b)[0] <= allowed, cfg.generator.branch_batch_size)
        remedy = (f"set generator.branch_batch_size={fits} (projected {generate_bytes(cfg, fits)[0] / GIB:.1f} GiB; "
                  f"now {cfg.generator.branch_batch_size})" if fits else
                  f"no generator.branch_batch_size fits (1 projects {generate_bytes(cfg, 1)[0] / GIB:.1f} GiB): "
                  "choose a GPU with more memory")
    gflop = latency.generator_flops(cfg.generator.model, cfg.generator.resolution)
    params = (gflop["unet_params_m"] + gflop["text_encoder_params_m"] + gflop["vae_params_m"]) * 1e6
    return Actor("generate", "generate", projected, allowed, share, detail, remedy,
                 startup.actor_seconds("generate", int(params * STORED_BYTES)))


def _filter_actor(cfg: "BuildConfig", device: Device) -> Actor | None:
    from pipeline.perf.memory import project_stage_memory

    flt = cfg.filter
    if not flt.enabled or flt.kind == "none":
        return None
    res = cfg.resources.filter
    allowed = _allowance(device, res.num_gpus)
    projected = project_stage_memory(cfg, "cuda", ("filter",))["filter"]
    remedy = ""
    if projected is not None and allowed is not None and projected > allowed and isinstance(res.batch_size, int):
        def fits(b: int) -> bool:
            other = _with_resource(cfg, "filter", batch_size=b)
            return (project_stage_memory(other, "cuda", ("filter",))["filter"] or 0) <= allowed

        best = _largest(fits, res.batch_size)
        shares = [s for s in (0.5, 1.0) if s > res.num_gpus and (projected <= device.allowance(s))]
        options = ([f"resources.filter.batch_size={best} (now {res.batch_size})"] if best else []) + \
                  [f"resources.filter.num_gpus={shares[0]:g} (now {res.num_gpus:g})"] * bool(shares)
        remedy = "set " + " or ".join(options) if options else "choose a GPU with more memory"
    clip, dino = latency.stage_models(cfg, "filter")[0][1], latency.stage_models(cfg, "filter")[1][1]
    params = sum((data.load_data("model_flops.json")["models"].get(m) or {}).get("params_m", 0) for m in (clip, dino))
    return Actor("filter", "filter", projected, allowed, res.num_gpus,
                 f"CLIP {clip} and DINOv2 {dino}, {res.batch_size} rows per batch, {res.precision}", remedy,
                 startup.actor_seconds("filter", int(params * 1e6 * STORED_BYTES)))


def _classify_actors(cfg: "BuildConfig", device: Device) -> list[Actor]:
    from pipeline.config.vqa import asks
    from pipeline.perf.memory import classifier_footprints, classifier_groups, group_bytes

    res = cfg.resources.classify
    allowed = _allowance(device, res.num_gpus)
    groups = classifier_groups(cfg, device)
    feet = classifier_footprints(cfg)
    budget = res.memory_budget_gb
    actors = []
    for k, group in enumerate(groups, 1):
        members = [feet[i] for i in group]
        projected = group_bytes(members)
        specs = [cfg.classifiers[i] for i in group]
        kind = "vlm " if all(asks(s.kind) for s in specs) else ""
        names = ", ".join(s.name for s in specs[:3]) + (f" and {len(specs) - 3} more" if len(specs) > 3 else "")
        remedy = ""
        if allowed is not None and projected > allowed:
            alone = max(members, key=lambda f: group_bytes([f]))
            if len(group) > 1 and group_bytes([alone]) <= allowed:
                remedy = ("set resources.classify.memory_budget_gb: auto (groups of at most "
                          f"{allowed / GIB:.1f} GiB on this GPU; now {budget if budget is not None else 'unset'})")
            else:
                shares = [s for s in (0.5, 1.0) if s > res.num_gpus and group_bytes([alone]) <= device.allowance(s)]
                remedy = (f"{alone.name} alone projects {group_bytes([alone]) / GIB:.1f} GiB: set "
                          + (f"resources.classify.num_gpus={shares[0]:g} (now {res.num_gpus:g}) or " if shares else "")
                          + f"a smaller resources.classify.batch_size (now {res.batch_size})")
        heads = sum(1 for s in specs if s.kind == "open_clip_zeroshot")
        stored = sum(f.params for f in members) * STORED_BYTES
        actors.append(Actor(
            f"classify {kind}group {k} of {len(groups)}" if len(groups) > 1 else "classify", "classify",
            projected, allowed, res.num_gpus,
            f"{len(specs)} {kind}classifiers ({names}), "
            f"{', '.join(sorted({s.dtype or 'float32' for s in specs})) if kind else res.precision}", remedy,
            startup.actor_seconds("classify", stored, heads), list(group)))
    return actors


def actors(cfg: "BuildConfig", spec: dict) -> tuple[Device, list[Actor]]:
    """Every stage actor of ``cfg`` on a GPU ``spec``, in chain order (the writer runs on a CPU)."""
    device = gpu_device(spec)
    out = [_generate_actor(cfg, device)] if generates(cfg) else []
    flt = _filter_actor(cfg, device)
    out += [flt] if flt else []
    out += _classify_actors(cfg, device)
    return device, out


def check_memory(cfg: "BuildConfig", spec: dict) -> tuple[Device, list[Actor]]:
    """:func:`actors`, raising :class:`DoesNotFit` when any does not fit its share of the GPU."""
    device, found = actors(cfg, spec)
    bad = [a for a in found if not a.fits]
    if bad:
        raise DoesNotFit(spec, device, bad)
    return device, found


# --------------------------------------------------------------------------- time
@dataclass
class StageTime:
    name: str
    gpu_seconds: float
    detail: str


@dataclass
class Estimate:
    config: str
    gpu: dict
    device: Device
    n_gpus: int
    images: int
    units: int
    unet_evals: int
    unet_evals_unshared: int
    actors: list[Actor]
    stages: list[StageTime]
    startup_s: float
    efficiency: float
    price_per_hour: float | None = None
    assumptions: list[tuple[str, str]] = field(default_factory=list)  # (what, its source)
    # Each GPU pool's actor range under the budget of n_gpus (pipeline/perf/budget.py), with its GPU time.
    pools: list[tuple["PoolRange", float]] = field(default_factory=list)
    ramp_s: float = 0.0  # until the GPU nodes are up (all at once: the build requests its budget up front)
    idle_tail_s: float = 0.0  # the nodes idle after the build until the autoscaler releases them

    @property
    def gpu_seconds(self) -> float:
        return sum(s.gpu_seconds for s in self.stages)

    @property
    def work_seconds(self) -> float:
        """The GPU work's wall time: the slowest pool at its largest size (every pool runs at once)."""
        if self.pools:
            slowest = max(seconds / max(1e-9, r.max_size * min(1.0, r.num_gpus)) for r, seconds in self.pools)
            return slowest / self.efficiency
        return self.gpu_seconds / (self.n_gpus * self.efficiency)

    @property
    def wall_seconds(self) -> float:
        return self.ramp_s + self.startup_s + self.work_seconds

    @property
    def cost(self) -> float | None:
        """The GPUs paid for: from the request to the nodes' release (the wall time and the idle tail)."""
        if self.price_per_hour is None:
            return None
        return (self.wall_seconds + self.idle_tail_s) / 3600 * self.n_gpus * self.price_per_hour

    def lines(self) -> list[str]:
        from pipeline.perf.report import duration, table

        g = self.gpu
        out = [f"estimate of {self.config} on {self.n_gpus} x {g['name']}", ""]
        out += table([
            ("plan", f"{self.images:,} images in {self.units:,} generation units (class, seed)"),
            ("UNet evaluations", f"{self.unet_evals:,} ({self.unet_evals / max(1, self.images):.1f} per image; "
                                 f"{self.unet_evals_unshared:,} without sharing the pre-window steps and scale 0)"),
        ])
        d = self.device
        out += ["", f"memory per actor, GiB (one GPU: {d.total_bytes / GIB:.1f}, {d.usable_bytes / GIB:.1f} usable "
                    f"after the allocator's reserve of {d.reserve_bytes / GIB:.1f})"]
        out += table([("actor", "projected", "may use", "GPU share", "start-up", "")]
                     + [(a.name, f"{a.projected / GIB:.1f}" if a.projected is not None else "unknown",
                         f"{a.allowed / GIB:.1f}" if a.allowed is not None else "(CPU)",
                         f"{min(1.0, a.num_gpus):g}", duration(a.startup_s), a.detail)
                        for a in self.actors], numeric=(1, 2, 3, 4))
        if self.pools:
            out += ["", f"GPU pools under a budget of {self.n_gpus} GPUs (split by GPU time, pipeline/perf/budget.py; "
                        "what `cnsbench build --max-gpus N` starts)"]
            out += table([("actors", "GPU each", "work at the largest", "pool")]
                         + [(f"{r.min_size}-{r.max_size}", f"{r.num_gpus:g}",
                             duration(t / max(1e-9, r.max_size * min(1.0, r.num_gpus))), r.name)
                            for r, t in self.pools], numeric=(1, 2))
        rows = [("time", "", "")] + [(s.name, duration(s.gpu_seconds), s.detail) for s in self.stages]
        work = (f"the slowest pool at its largest / efficiency {self.efficiency:.3f}" if self.pools
                else f"GPU time / ({self.n_gpus} x efficiency {self.efficiency:.3f})")
        rows += [
            ("GPU time", duration(self.gpu_seconds), f"on one {g['key']}"),
            ("ramp", duration(self.ramp_s), "until the GPU nodes are up: one node's start-up, the budget being "
             "requested up front"),
            ("start-up", duration(self.startup_s), "the first unit's path: each stage loads its models at its first batch"),
            ("work", duration(self.work_seconds), work),
            (f"wall time on {self.n_gpus} GPU{'s' if self.n_gpus != 1 else ''}", duration(self.wall_seconds),
             "ramp + start-up + work"),
            ("idle tail", duration(self.idle_tail_s), "the nodes idle after the build until the autoscaler "
             "releases them (idle_timeout_minutes)"),
        ]
        if self.cost is not None:
            rows.append(("cost", f"{self.cost:,.2f}", f"at {self.price_per_hour:g} per GPU-hour, {self.n_gpus} GPUs "
                         "for the wall time and the idle tail"))
        out += [""] + table(rows, numeric=(1,))
        out += ["", "assumptions:"]
        out += [f"  - {what} (source: {source})" for what, source in self.assumptions]
        return out


def stage_precisions(cfg: "BuildConfig") -> str:
    """What the classify and filter stages' times assume: the utilisation each is projected at,
    and where the config's precision has no measured figure, that float32's stands in."""
    parts, standing_in = [], []
    for stage, name in (("classify", "classifiers"), ("filter", "filter")):
        util, measured_at = latency.stage_utilisation(cfg, stage)
        precision = getattr(cfg.resources, stage).precision
        parts.append(f"{name} {util:.3f} of the peak ({measured_at})")
        if measured_at != precision:
            standing_in.append(f"{stage} runs {precision}")
    text = " and ".join(parts)
    if standing_in:
        text += (f"; {', '.join(standing_in)} in this config, with no utilisation measured for it "
                 "(pipeline/data/gpus.json), so float32's is used (likely conservative)")
    return text


def _assumptions(cfg: "BuildConfig", spec: dict, eff: float, eff_source: str) -> list[tuple[str, str]]:
    from pipeline.perf.memory import RUNTIME_BYTES

    util = data.utilisation()
    gen = cfg.generator
    out = [
        (f"peak dense BF16 throughput {spec['bf16_tflops']:g} TFLOP/s, memory {spec['memory_gb']:g} GB "
         f"({spec['memory_gb'] * 1e9 / GIB:.1f} GiB)", spec["source"]),
        (f"utilisation of that peak, the same on every GPU: UNet {latency.unet_utilisation(1):.3f} at 1 image per "
         f"forward to {latency.unet_utilisation(gen.branch_batch_size):.3f} at {gen.branch_batch_size}, VAE decode "
         f"{util['vae_decode']:.3f}", util["source"]),
        (f"the window's forwards with the rows' sliders {util.get('slider_window_factor', 1.0):g}x the bare UNet",
         util.get("slider_window_source", "pipeline/data/gpus.json")),
        (stage_precisions(cfg), util.get("float32_source", "pipeline/data/gpus.json")),
        ("model FLOPs per image; UNet and VAE FLOPs scale with the latent pixels",
         "pipeline/data/model_flops.json (python -m pipeline.perf.flops; models not in it counted on the meta device)"),
        (f"an actor may use its GPU share of the memory less the allocator's reserve ({ALLOCATOR_RESERVE:.0%}, at "
         f"least {MIN_RESERVE_BYTES / GIB:g} GiB); each "
         f"actor's projection includes {RUNTIME_BYTES / GIB:g} GiB for its CUDA context and runtime",
         "pipeline/perf/device.py; BENCHMARKS.md, \"Classifier groups on a GPU\""),
        ("generate actor's activations: 0.143 GiB per UNet sample and 1.34 GiB per decoded 768 px image (bf16), "
         "scaled by pixels and dtype", "pipeline/data/gpus.json (bench/latency.py on an H100)"),
        ("filter and classifier memory: weights and one forward's peak activations, shapes from meta-device builds",
         "pipeline/perf/memory.py; measured at 0.80-1.21 of it on a CPU: docs/rehearsal.md, \"Measured\""),
        ("start-up: process, imports and model loading per actor, weights read as float32 files",
         startup.source()),
        (f"wall time = ramp + start-up + the slowest GPU pool's time at its largest / the pipeline's efficiency "
         f"without start-up ({eff:.3f})", eff_source),
    ]
    source = latency.generator_source(gen.model, gen.resolution)
    if source != "table":
        out.append((f"generator {gen.model!r} not in the FLOP table: " + (
            "its FLOPs and memory counted on the meta device from its configs" if source == "counted"
            else "counted as Stable Diffusion 2 (its configs are not here)"), "pipeline/perf/flops.py"))
    cpu = [stage for stage in ("generate", "filter", "classify") if getattr(cfg.resources, stage).num_gpus <= 0]
    if cpu:
        out.append((f"resources.{{{', '.join(cpu)}}}.num_gpus is 0: those actors run on a CPU; their memory is not "
                    "checked against the GPU and their time is the GPU's", "the config"))
    return out


def _stage_times(cfg: "BuildConfig", spec: dict, assumptions: list[tuple[str, str]] | None = None
                 ) -> tuple[tuple[int, int, int], list[StageTime]]:
    """((units, UNet evaluations, without sharing), [generate, filter, classify]'s GPU time on one ``spec``)."""
    from pipeline import plan

    assumptions = assumptions if assumptions is not None else []
    summary = plan.summarize(cfg)
    units, evals, unshared, decodes, gen_s = 0, 0, 0, 0, 0.0
    source = cfg.source.kind
    priced = [(f"family {g.kind} ({len(g.shifts)} shifts)", f"the family's unet_cost (registry: {g.kind})",
               len(g.shifts), list(g.scales), cost) for g, cost in unet_costs(cfg)]
    base = base_cost(cfg)
    if base is not None:
        priced.append((f"source {source}'s base images (one per unit)", f"the source's unet_cost (registry: {source})",
                       0, [0.0], base))
    for what, where, n_shifts, scales, cost in priced:
        if cost is None or cost.evals is None:
            how = "runs no UNet" if cost is None else f"runs the UNet, not counted: {cost.unknown}"
            assumptions.append((f"{what} {how}; no GPU time counted", where))
            continue
        if cost.note:
            assumptions.append((f"{what}: {cost.note}", where))
        n = summary.n_classes * summary.n_seeds
        units = max(units, n)
        seconds, e = latency.unit_seconds(cfg, spec, n_shifts, scales, cost.evals, cost.hooked)
        gen_s += n * seconds
        evals += n * e["evals"]
        unshared += n * e["evals_unshared"]
        decodes += n * e["branches"]
    images = summary.n_images
    stages = [StageTime("generate", gen_s, f"{evals:,} UNet evaluations, {decodes:,} VAE decodes")]
    for stage in ("filter", "classify"):
        per_image, gflop, missing = latency.image_seconds(cfg, spec, stage)
        if missing:
            assumptions.append((f"{stage} models without a FLOP count, counted as 0: {', '.join(missing)}",
                                "pipeline/perf/latency.py"))
        n = len(latency.stage_models(cfg, stage))
        stages.append(StageTime(stage, images * per_image, f"{n} models, {significant(gflop)} GFLOP per image"))
    return (units, evals, unshared), stages


def unet_evaluations(cfg: "BuildConfig") -> int:
    """The UNet sample-evaluations a build of ``cfg`` makes, as its families and image source count
    them (the sum of the build's ``ShiftImages.unet_evals`` and of the base images' ``BaseImage.unet_evals``,
    i.e. its manifests' ``stats.unet_evals``)."""
    return _stage_times(cfg, data.gpu_spec(REFERENCE_GPU))[0][1]


def stage_times(cfg: "BuildConfig", spec: dict) -> list[StageTime]:
    """The GPU time of each GPU stage of a build of ``cfg`` on one GPU ``spec`` (generate, filter, classify)."""
    return _stage_times(cfg, spec)[1]


# --------------------------------------------------------------------------- the GPU budget's split
REFERENCE_GPU = "h100"  # the budget's shares are ratios of GPU times: any kind gives nearly the same


def pool_seconds(cfg: "BuildConfig", pools: Sequence[tuple[str, str, list[int] | None]], gpu: str = REFERENCE_GPU
                 ) -> list[float]:
    """Projected GPU time on one ``gpu`` of each pool ``(name, stage, classifier members)`` of
    ``cfg`` (:mod:`pipeline.perf.estimate`'s stage times; a classify group's share of the
    classify time is its classifiers' own)."""
    from pipeline import plan

    spec = data.gpu_spec(gpu)
    times = {s.name: s.gpu_seconds for s in stage_times(cfg, spec)}
    images = plan.summarize(cfg).n_images
    out = []
    for _, stage, members in pools:
        if stage == "classify" and members is not None:
            group = cfg.model_copy(update={"classifiers": [cfg.classifiers[i] for i in members]})
            out.append(images * latency.image_seconds(group, spec, "classify")[0])
        else:
            out.append(times.get(stage, 0.0))
    return out


def config_split_timed(cfg: "BuildConfig", budget: float, gpu: str = REFERENCE_GPU
                       ) -> list[tuple[PoolRange, float]]:
    """:func:`split` of ``budget`` GPUs among the GPU pools of a build of ``cfg``, each range
    with its pool's projected GPU time on one ``gpu``."""
    from pipeline.perf.budget import GpuPool, config_pools, split, work_units

    pools = config_pools(cfg)
    seconds = pool_seconds(cfg, [(name, stage, members) for name, stage, _, _, members in pools], gpu)
    units = work_units(cfg)
    ranges = split(budget, [GpuPool(name, gpus, size, s, units if stage == "generate" else None)
                            for (name, stage, gpus, size, _), s in zip(pools, seconds)])
    return list(zip(ranges, seconds))


def config_split(cfg: "BuildConfig", budget: float, gpu: str = REFERENCE_GPU) -> list[PoolRange]:
    """:func:`split` of ``budget`` GPUs among the GPU pools of a build of ``cfg``."""
    return [r for r, _ in config_split_timed(cfg, budget, gpu)]


def adaptive_note(cfg: "BuildConfig", uniform: int) -> str:
    """What an adaptive build is priced at: its cap, and the images it is expected to make when
    every cell has the largest variance a right/wrong answer can have (p = 1/2): the uniform seeds
    per stratum whose accuracy interval reaches the target, with the correction of the seed range."""
    from statistics import NormalDist

    spec = cfg.sampling
    n_pop, per_shift = len(cfg.benchmark.seeds), len(cfg.benchmark.classes)
    z = NormalDist().inv_cdf(0.5 + spec.level / 2)
    need = next((n for n in range(spec.pilot, n_pop + 1)
                 if z * math.sqrt(0.25 * (1 - n / n_pop) / (n * per_shift)) <= spec.target), n_pop)
    expected = min(spec.max_images, round(uniform * need / n_pop))
    return (f"an adaptive build (sampling): priced at its cap of {spec.max_images:,} images (the uniform design: "
            f"{uniform:,}); expected at most {expected:,} images ({need} seeds per stratum reach the target "
            f"{spec.target:g} at the largest variance; strata that settle take fewer)")


def estimate(cfg: "BuildConfig", gpu: str, n_gpus: int, price_per_hour: float | None = None,
             config: str = "the config") -> Estimate:
    """The cost of building ``cfg`` on ``n_gpus`` GPUs of kind ``gpu``; :class:`DoesNotFit`
    when a stage actor does not fit its share of that GPU (see the module doc)."""
    from pipeline import plan

    if not 1 <= n_gpus <= MAX_GPUS:
        raise CnsbenchError(f"--gpus must be between 1 and {MAX_GPUS:,}, got {n_gpus}")
    if price_per_hour is not None and not (math.isfinite(price_per_hour) and price_per_hour >= 0):
        raise CnsbenchError(f"--price-per-hour must be a finite number >= 0, got {price_per_hour}")
    spec = data.gpu_spec(gpu)
    device, found = check_memory(cfg, spec)
    summary = plan.summarize(cfg)
    eff, eff_source = efficiency.efficiency_at(n_gpus)
    assumptions = _assumptions(cfg, spec, eff, eff_source)
    counts, stages = _stage_times(cfg, spec, assumptions)
    units, evals, unshared = counts
    images = summary.n_images
    if cfg.sampling is not None:  # an adaptive build is priced at its cap (docs/adaptive.md)
        factor = min(1.0, cfg.sampling.max_images / max(1, images))
        stages = [StageTime(st.name, st.gpu_seconds * factor, st.detail) for st in stages]
        units, evals, unshared = (round(v * factor) for v in (units, evals, unshared))
        assumptions.append((adaptive_note(cfg, images), "pipeline/config/sampling.py, docs/adaptive.md"))
        images = round(images * factor)
    writer = ("write", startup.actor_seconds("write", 0))
    start = startup.chain_seconds([(a.stage, a.startup_s) for a in found] + [writer])
    pools = config_split_timed(cfg, n_gpus, gpu)
    assumptions += [
        (f"a cloud GPU node is up {NODE_START_S / 60:g} min after it is requested (instance boot, the image pulled, "
         "Ray started); all of them at once, the build requesting its budget up front", NODE_START_SOURCE),
        (f"idle GPU nodes are released {IDLE_TIMEOUT_MIN:g} min after the build (idle_timeout_minutes), and paid "
         "for until then", "deploy/aws/cluster.yaml, deploy/gcp/cluster.yaml"),
    ]
    return Estimate(config, spec, device, n_gpus, images, units, evals, unshared, found, stages, start, eff,
                    price_per_hour, assumptions, pools, NODE_START_S, IDLE_TIMEOUT_MIN * 60)
