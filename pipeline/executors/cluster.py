"""The Ray cluster a chain runs on: which one (the address), what it holds, what it may grow to.

Addresses:

* none: a new local Ray for this command alone (``address="local"``), whatever Ray's
  bootstrap file says.  ``ray.init()`` without an address connects to the cluster named in
  that file, and a cluster that was killed leaves its address there: every command after it
  then failed with Ray's "When connecting to an existing cluster, num_cpus and num_gpus must
  not be provided".  A running ``ray start`` cluster is mentioned in one line
  (:func:`running_cluster_note`);
* ``auto``: the running ``ray start`` cluster of Ray's bootstrap file, checked first
  (:func:`check_auto`), so a stale file is one line naming it, not Ray's error text;
* anything else: that cluster (a job's driver gets it in ``$RAY_ADDRESS``).

:class:`ClusterView` is what the executor decides with: the nodes' resources, what is free
at start (a job's driver has reserved its CPU by then), and the autoscaler's node types.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from pipeline.errors import CnsbenchError
from pipeline.executors import ray_private

LOCAL = "local"
AUTO = "auto"


def given_address(address: str | None) -> str | None:
    """The cluster this command was pointed at: ``--address``, else ``$RAY_ADDRESS`` (a Ray
    job's driver), else None (a local Ray of its own)."""
    return address or os.environ.get("RAY_ADDRESS") or None


def _reachable(address: str, timeout: float = 2.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def running_cluster() -> str | None:
    """The address of a running cluster named in Ray's bootstrap file, or None (no file, or a
    stale one: nothing answers there)."""
    address = ray_private.bootstrap_address()
    return address if address and address != "?" and _reachable(address) else None


def running_cluster_note() -> str | None:
    """The one line a command that starts its own Ray prints when a ``ray start`` cluster runs."""
    address = running_cluster()
    if not address:
        return None
    return (f"a Ray cluster started by `ray start` is running at {address}; this command starts its own local "
            "Ray (pass --address auto to run on that cluster)")


def check_auto() -> None:
    """``--address auto``: ValueError (exit 2) naming Ray's bootstrap file unless it names a
    running cluster."""
    path = ray_private.bootstrap_file()
    address = ray_private.bootstrap_address()
    if not address:
        raise CnsbenchError(f"--address auto: no Ray cluster was started on this host by `ray start` ({path} "
                         "does not exist); start one, give its address, or leave --address out to use a local Ray")
    if not _reachable(address):
        raise CnsbenchError(f"--address auto: the Ray cluster named in {path} ({address}) is not running (a stale "
                         "file from a cluster that stopped); start one, or leave --address out to use a local Ray")


@dataclass(frozen=True)
class ClusterView:
    """The connected cluster at the start of a run."""

    local: bool  # a Ray this command started
    nodes: dict[str, dict[str, float]]  # alive node id -> its total resources
    free: dict[str, dict[str, float]]  # alive node id -> its free resources
    node_types: list[ray_private.NodeType] | None  # None: no autoscaler

    @property
    def autoscaling(self) -> bool:
        return bool(self.node_types) and any(t.max_count != 0 for t in self.node_types)

    def total(self, key: str) -> float:
        return sum(float(n.get(key, 0) or 0) for n in self.nodes.values())

    def offers(self) -> dict[str, dict[str, float]]:
        """What a node may offer one actor: each node type of an autoscaler, and each alive node."""
        out = {f"node type {t.name}": t.resources for t in self.node_types or [] if t.max_count != 0}
        out.update({f"node {nid[:8]}": res for nid, res in self.nodes.items()})
        return out


def read_cluster(local: bool) -> ClusterView:
    """The connected cluster's nodes, free resources and node types."""
    import ray

    nodes, free = {}, {}
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        nodes[node["NodeID"]] = {k: float(v) for k, v in node.get("Resources", {}).items()}
    free = {nid: res for nid, res in ray_private.free_per_node().items() if nid in nodes}
    if not free and nodes:
        available = {k: float(v) for k, v in ray.available_resources().items()}
        free = {next(iter(nodes)): available}
    return ClusterView(local, nodes, free, None if local else ray_private.node_types())
