"""Every use of Ray's private or semi-public internals, in one place.

Ray 2.60 has no public API for three things the Ray executor needs:

* blocks of exact row counts from a repartition whose tasks ask for no CPU
  (:func:`exact_blocks`: the logical operator's ``ray_remote_args`` and ``compute``);
* the node types an autoscaler may start, with their resources and counts
  (:func:`node_types`: the cluster config an autoscaler reports to the GCS, which Ray Data
  itself reads for its own autoscaling, else the config the head's monitor process was
  started with: Ray's VM autoscaler reports none);
* each node's free resources (:func:`free_per_node`: Ray's state module);
* asking the autoscaler for a run's whole GPU budget (:func:`budget_request`: through Ray
  Data's coordinator, which would overwrite a request made beside it);
* the address ``ray start`` left in Ray's bootstrap file (:func:`bootstrap_address`).

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


REQUESTER = "cnsbench-build"
REQUEST_EXPIRY_S = 7 * 24 * 3600  # withdrawn by the run itself (budget_request)


HANDOVER_TIMEOUT_S = 1800.0  # a request the cloud never met is withdrawn after this long
FIRST_ACTORS_WAIT_S = 300.0  # nodes up, the pools' first actors not placed: withdrawn all the same


def gpus_up_and_used() -> tuple[float, float]:
    """The cluster's GPUs, and how many of them its actors hold now."""
    import ray

    total = float(ray.cluster_resources().get("GPU", 0))
    return total, total - float(ray.available_resources().get("GPU", 0))


@contextlib.contextmanager
def budget_request(bundles: list[dict[str, float]], first_gpus: float = 0.0, poll_s: float = 2.0) -> Iterator[None]:
    """Ask the autoscaler for ``bundles`` at once, and withdraw the request as soon as the cluster
    holds their GPUs and the pools' starting actors (``first_gpus``: their GPUs) hold theirs (or the
    block ends, or fails): the nodes are then started together, and released once idle after the
    run.

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

    coordinator = autoscaling_coordinator()
    ray.get(coordinator.request_resources.remote(requester_id=REQUESTER, resources=bundles,
                                                 expire_after_s=REQUEST_EXPIRY_S))
    wanted = sum(float(b.get("GPU", 0)) for b in bundles)
    done = threading.Event()

    def withdraw() -> None:
        try:
            ray.get(coordinator.cancel_request.remote(REQUESTER), timeout=30)
        except Exception:  # noqa: BLE001 - it expires by itself; a failing cluster must not hide the run's error
            pass

    def hand_over() -> None:
        deadline, all_up = time.monotonic() + HANDOVER_TIMEOUT_S, None
        while not done.wait(poll_s):
            try:
                up, used = gpus_up_and_used()
            except Exception:  # noqa: BLE001 - the driver is going away
                return
            now = time.monotonic()
            if up >= wanted - 1e-6:
                all_up = all_up or now
            placed = used >= first_gpus - 1e-6
            if (all_up and (placed or now - all_up > FIRST_ACTORS_WAIT_S)) or now > deadline:
                withdraw()
                return

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
