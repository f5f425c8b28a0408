"""Discovery on a real 4-node Ray cluster: labelled nodes come back as the topology."""

import pytest

from aicluster.runtime import EmbeddedCluster, discover, embedded_topology

pytestmark = pytest.mark.integration


def test_discovery_returns_the_labelled_topology(ray_cluster: EmbeddedCluster) -> None:
    view = discover()
    expected = embedded_topology(nodes=4, gpus_per_node=8)
    assert view.cluster.nodes == expected.nodes
    assert view.health() == {f"node-{i}": True for i in range(4)}
    assert {name: len(nodes) for name, nodes in view.cluster.racks().items()} == {
        "rack-0": 2,
        "rack-1": 2,
    }
    info = view.nodes["node-2"]
    assert info.alive and info.address == "127.0.0.1"
    assert info.gpu_resource == "aicluster/gpu"
    assert info.labels["aicluster.io/rack"] == "rack-1"
    assert info.available.get("aicluster/gpu") == 8.0
