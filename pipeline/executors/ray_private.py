"""Every use of Ray's private or semi-public internals, in one place.

Ray 2.60 has no public API for these things the Ray executor needs:

* blocks of exact row counts from a repartition whose tasks ask for no CPU
  (:func:`exact_blocks`: the logical operator's ``ray_remote_args`` and ``compute``);
* the node types an autoscaler may start, with their resources and counts
  (:func:`node_types`: the cluster config an autoscaler reports to the GCS, which Ray Data
  itself reads for its own autoscaling, else the config the head's monitor process was
  started with: Ray's VM autoscaler reports none);
* each node's free resources (:func:`free_per_node`: Ray's state module);
* asking the autoscaler for a run's whole GPU budget (:func:`budget_request`: through Ray
  Data's coordinator, which would overwrite a request made beside it), as a request of the
  run's own that expires unless its driver renews it;
* the address ``ray start`` left in Ray's bootstrap file (:func:`bootstrap_address`);
* the exception a stage raised in an actor, as it was raised (:func:`raise_stage_errors`,
  :func:`stage_error`).

``tests/test_scale_budget.py`` checks each against the installed Ray, so a Ray upgrade that
changes one fails there, not in the middle of a build.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Iterator


class RayInternalsChanged(RuntimeError):
    """The installed Ray no longer has an internal this module relies on."""


def exact_blocks(ds, rows: int, tasks: int):
    """``ds`` cut into blocks of exactly ``rows`` rows (the last may hold fewer), streaming.

    The repartition's tasks ask for no CPU, and at most ``tasks`` run at once.  At Ray Data's
    default of one CPU each they waited until the actor pools released theirs, i.e. until
    the end of the build, and nothing was committed before it; with no CPU and no cap Ray
    started a worker process for each of dozens of concurrent tasks.  Ray 2.60 takes neither
    setting for this operator, so they are set on its logical operator.
    """
    import ray

    ds = ds.repartition(target_num_rows_per_block=rows, strict=True)
    op = getattr(getattr(ds, "_logical_plan", None), "dag", None)
    if not isinstance(getattr(op, "ray_remote_args", None), dict) or not hasattr(op, "compute"):
        raise RayInternalsChanged(
            f"Ray {ray.__version__}: a repartition's logical operator has no ray_remote_args/compute "
            "(pipeline/executors/ray_private.py exact_blocks)")
    op.ray_remote_args.update(num_cpus=0)
    object.__setattr__(op, "compute", ray.data.TaskPoolStrategy(size=max(1, tasks)))
    return ds


@dataclass(frozen=True)
class NodeType:
    """A node type an autoscaler may start: its resources per node and its counts."""

    name: str
    resources: dict[str, float]
    min_count: int
    max_count: int  # -1: unbounded


def node_types() -> list[NodeType] | None:
    """The connected cluster's autoscaling node types; None where no autoscaler is known (a
    fixed cluster: ``ray start`` nodes, a local Ray).

    Where an autoscaler reported them to the GCS (KubeRay), from there; else from the
    autoscaling config its monitor process was started with (``ray up``'s head, ``ray start
    --autoscaling-config``), when this driver runs on the head (a job's driver does)."""
    import ray._private.state

    try:
        config = ray._private.state.state.get_cluster_config()
    except AttributeError as err:
        raise RayInternalsChanged(f"Ray's GCS state has no get_cluster_config: {err}") from None
    if config and config.node_group_configs:
        return [NodeType(g.name, {k: float(v) for k, v in g.resources.items()}, int(g.min_count), int(g.max_count))
                for g in config.node_group_configs]
    return _monitor_node_types()


def _monitor_node_types() -> list[NodeType] | None:
    """The node types of the autoscaling config this cluster's monitor was started with."""
    import ray
    import yaml

    try:
        gcs = ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001 - not connected
        return None
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                args = fh.read(65536).decode(errors="replace").split("\0")
        except OSError:
            continue
        if not any(a.endswith("monitor.py") for a in args) or f"--gcs-address={gcs}" not in args:
            continue
        path = next((a.split("=", 1)[1] for a in args if a.startswith("--autoscaling-config=")), None)
        if not path:
            return None
        try:
            with open(path, encoding="utf-8") as fh:
                cfg = yaml.safe_load(fh) or {}
        except (OSError, yaml.YAMLError):
            return None
        head = cfg.get("head_node_type")
        return [NodeType(name, {k: float(v) for k, v in (t.get("resources") or {}).items()},
                         int(t.get("min_workers", 0)), 0 if name == head else int(t.get("max_workers", 0)))
                for name, t in (cfg.get("available_node_types") or {}).items()]
    return None


def free_per_node() -> dict[str, dict[str, float]]:
    """Node id -> the resources free on it now; {} where Ray cannot say."""
    import ray._private.state

    try:
        per_node = ray._private.state.available_resources_per_node()
    except AttributeError as err:
        raise RayInternalsChanged(f"Ray's state module has no available_resources_per_node: {err}") from None
    return {nid: {k: float(v) for k, v in res.items()} for nid, res in (per_node or {}).items()}


def autoscaling_coordinator():
    """Ray Data's coordinator of autoscaler requests (one named actor per cluster).  Ray Data
    sends every dataset's requests to the autoscaler through it, replacing what was asked
    before; a request made beside it (``ray.autoscaler.sdk.request_resources``) would be
    overwritten at its next tick, so the build's budget goes through it too."""
    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )
    except ImportError as err:
        raise RayInternalsChanged(f"Ray Data has no autoscaling coordinator: {err}") from None
    return get_or_create_autoscaling_coordinator()


