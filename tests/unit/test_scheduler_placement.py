"""Topology-aware gang placement: one table of named cases (add a row), then the free-capacity
index's NVLink cases."""

import pytest

from aicluster.core import DomainLevel, NodeShape, PendingCode, Slot, make_cluster
from aicluster.scheduler import FreeIndex, PlacementFailure, find_placement
from builders import Case, Occupied, check, make_job, small_cluster

PLACEMENT = {
    "small jobs best-fit onto partly used nodes": Case(
        cluster=small_cluster(nodes=2),
        running=(make_job("six").gpus(6),),
        submit=(make_job("two").gpus(2),),
        on={"two": ("node-0",), "six": ("node-0",)},
    ),
    "a 16-GPU gang lands in the one rack that holds it whole": Case(
        # 3 racks of 2 nodes. Rack 0 keeps 4+4 free, rack 1 keeps 8+4 free, rack 2 is empty.
        cluster=small_cluster(nodes=6, per_rack=2),
        running=(
            Occupied("r0a", "node-0", 4),
            Occupied("r0b", "node-1", 4),
            Occupied("r1", "node-3", 4),
        ),
        submit=(make_job("big").gpus(16),),
        admits=("big",),
        on={"big": ("node-4", "node-5")},
        says={"big": "placed in rack rack-2"},
    ),
    "a rack-bound gang no rack holds waits with a topology reason": Case(
        # Two racks of one node each: 16 GPUs free in total but no rack holds 16.
        cluster=small_cluster(nodes=2, per_rack=1),
        submit=(make_job("big").gpus(16).within(DomainLevel.RACK),),
        admits=(),
        waits={"big": PendingCode.TOPOLOGY},
        says={"big": "no rack fits 16 GPUs"},
    ),
    "a gang spills to the pod when it may": Case(
        cluster=small_cluster(nodes=2, per_rack=1),
        submit=(make_job("big").gpus(16),),
        admits=("big",),
        says={"big": "placed in pod"},
    ),
    "an unknown GPU type is infeasible": Case(
        submit=(make_job("x").gpus(1).gpu_type("B200"),),
        waits={"x": PendingCode.INFEASIBLE},
        says={"x": "B200"},
    ),
    "a worker larger than any node is infeasible": Case(
        cluster=small_cluster(nodes=2),
        submit=(make_job("x").workers(1, gpus_per_worker=16),),
        waits={"x": PendingCode.INFEASIBLE},
    ),
    "cordoned nodes take no new work": Case(
        cluster=small_cluster(nodes=2),
        cordoned=("node-0",),
        submit=(make_job("a").gpus(8), make_job("b").gpus(8)),
        admits=("a",),
        on={"a": ("node-1",)},
    ),
    "a placement explains its score": Case(
        cluster=small_cluster(nodes=2),
        submit=(make_job("a").gpus(4),),
        says={"a": "placed in node node-0"},
    ),
}


@pytest.mark.parametrize("case", PLACEMENT.values(), ids=PLACEMENT.keys())
def test_placement(case: Case) -> None:
    plan = check(case)
    for admission in plan.admissions:  # the score says as much as the reason
        assert admission.placement.score["nodes"] == len(admission.placement.nodes)


def test_without_explaining_a_topology_failure_is_the_same_failure_without_details() -> None:
    # What a victim search and the simulator ask: only whether the gang fits, not where most fits.
    index = FreeIndex(small_cluster(nodes=2, per_rack=1))
    rack_bound = make_job("big").gpus(16).within(DomainLevel.RACK).build()
    explained = find_placement(index, rack_bound)
    terse = find_placement(index, rack_bound, explain=False)
    assert isinstance(explained, PlacementFailure) and isinstance(terse, PlacementFailure)
    assert explained.code is terse.code is PendingCode.TOPOLOGY
    assert "most: 8 in rack-0" in explained.message and "rack-0" not in terse.message
    fits = make_job("eight").gpus(8).build()
    assert find_placement(index, fits, explain=False) == find_placement(index, fits)


def test_tensor_parallel_groups_stay_in_one_nvlink_domain() -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=8, shape=NodeShape(nvlink_domain_size=4))
    index = FreeIndex(cluster)
    job = make_job("tp").workers(8).tensor(4).build()
    placement = find_placement(index, job)
    assert not isinstance(placement, PlacementFailure)
    assert sorted(slot.nvlink_domain for slot in placement.slots) == [0, 1]
    # One GPU busy in each NVLink domain: 6 GPUs free, but no domain holds a group of 4.
    index.allocate([Slot("node-0", 1, 0), Slot("node-0", 1, 1)])
    failure = find_placement(index, make_job("tp4").workers(4).tensor(4).build())
    assert isinstance(failure, PlacementFailure)
    assert failure.code is PendingCode.TOPOLOGY
    # Without tensor parallelism the same 4 GPUs may span the two domains.
    assert not isinstance(
        find_placement(index, make_job("dp").workers(4).build()), PlacementFailure
    )


def test_a_floating_slot_gives_its_gpus_back_to_the_domain_it_took_them_from() -> None:
    # One node of 4 GPUs in two NVLink domains of 2. Domain 0 is held by a pinned slot; a slot
    # that needs no domain (-1) takes a GPU of domain 1. When it ends, its GPU must go back to
    # domain 1: given to domain 0 (the fullest), a pinned 1-GPU slot could land on domain 0
    # and 3 GPUs would be pinned to a 2-GPU domain (what Hypothesis found).
    index = FreeIndex(make_cluster(nodes=1, gpus_per_node=4, shape=NodeShape(nvlink_domain_size=2)))
    node = index.nodes[0].name
    index.allocate([Slot(node, 2, 0)])
    floating = [Slot(node, 1, -1)]
    index.allocate(floating)
    assert index.nvlink_free[0] == [0, 1]
    index.release(floating)
    assert index.nvlink_free[0] == [0, 2]
    assert index.unit_capacity(0, 2, needs_nvlink=True) == 1
    with index.tentative():  # and a rolled-back round trip restores the split too
        index.allocate(floating)
        index.release(floating)
        index.allocate(floating)
    assert index.nvlink_free[0] == [0, 2] and index.nvlink_floating[0] == [0, 0]
