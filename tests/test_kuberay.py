"""The KubeRay manifests run through Ray's own KubeRay autoscaler code.

Ray's autoscaler on Kubernetes reads a ``RayCluster`` through two modules of
``ray.autoscaler._private.kuberay``: ``autoscaling_config`` derives the node types from the CR
(resources from ``rayStartParams`` and the Ray container's limits), and ``node_provider``'s
``KubeRayNodeProvider`` scales a worker group by JSON-patching its ``replicas`` (and, to remove
given pods, its ``scaleStrategy.workersToDelete``).  Here both run unchanged, driven by Ray's
``StandardAutoscaler``, with an in-memory stand-in for the Kubernetes API at the provider's
documented seam (``IKubernetesHttpApiClient``: ``get`` / ``patch``).  The stand-in holds the
RayCluster, applies the provider's patches, and plays KubeRay's operator: it keeps as many
worker pods as a group's ``replicas``, deleting the ones named in ``workersToDelete`` first.
The GCS's part (raylet heartbeats, the build's ``request_resources`` bundles) is fed straight
into Ray's ``LoadMetrics``, as the autoscaler's monitor does.

The build's request is the one ``cnsbench build --max-gpus 8`` makes up front on such a
cluster: the project's own pool sizing (``size_pools`` / ``budget_bundles``) on the node types
Ray derived from the manifest.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import yaml

from pipeline.cli import TINY_CONFIG

REPO = Path(__file__).resolve().parents[1]
KUBERAY = REPO / "deploy" / "kuberay"
GIB = 2**30
GPU_GROUP = "gpu"
#: What the placeholders of the manifests are filled with (``envsubst`` in deploy/README.md).
FILLED = {"REGISTRY": "registry.example.com/team", "CNSBENCH_BUCKET": "bench-bucket"}
#: Each GPU actor's projected host memory in the build's request (the build asks for each
#: pool's projection; any figure a GPU node holds a few of shows the same scaling).
ACTOR_MEMORY = 4 * GIB


# =========================================================================== the manifests
def _filled(path: Path) -> dict:
    text = re.sub(r"\$\{(\w+)\}", lambda m: FILLED[m.group(1)], path.read_text())
    return yaml.safe_load(text)


def _raycluster_cr() -> dict:
    doc = _filled(KUBERAY / "raycluster.yaml")
    doc["metadata"].setdefault("namespace", "default")
    return doc


def _rayjob_cr() -> dict:
    """The RayCluster a RayJob's operator creates from its ``rayClusterSpec``."""
    job = _filled(KUBERAY / "rayjob.yaml")
    return {"apiVersion": job["apiVersion"], "kind": "RayCluster",
            "metadata": {"name": f"{job['metadata']['name']}-raycluster", "namespace": "default"},
            "spec": job["spec"]["rayClusterSpec"]}


def _documented_max_gpus(which: str) -> int:
    """The GPU budget each manifest documents: the RayJob's entrypoint ``--max-gpus``, and for
    the long-lived cluster the shipped config's ``resources.max_gpus`` (deploy/README.md)."""
    if which == "rayjob":
        entry = _filled(KUBERAY / "rayjob.yaml")["spec"]["entrypoint"]
        return int(re.search(r"--max-gpus (\d+)", entry).group(1))
    return int(yaml.safe_load((REPO / "configs" / "cns_bench.yaml").read_text())["resources"]["max_gpus"])


MANIFESTS = {"raycluster": _raycluster_cr, "rayjob": _rayjob_cr}


# =========================================================================== the Kubernetes stand-in
def _quantity(value: Any) -> float:
    from ray.autoscaler._private.kuberay.utils import parse_quantity

    return float(parse_quantity(str(value)))


def pod_ray_resources(group: dict) -> dict[str, float]:
    """What ``ray start`` in a pod of ``group`` declares, as KubeRay's operator starts it: CPUs
    from the Ray container's CPU limit (else request), GPUs from its GPU limit, and memory from
    its memory limit only; without one the raylet sees the whole Kubernetes node's memory, which
    is not what the autoscaler plans with."""
    res = group["template"]["spec"]["containers"][0].get("resources", {})
    limits, requests = res.get("limits", {}), res.get("requests", {})
    out = {"CPU": float(math.ceil(_quantity(limits.get("cpu", requests.get("cpu", 0)))))}
    gpus = next((v for k, v in limits.items() if k.endswith("gpu")), None)
    if gpus is not None:
        out["GPU"] = float(math.ceil(_quantity(gpus)))
    if "memory" in limits:
        out["memory"] = float(math.ceil(_quantity(limits["memory"])))
    return out


