"""Pipelines inside racks (``scheduler/placement/pipeline.py``): a gang with pipeline stages
that must span racks is packed rack by rack in whole pipelines where the racks allow it, and
``why`` shows the mesh it got."""

import pytest

from aicluster.core import DomainLevel, Placement, Slot
from aicluster.scheduler import FreeIndex
from aicluster.scheduler.placement import pipelines_in_rack
from builders import Driver, make_job, small_cluster


def fragmented() -> Driver:
    """Two racks of two 4-GPU nodes; free: node-0 3 and node-1 none (rack-0), node-2 3 and
    node-3 1 (rack-1). Six GPUs fit in no one rack."""
    driver = Driver(small_cluster(nodes=4, gpus=4, per_rack=2))
    for name, node, gpus in (("a", "node-0", 1), ("b", "node-1", 4), ("c", "node-2", 1)):
        driver.occupy(name, node, gpus)
    driver.occupy("d", "node-3", 3)
    return driver


def test_a_pipelined_gang_across_racks_keeps_each_pipeline_in_one_rack() -> None:
    driver = fragmented()
    driver.submit(make_job("pp").workers(6, 1).mesh(data=3, pipeline=2))
    plan = driver.cycle()
    (admit,) = plan.admissions
    assert admit.placement.score["pipelines_in_rack"] == 1.0
    assert "mesh dp=3 x pp=2 x tp=1, 3 of 3 pipelines inside one rack" in admit.reason
    # rack-1 first (it holds two pipelines), then rack-0: every rack's GPUs a multiple of 2
    assert admit.placement.gpus_by_node() == {"node-2": 3, "node-3": 1, "node-0": 2}


def test_without_pipelines_the_same_gang_takes_the_fewest_nodes() -> None:
    """The plain pack of the same six GPUs (what a data-parallel gang gets) would split one of
    three pipelines between the racks: the preference is what moves it."""
    driver = fragmented()
    driver.submit(make_job("dp").workers(6, 1).mesh(data=6))
    (admit,) = driver.cycle().admissions
    assert admit.placement.gpus_by_node() == {"node-0": 3, "node-2": 3}
    assert "pipelines_in_rack" not in admit.placement.score
    index = driver.state.index
    staged = make_job("pp").workers(6, 1).mesh(data=3, pipeline=2).build()
    assert pipelines_in_rack(index, staged, admit.placement.slots) == (2, 3)


def test_when_no_rack_holds_a_whole_pipeline_the_plain_pack_stands() -> None:
    driver = Driver(small_cluster(nodes=4, gpus=4, per_rack=2))
    for name, node in (("a", "node-0"), ("b", "node-1"), ("c", "node-2"), ("d", "node-3")):
        driver.occupy(name, node, 3)  # one GPU free on each node: a pipeline is four
    driver.submit(make_job("pp").workers(4, 1).mesh(data=1, pipeline=4))
    (admit,) = driver.cycle().admissions
    assert "0 of 1 pipelines inside one rack" in admit.reason


@pytest.mark.parametrize(
    ("gpus_by_node", "inside"),
    [
        ({"node-0": 4, "node-2": 4}, (2, 2)),  # each rack one whole pipeline
        ({"node-0": 2, "node-2": 4, "node-1": 2}, (2, 2)),  # rack-0's ranks together: [0,4)
        ({"node-0": 3, "node-2": 3, "node-3": 2}, (1, 2)),  # [0,4) straddles, [4,8) rack-1
    ],
)
def test_pipelines_are_counted_as_the_runtime_numbers_ranks(
    gpus_by_node: dict[str, int], inside: tuple[int, int]
) -> None:
    """Ranks go rack by rack in placement order, so a rack's ranks are consecutive even when
    its nodes are not next to each other in the placement."""
    index = FreeIndex(small_cluster(nodes=4, gpus=4, per_rack=2))
    job = make_job("pp").workers(8, 1).mesh(data=2, pipeline=2, tensor=2).build()
    slots = tuple(Slot(node, gpus, 0) for node, gpus in gpus_by_node.items())
    placement = Placement(slots, DomainLevel.POD, "pod-0")
    assert pipelines_in_rack(index, job, placement.slots) == inside
