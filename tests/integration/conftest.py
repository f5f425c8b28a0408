"""A real multi-node Ray cluster on 127.0.0.1 shared by the runtime integration tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    """Four Ray nodes (node-0..node-3, 2 racks, 8 simulated GPUs, 8 CPUs each), connected."""
    from aicluster.runtime import EmbeddedCluster, embedded_topology

    cluster = EmbeddedCluster(embedded_topology(nodes=4, gpus_per_node=8))
    cluster.start()
    cluster.connect()
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture(scope="session")
def runtime(ray_cluster: object, tmp_path_factory: pytest.TempPathFactory) -> object:
    from aicluster.runtime import Runtime

    return Runtime(tmp_path_factory.mktemp("state"), start_timeout_s=60)