def _apply_patch(doc: dict, ops: list[dict]) -> None:
    """RFC 6902 ``test`` / ``replace`` / ``add`` on ``doc`` (the operations the provider sends)."""
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        key: Any = int(last) if isinstance(node, list) and last != "-" else last
        if op["op"] == "test":
            assert node[key] == op["value"], op
        elif op["op"] == "replace":
            assert isinstance(node, list) or key in node or key == "scaleStrategy", op
            node[key] = copy.deepcopy(op["value"])
        elif op["op"] == "add":
            if isinstance(node, list):
                node.append(copy.deepcopy(op["value"])) if key == "-" else node.insert(key, copy.deepcopy(op["value"]))
            else:
                node[key] = copy.deepcopy(op["value"])
        else:
            raise AssertionError(f"unexpected patch operation {op}")


class FakeKubernetes:
    """The Kubernetes API server and KubeRay's operator for one RayCluster, in memory."""

    def __init__(self, cr: dict):
        self.cr = copy.deepcopy(cr)
        self.name = cr["metadata"]["name"]
        self.cr["metadata"].setdefault("resourceVersion", "1")
        self.patches: list[list[dict]] = []
        self.pods: dict[str, dict] = {}
        self._serial = 0
        self._pod("headgroup", "head")
        self.reconcile()

    # -- the provider's seam (IKubernetesHttpApiClient)
    def get(self, path: str) -> dict:
        if path == f"rayclusters/{self.name}":
            return copy.deepcopy(self.cr)
        if path.startswith("pods?labelSelector="):
            assert unquote(path.split("=", 1)[1]).split("&")[0] == f"ray.io/cluster={self.name}", path
            return {"metadata": {"resourceVersion": str(self._serial)}, "items": copy.deepcopy(list(self.pods.values()))}
        raise AssertionError(f"unexpected GET {path}")

    def patch(self, path: str, payload: Any, content_type: str = "application/json-patch+json") -> dict:
        assert path == f"rayclusters/{self.name}", path
        assert content_type == "application/json-patch+json" and isinstance(payload, list), payload
        self.patches.append(copy.deepcopy(payload))
        _apply_patch(self.cr, payload)
        self.reconcile()
        return copy.deepcopy(self.cr)

    def delete(self, path: str) -> dict:
        raise AssertionError(f"unexpected DELETE {path}")

    # -- the operator
    def _pod(self, group: str, kind: str) -> None:
        self._serial += 1
        name = f"{self.name}-{group}-{kind}-{self._serial:03d}"
        self.pods[name] = {
            "metadata": {"name": name, "labels": {"ray.io/cluster": self.name, "ray.io/node-type": kind,
                                                    "ray.io/group": group}},
            "status": {"podIP": f"10.0.0.{self._serial}", "containerStatuses": [{"state": {"running": {}}}]},
        }

    def reconcile(self) -> None:
        """Each worker group gets ``replicas`` pods: the ones in ``workersToDelete`` go first."""
        for group in self.cr["spec"]["workerGroupSpecs"]:
            mine = [n for n, p in self.pods.items() if p["metadata"]["labels"]["ray.io/group"] == group["groupName"]]
            for name in group.get("scaleStrategy", {}).get("workersToDelete", []):
                if name in self.pods:
                    del self.pods[name]
                    mine.remove(name)
            while len(mine) > group.get("replicas", 1):
                del self.pods[mine.pop()]
            while len(mine) < group.get("replicas", 1):
                self._pod(group["groupName"], "worker")
                mine.append(next(reversed(self.pods)))

    def workers(self, group: str) -> list[str]:
        return [n for n, p in self.pods.items() if p["metadata"]["labels"]["ray.io/group"] == group
                and p["metadata"]["labels"]["ray.io/node-type"] == "worker"]

    def group(self, name: str) -> dict:
        return next(g for g in self.cr["spec"]["workerGroupSpecs"] if g["groupName"] == name)

    def pod_resources(self, pod: dict) -> dict[str, float]:
        labels = pod["metadata"]["labels"]
        spec = self.cr["spec"]["headGroupSpec"] if labels["ray.io/node-type"] == "head" else self.group(labels["ray.io/group"])
        return pod_ray_resources(spec)


class FakeGcs:
    """The GCS client the autoscaler drains nodes through before their pods go."""

    def drain_nodes(self, node_ids, timeout=None):
        return list(node_ids)


