"""The memory an actor may use on its device, and what ``memory_budget_gb: auto`` resolves to.

A GPU's memory is sold in GB (10^9 bytes: ``data/gpus.json`` keeps the vendor's figure,
``memory_gb``); the projections are in bytes and printed in GiB (2^30).  Of a GPU's memory
an actor cannot use:

* the caching allocator's reserve, :data:`ALLOCATOR_RESERVE` of the card and at least
  :data:`MIN_RESERVE_BYTES`: blocks the allocator keeps cached between models, and
  fragmentation.  On an H100 the device's own figure ran 1.7 and 3.8 GB above the projected
  weights and activations of two classifier groups (BENCHMARKS.md, "Classifier groups on a
  GPU"; the README's "leave 3-4 GB" of a 24 GB card);
* its own CUDA context and runtime, counted in every actor's projection
  (:data:`pipeline.perf.memory.RUNTIME_BYTES`, 1 GiB per actor process).

An actor of ``num_gpus`` g < 1 shares its GPU with others (Ray packs fractions), so it may
use g of the usable memory; an actor of one GPU or more, all of it.

``resources.classify.memory_budget_gb: auto`` packs the classifier groups to the classify
actor's share of the device the build runs on, found at run time (:func:`detect`): the GPU
this process sees (``nvidia-smi``), else the GPU kind a connected Ray cluster reports
(``accelerator_type:*``, looked up in ``data/gpus.json``), else ``resources.device_memory_gb``;
without a GPU, a quarter of this host's memory (four stages' actors share it).
``cnsbench estimate`` resolves it against the ``--gpu`` it is given.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import BuildConfig

GIB = 1024**3
VENDOR_GB = 10**9
ALLOCATOR_RESERVE = 0.10
MIN_RESERVE_BYTES = 3 * GIB
HOST_SHARE = 0.25  # of a host without a GPU, for one stage's actor
# Ray's accelerator types (ray.util.accelerators) as data/gpus.json's kinds; an A100 of
# unknown memory is taken for the 40 GB one (the smaller budget is the safe one).
RAY_ACCELERATORS = {
    "H100": "h100", "H200": "h200", "B200": "b200", "A100": "a100-40gb", "A100-40G": "a100-40gb",
    "A100-80G": "a100", "L40S": "l40s", "A10G": "a10", "L4": "l4",
}


@dataclass(frozen=True)
class Device:
    """The memory of one device an actor runs on."""

    kind: str  # "gpu" or "cpu"
    total_bytes: int
    source: str  # where the figure came from

    @property
    def usable_bytes(self) -> int:
        """What the actors on it may project to: a GPU less the allocator's reserve; a host's share."""
        if self.kind == "gpu":
            return self.total_bytes - self.reserve_bytes
        return int(self.total_bytes * HOST_SHARE)

    @property
    def reserve_bytes(self) -> int:
        """The allocator's reserve of a GPU (0 on a host)."""
        return max(int(self.total_bytes * ALLOCATOR_RESERVE), MIN_RESERVE_BYTES) if self.kind == "gpu" else 0

    def allowance(self, num_gpus: float) -> int:
        """Bytes one actor of ``num_gpus`` may project to (its share of a GPU; on a host, the host's share)."""
        if self.kind != "gpu":
            return self.usable_bytes
        return int(min(1.0, num_gpus) * self.usable_bytes)

    def describe(self) -> str:
        if self.kind == "gpu":
            return (f"{self.usable_bytes / GIB:.1f} GiB usable of {self.total_bytes / GIB:.1f} GiB ({self.source}), "
                    f"less the allocator's reserve of {self.reserve_bytes / GIB:.1f} GiB")
        return f"{self.total_bytes / GIB:.1f} GiB host memory ({self.source}), {HOST_SHARE:.0%} per stage actor"


def gpu_device(spec: dict) -> Device:
    """A GPU of ``data/gpus.json`` (its vendor GB as bytes)."""
    return Device("gpu", int(spec["memory_gb"] * VENDOR_GB), f"{spec['name']}, {spec['memory_gb']:g} GB")


def _nvidia_smi_bytes() -> int | None:
    """Memory of the first GPU this process sees, without creating a CUDA context."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None and not visible:
        return None  # CUDA_VISIBLE_DEVICES="" hides every GPU
    cmd = [exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
    if visible:
        cmd.insert(1, f"--id={visible}")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout
        return int(float(out.split()[0]) * 1024**2)  # MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _ray_gpu_kind() -> str | None:
    """The GPU kind (``data/gpus.json``) a connected Ray cluster reports, the smallest if several."""
    try:
        import ray

        if not ray.is_initialized():
            return None
        types = [k.split(":", 1)[1] for k in ray.cluster_resources() if k.startswith("accelerator_type:")]
    except Exception:  # noqa: BLE001 - no Ray, no answer
        return None
    from pipeline.perf.data import gpu_table

    table = gpu_table()
    kinds = [RAY_ACCELERATORS[t] for t in types if t in RAY_ACCELERATORS]
    return min(kinds, key=lambda k: table[k]["memory_gb"]) if kinds else None


@functools.lru_cache(maxsize=None)
def detect(device_memory_gb: float | None = None) -> Device:
    """The device this build's actors run on (see the module doc); the same answer all run long."""
    found = _nvidia_smi_bytes()
    if found:
        return Device("gpu", found, "the GPU this process sees (nvidia-smi)")
    kind = _ray_gpu_kind()
    if kind:
        from pipeline.perf.data import gpu_spec

        return gpu_device(gpu_spec(kind))
    if device_memory_gb:
        return Device("gpu", int(device_memory_gb * GIB), "resources.device_memory_gb")
    return host_device("no GPU here")


def host_device(why: str = "this host") -> Device:
    """This host's memory, for actors that run on its CPU."""
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        host = 16 * GIB
    return Device("cpu", host, why)


def run_device(cfg: "BuildConfig") -> Device:
    """:func:`detect` with the config's ``resources.device_memory_gb`` as the last GPU answer."""
    return detect(getattr(cfg.resources, "device_memory_gb", None))


def classify_budget(cfg: "BuildConfig", device: Device | None = None) -> tuple[int, str] | None:
    """Bytes one classify actor's group may project to, and whence; None: no budget (one group).

    A number is ``memory_budget_gb`` GiB; ``auto`` is the classify actor's share of ``device``
    (default: the device found at run time, :func:`run_device`), or of this host's memory
    when the actor asks for no GPU (``num_gpus: 0``)."""
    res = cfg.resources.classify
    budget = res.memory_budget_gb
    if budget is None:
        return None
    if budget != "auto":
        return int(float(budget) * GIB), "resources.classify.memory_budget_gb"
    if res.num_gpus <= 0:
        device = host_device("resources.classify.num_gpus 0: the actors run on a CPU")
    device = device or run_device(cfg)
    share = f"{min(1.0, res.num_gpus):g} of " if device.kind == "gpu" else ""
    return device.allowance(res.num_gpus), f"memory_budget_gb auto: {share}{device.describe()}"