# The up-front request expires unless the driver that made it renews it: a driver killed by any
# signal, cut off from the head or killed for memory stops holding the nodes within the expiry,
# the coordinator's tick (20 s) and the nodes' idle timeout.  Ray Data's own requests expire after
# the same 180 s by default (RAY_DATA_AUTOSCALING_REQUEST_EXPIRE_TIME_S).
REQUEST_EXPIRY_ENV = "CNSBENCH_GPU_REQUEST_EXPIRY_S"
REQUEST_EXPIRY_S = 180.0
REQUEST_EXPIRY_RANGE = (5.0, 300.0)  # a few minutes at most; a few seconds for a test's cluster
HANDOVER_TIMEOUT_S = 1800.0  # a request the cloud never met is withdrawn after this long
FIRST_ACTORS_WAIT_S = 300.0  # nodes up, the pools' first actors not placed: withdrawn all the same


def request_expiry_s() -> float:
    """The up-front request's expiry: ``$CNSBENCH_GPU_REQUEST_EXPIRY_S``, default 180 s;
    :class:`~pipeline.errors.CnsbenchError` for a value that is not a number of seconds in range."""
    from pipeline.errors import CnsbenchError

    raw = os.environ.get(REQUEST_EXPIRY_ENV, "").strip()
    if not raw:
        return REQUEST_EXPIRY_S
    low, high = REQUEST_EXPIRY_RANGE
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:  # NaN and inf fail too
        raise CnsbenchError(f"{REQUEST_EXPIRY_ENV}={raw!r}: the GPU request's expiry must be a number of seconds "
                            f"from {low:g} to {high:g}")
    return value


def requester_id(output: str) -> str:
    """The requester id of the run writing ``output``: its own, so that two builds on one cluster
    add their budgets (the coordinator keeps one request per id, the last one made), and a build
    resumed on the same output replaces the request its killed predecessor left."""
    import hashlib

    return f"cnsbench-{hashlib.sha256(output.encode()).hexdigest()[:16]}"


@dataclass
class Handover:
    """When the up-front request is renewed and when it is withdrawn: :meth:`step` is told the
    time and the cluster's GPUs (up, and held by actors) and answers ``"renew"``, ``"withdraw"``
    or None.  Renewed every quarter of the expiry, so that a renewal late by a tick or two still
    comes before it; withdrawn once every GPU asked for is up and the pools' starting actors hold
    theirs (``first_gpus``), or when the cloud has not met it after :data:`HANDOVER_TIMEOUT_S`."""

    wanted: float
    first_gpus: float
    expiry_s: float
    started: float
    renewed: float
    all_up: float | None = None

    @property
    def renew_every(self) -> float:
        return max(1.0, self.expiry_s / 4)

    def step(self, now: float, up: float | None, used: float | None) -> str | None:
        if up is not None and up >= self.wanted - 1e-6:
            self.all_up = self.all_up or now
        placed = used is not None and used >= self.first_gpus - 1e-6
        if (self.all_up and (placed or now - self.all_up > FIRST_ACTORS_WAIT_S)) \
                or now - self.started > HANDOVER_TIMEOUT_S:
            return "withdraw"
        if now - self.renewed >= self.renew_every:
            self.renewed = now
            return "renew"
        return None