# =========================================================================== the build's request
def build_request(autoscaling_config: dict, max_gpus: int) -> list[dict[str, float]]:
    """The bundles a ``--max-gpus`` build asks the autoscaler for up front on a cluster with these
    node types: the project's pool sizing on the demo chain with the shipped config's GPU
    shares (``configs/cns_bench.yaml``).  An actor no node type can hold is refused here, naming
    the node types (:class:`pipeline.executors.placement.Unplaceable`)."""
    from pipeline.build import build_chain
    from pipeline.config import load_config
    from pipeline.executors.cluster import ClusterView
    from pipeline.executors.pools import Sized, budget_bundles, size_pools
    from pipeline.executors.ray_private import NodeType

    shipped = yaml.safe_load((REPO / "configs" / "cns_bench.yaml").read_text())["resources"]
    sets = [f"resources.{stage}.num_gpus={shipped[stage]['num_gpus']}" for stage in ("generate", "filter", "classify")]
    # 16 generation units (2 classes x 8 seeds): more than the budget, as in a real build.
    cfg = load_config(TINY_CONFIG, sets=[*sets, "benchmark.seeds=[1,2,3,4,5,6,7,8]", f"resources.max_gpus={max_gpus}"])
    chain = build_chain(cfg)
    head = autoscaling_config["head_node_type"]
    types = [NodeType(name, {k: float(v) for k, v in t["resources"].items()}, int(t["min_workers"]),
                      0 if name == head else int(t["max_workers"]))
             for name, t in autoscaling_config["available_node_types"].items()]
    nodes = {"head": dict(types[[t.name for t in types].index(head)].resources)}
    view = ClusterView(False, nodes, dict(nodes), types)
    sized = [Sized(p, p.resources, ACTOR_MEMORY if p.resources.num_gpus > 0 else GIB) for p in chain.pools]
    return budget_bundles(size_pools(chain, sized, view, lambda _: None))


# =========================================================================== the run
class KubeRayRun:
    """Ray's autoscaler over a RayCluster held by :class:`FakeKubernetes`."""

    def __init__(self, cr: dict, monkeypatch):
        from ray.autoscaler._private.autoscaler import StandardAutoscaler
        from ray.autoscaler._private.kuberay import node_provider
        from ray.autoscaler._private.kuberay.autoscaling_config import AutoscalingConfigProducer
        from ray.autoscaler._private.load_metrics import LoadMetrics
        from ray.autoscaler._private.providers import _clear_provider_cache

        self.kube = FakeKubernetes(cr)
        # The seam: every Kubernetes client Ray's KubeRay code makes is the stand-in.
        monkeypatch.setattr(node_provider, "KubernetesHttpApiClient", lambda *a, **k: self.kube)
        monkeypatch.setattr(node_provider, "RAY_HEAD_POD_NAME", None)
        _clear_provider_cache()  # Ray keeps one provider per cluster name: this run's is over this stand-in
        self.config = AutoscalingConfigProducer(cr["metadata"]["name"], cr["metadata"]["namespace"])
        self.metrics = LoadMetrics()
        self.heartbeat(idle_s=0.0)
        self.autoscaler = StandardAutoscaler(self.config, self.metrics, FakeGcs(), update_interval_s=0,
                                             max_failures=0)

    def heartbeat(self, idle_s: float) -> None:
        """Every running pod's raylet reports what it declared, all of it free, idle ``idle_s``."""
        for name, pod in self.kube.pods.items():
            res = self.kube.pod_resources(pod)
            self.metrics.update(pod["status"]["podIP"], name.encode(), res, dict(res), idle_s)
        self.metrics.prune_active_ips([p["status"]["podIP"] for p in self.kube.pods.values()])

    def step(self, idle_s: float = 0.0) -> None:
        self.heartbeat(idle_s)
        self.autoscaler.update()

    def check_pods_offer_their_node_type(self) -> None:
        """A pod's raylet declares what the autoscaler planned its node type with; otherwise the
        autoscaler's bin packing and Ray's placement disagree and the build cannot scale."""
        types = self.config()["available_node_types"]
        for pod in self.kube.pods.values():
            group = pod["metadata"]["labels"]["ray.io/group"]
            have = self.kube.pod_resources(pod)
            planned = {k: float(v) for k, v in types[group]["resources"].items()}
            assert have == planned, (f"worker group {group!r}: its pods declare {have} to Ray, but Ray's autoscaler "
                                     f"plans with {planned} (give the Ray container CPU, GPU and memory limits)")


def _gpu_node_type(config: dict) -> dict:
    return config["available_node_types"][GPU_GROUP]


