"""A node dies under a running gang: discovery reports it dead, the gang fails with the rank
lost, the rank's process dies with its actor, and the node can come back."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from ray.util.placement_group import placement_group_table

from aicluster.core import DomainLevel, Placement, Slot
from aicluster.runtime import (
    EmbeddedCluster,
    GangPhase,
    GangSpec,
    GangStartTimeout,
    RankState,
    Runtime,
    discover,
)

pytestmark = pytest.mark.integration

STUBBORN = str(Path(__file__).parent / "jobs" / "stubborn.py")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_lost_node_fails_its_gang_and_comes_back(
    ray_cluster: EmbeddedCluster, runtime: Runtime
) -> None:
    node_3 = next(node for node in ray_cluster.topology.nodes if node.name == "node-3")
    placement = Placement((Slot("node-2", 1), Slot("node-3", 1)), DomainLevel.RACK, "rack-1")
    handle = runtime.launch(
        GangSpec("doomed", STUBBORN, placement, workers=2, gpus_per_worker=1, cpus_per_worker=0)
    )
    deadline = time.monotonic() + 60
    while "started" not in handle.logs(1).text:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    match = re.search(r"pid (\d+)", handle.logs(1).text)
    assert match is not None
    pid = int(match.group(1))

    ray_cluster.remove_node("node-3")
    try:
        status = handle.wait(timeout_s=90)
        assert status.phase is GangPhase.FAILED
        assert (
            status.ranks[1].state is RankState.LOST and status.ranks[0].state is RankState.RUNNING
        )
        assert "rank 1 on node-3 was lost" in status.message
        assert discover().health() == {
            "node-0": True,
            "node-1": True,
            "node-2": True,
            "node-3": False,
        }
        assert discover().cluster.total_gpus == 24
        deadline = time.monotonic() + 30
        while _alive(pid):  # the rank's process died with its actor (PR_SET_PDEATHSIG)
            assert time.monotonic() < deadline, "rank process outlived its node"
            time.sleep(0.5)
        final = handle.stop(grace_s=2)
        assert final.phase is GangPhase.FAILED  # the stop does not hide the loss
        assert final.ranks[0].stopped and final.ranks[0].exit_code == -9
    finally:
        ray_cluster.add_node(node_3)
    assert discover().health()["node-3"] is True
    assert discover().cluster.total_gpus == 32


def test_a_gang_placed_on_a_node_that_just_died_gives_up_once_ray_knows(
    ray_cluster: EmbeddedCluster, runtime: Runtime
) -> None:
    """The scheduler can choose a node in the seconds before Ray declares it dead: its bundles
    can never be reserved, so the launch gives up as soon as the node is reported dead (not
    after the whole start timeout) and leaves nothing behind."""
    node_3 = next(node for node in ray_cluster.topology.nodes if node.name == "node-3")
    placement = Placement((Slot("node-3", 1),), DomainLevel.NODE, "node-3")
    ray_cluster.remove_node("node-3", graceful=False)
    try:
        with pytest.raises(GangStartTimeout, match=r"node\(s\) \['node-3'\] died"):
            runtime.launch(GangSpec("too-late", STUBBORN, placement, workers=1, gpus_per_worker=1))
        groups = [g for g in placement_group_table().values() if "too-late" in g["name"]]
        assert groups and all(g["state"] == "REMOVED" for g in groups)
    finally:
        ray_cluster.add_node(node_3)
