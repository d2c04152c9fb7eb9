"""The test cluster's own start-up rules (tests/raycluster.py), without starting Ray: a node
whose ``ray start`` exits before it is ready is started again, under a temp dir and label of
its own, and a node that keeps exiting fails with its log."""

from __future__ import annotations

from pathlib import Path

import pytest
from raycluster import NODE_LABEL, Cluster, NodeExited

# Unit tests, said outright: the cluster's nodes are FakeNode, though the sources name `ray start`.
pytestmark = pytest.mark.unit


class FakeNode:
    """Stands in for ``raycluster.Node``: ``ray start`` with these args, which either stays up
    or has already exited."""

    def __init__(self, name: str, args: list[str], base: Path, exits: bool) -> None:
        self.temp_dir, self.args, self.exits, self.killed = base / name, args, exits, False

    def alive(self) -> bool:
        return not self.exits

    def log_tail(self) -> str:
        return f"{self.temp_dir.name}: The current node timed out during startup."

    def kill(self) -> None:
        self.killed = True


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    c = Cluster(tmp_path)
    c.exits = []  # one entry per start: does that try's `ray start` exit early?
    monkeypatch.setattr("raycluster.Node", lambda name, args, env, base: FakeNode(name, args, base, c.exits.pop(0)))
    monkeypatch.setattr("raycluster.time.sleep", lambda s: None)
    return c


def _start(c: Cluster, name: str, ready=lambda: True):
    return c._start(lambda: c._node(name, ["--num-cpus=2"], {}), ready, f"node {name}")


def test_a_node_that_exits_while_starting_is_started_again(cluster):
    cluster.exits = [True, True, False]
    node = _start(cluster, "w")
    assert [n.temp_dir.name for n in cluster.nodes] == ["w", "w-1", "w-2"]
    assert node is cluster.nodes[-1] and not node.killed
    assert [n.killed for n in cluster.nodes[:2]] == [True, True]
    assert node.args == ["--num-cpus=2", f"--labels={NODE_LABEL}=w-2"]


def test_a_node_that_exits_every_time_fails_with_its_log(cluster):
    cluster.exits = [True, True, True]
    with pytest.raises(NodeExited, match=r"`ray start` for node h exited:\nh-2: The current node timed out"):
        _start(cluster, "h")
    assert len(cluster.nodes) == 3


def test_names_of_other_nodes_do_not_count_as_tries(cluster):
    cluster.exits = [False, False, False]
    _start(cluster, "w1")
    _start(cluster, "w")
    _start(cluster, "w")
    assert [n.temp_dir.name for n in cluster.nodes] == ["w1", "w", "w-1"]