@pytest.mark.parametrize("which", sorted(MANIFESTS))
def test_the_gpu_group_becomes_a_node_type_with_cpu_gpu_and_memory(which):
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

    cr = MANIFESTS[which]()
    config = _derive_autoscaling_config_from_ray_cr(cr)
    gpu = _gpu_node_type(config)
    limits = cr["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert gpu["resources"] == {"CPU": int(limits["cpu"]), "GPU": int(limits["nvidia.com/gpu"]),
                                "memory": int(_quantity(limits["memory"]))}
    assert gpu["resources"]["memory"] == 28 * GIB
    assert (gpu["min_workers"], gpu["max_workers"]) == (0, _documented_max_gpus(which))
    assert "GPU" not in config["available_node_types"]["headgroup"]["resources"]
    idle = cr["spec"]["autoscalerOptions"]["idleTimeoutSeconds"]
    assert config["idle_timeout_minutes"] == idle / 60


@pytest.mark.parametrize("which", sorted(MANIFESTS))
def test_a_max_gpus_build_scales_the_gpu_group_to_its_budget_and_back_to_zero(which, monkeypatch):
    run = KubeRayRun(MANIFESTS[which](), monkeypatch)
    config = run.config()
    max_gpus = _documented_max_gpus(which)
    bundles = build_request(config, max_gpus)
    per_node = _gpu_node_type(config)["resources"]["GPU"]
    assert max_gpus - 1 < sum(b["GPU"] for b in bundles) <= max_gpus  # the budget, in whole actors
    nodes = math.ceil(sum(b["GPU"] for b in bundles) / per_node)

    run.step()
    assert run.kube.group(GPU_GROUP)["replicas"] == 0 and run.kube.patches == []  # nothing asked, nothing started

    # 1. the build's request: one patch of the GPU group's replicas to the budget's node count
    run.metrics.set_resource_requests(bundles)
    run.step()
    assert run.kube.patches[-1] == [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": nodes}]
    assert run.kube.group(GPU_GROUP)["replicas"] == nodes == max_gpus
    assert len(run.kube.workers(GPU_GROUP)) == nodes
    run.check_pods_offer_their_node_type()
    patches = len(run.kube.patches)
    run.step()  # the pods are up: nothing more to ask
    assert len(run.kube.patches) == patches and len(run.kube.workers(GPU_GROUP)) == nodes

    # 2. the request withdrawn, the nodes busy: kept
    run.metrics.set_resource_requests([])
    run.step(idle_s=0.0)
    assert len(run.kube.workers(GPU_GROUP)) == nodes

    # 3. idle past the timeout: each pod named in workersToDelete, replicas 0, the pods gone
    idle_s = config["idle_timeout_minutes"] * 60 + 1
    workers = set(run.kube.workers(GPU_GROUP))
    run.step(idle_s=idle_s)
    down = {op["path"]: op["value"] for op in run.kube.patches[-1]}
    assert down["/spec/workerGroupSpecs/0/replicas"] == 0
    assert set(down["/spec/workerGroupSpecs/0/scaleStrategy"]["workersToDelete"]) == workers
    assert run.kube.workers(GPU_GROUP) == []
    run.step(idle_s=idle_s)  # the operator removed them: the provider clears workersToDelete
    assert run.kube.group(GPU_GROUP)["scaleStrategy"]["workersToDelete"] == []
    assert run.kube.group(GPU_GROUP)["replicas"] == 0


def _without_memory_limit(cr: dict) -> dict:
    cr = copy.deepcopy(cr)
    del cr["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    return cr


def _without_memory(cr: dict) -> dict:
    cr = _without_memory_limit(cr)
    del cr["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"]
    return cr


@pytest.mark.parametrize("damage", [_without_memory_limit, _without_memory])
@pytest.mark.parametrize("which", sorted(MANIFESTS))
def test_gpu_containers_without_a_memory_limit_fail_naming_the_group(which, damage, monkeypatch):
    """A GPU container with a memory request but no limit: Ray's autoscaler plans with the
    request while the pods' raylets declare none.  With neither, the GPU node type offers no
    memory and the build's pools cannot be placed on it.  Either way the group is named."""
    from pipeline.executors.placement import Unplaceable

    run = KubeRayRun(damage(MANIFESTS[which]()), monkeypatch)
    with pytest.raises((AssertionError, Unplaceable), match=rf"\b{GPU_GROUP}\b") as err:
        run.metrics.set_resource_requests(build_request(run.config(), _documented_max_gpus(which)))
        run.step()
        run.check_pods_offer_their_node_type()
    assert "memory" in str(err.value)