def gpus_up_and_used() -> tuple[float, float]:
    """The cluster's GPUs, and how many of them its actors hold now."""
    import ray

    total = float(ray.cluster_resources().get("GPU", 0))
    return total, total - float(ray.available_resources().get("GPU", 0))


@contextlib.contextmanager
def budget_request(bundles: list[dict[str, float]], first_gpus: float = 0.0, poll_s: float = 2.0, *,
                   requester: str) -> Iterator[None]:
    """Ask the autoscaler for ``bundles`` at once, as ``requester`` (:func:`requester_id`), keep the
    request alive while this driver runs (:class:`Handover`: it expires after
    :func:`request_expiry_s` unless renewed), and withdraw it as soon as the cluster holds their
    GPUs and the pools' starting actors (``first_gpus``: their GPUs) hold theirs (or the block
    ends, or fails): the nodes are then started together, and released once idle after the run,
    or after the expiry once the driver is gone, however it ended.

    The request goes through Ray Data's coordinator, which reserves what a requester asked for:
    held for the whole run, it would keep the GPUs from the run's own dataset, whose pools could
    then not grow onto them.  Withdrawn once the nodes are up and the pools' starting actors
    placed, the pools use the nodes (and grow onto any room left as their queues fill): withdrawn
    as soon as the nodes were up, a node the pools had not yet grown onto (their first actors
    still starting) was idle, and an idle timeout shorter than an actor's start-up released it
    before they could (measured with a 15 s timeout; the pools then never grew onto it)."""
    if not bundles:
        yield
        return
    import threading

    import ray

    expiry = request_expiry_s()
    coordinator = autoscaling_coordinator()

    def ask():
        return coordinator.request_resources.remote(requester_id=requester, resources=bundles, expire_after_s=expiry)

    ray.get(ask())
    now = time.monotonic()
    state = Handover(sum(float(b.get("GPU", 0)) for b in bundles), first_gpus, expiry, now, now)
    done = threading.Event()

    def withdraw() -> None:
        try:
            ray.get(coordinator.cancel_request.remote(requester), timeout=30)
        except Exception:  # noqa: BLE001 - it expires by itself; a failing cluster must not hide the run's error
            pass

    def hand_over() -> None:
        while not done.wait(poll_s):
            try:
                up, used = gpus_up_and_used()
            except Exception:  # noqa: BLE001 - the head is busy or gone: renew all the same, or let it expire
                up = used = None
            action = state.step(time.monotonic(), up, used)
            if action == "withdraw":
                withdraw()
                return
            if action == "renew":
                try:
                    ask()  # not awaited: a lost head must not stall the run; the request then expires
                except Exception:  # noqa: BLE001 - as above
                    pass

    watcher = threading.Thread(target=hand_over, name="cnsbench-budget-request", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join(timeout=5)
        withdraw()


def bootstrap_file() -> str:
    """Where ``ray start`` leaves its address and ``ray.init()`` without one looks it up."""
    from ray._common.utils import get_ray_address_file

    return get_ray_address_file(None)


def bootstrap_address() -> str | None:
    """The address in Ray's bootstrap file (``host:port`` of a GCS), or None without one."""
    path = bootstrap_file()
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read(256).strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        return None if not os.path.exists(path) else "?"


def raise_stage_errors() -> None:
    """Make Ray Data hand a stage's exception to the driver as it was raised (inside Ray's
    ``RayTaskError``): by default it wraps it in a ``UserCodeException`` whose cause is lost on the
    way, so a full disk on the Ray runner ended in a 141-line traceback where the local runner
    says one line."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    if not hasattr(ctx, "raise_original_map_exception"):
        raise RayInternalsChanged(f"Ray {ray.__version__}: DataContext has no raise_original_map_exception "
                                  "(pipeline/executors/ray_private.py raise_stage_errors)")
    ctx.raise_original_map_exception = True


def stage_error(err: BaseException) -> BaseException | None:
    """The exception a stage raised in its actor, from the error the driver got (None: not a
    stage's error)."""
    import ray.exceptions

    seen = 0
    while isinstance(err, ray.exceptions.RayTaskError) and seen < 8:
        err, seen = getattr(err, "cause", None), seen + 1
    return None if seen == 0 or isinstance(err, ray.exceptions.RayError) else err
