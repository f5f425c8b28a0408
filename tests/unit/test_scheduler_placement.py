"""Topology-aware gang placement."""

from aicluster.core import DomainLevel, NodeShape, PendingCode, Slot, make_cluster
from aicluster.scheduler import FreeIndex, PlacementFailure, find_placement
from builders import Driver, admitted, make_job, small_cluster


def test_small_jobs_best_fit_onto_partly_used_nodes() -> None:
    driver = Driver(small_cluster(nodes=2))
    driver.submit(make_job("six").gpus(6))
    driver.cycle()
    driver.submit(make_job("two").gpus(2))
    driver.cycle()
    assert driver.node_of("two") == driver.node_of("six")


def test_sixteen_gpu_job_lands_in_one_rack() -> None:
    # 3 racks of 2 nodes. Rack 0 keeps 4+4 free, rack 1 keeps 8+4 free, rack 2 is empty.
    driver = Driver(small_cluster(nodes=6, per_rack=2))
    driver.occupy("r0a", "node-0", 4)
    driver.occupy("r0b", "node-1", 4)
    driver.occupy("r1", "node-3", 4)
    driver.submit(make_job("big").gpus(16))
    plan = driver.cycle()
    assert admitted(plan) == ["big"]
    placement = plan.admissions[0].placement
    assert placement.level is DomainLevel.RACK
    assert placement.domain == "rack-2"
    assert placement.gpus_by_node() == {"node-4": 8, "node-5": 8}


def test_rack_bound_job_waits_with_a_topology_reason() -> None:
    # Two racks of one node each: 16 GPUs free in total but no rack holds 16.
    driver = Driver(small_cluster(nodes=2, per_rack=1))
    driver.submit(make_job("big").gpus(16).within(DomainLevel.RACK))
    plan = driver.cycle()
    assert admitted(plan) == []
    reason = plan.pending["big"]
    assert reason.code is PendingCode.TOPOLOGY
    assert "no rack fits 16 GPUs" in reason.message


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


def test_gang_spills_to_the_cluster_level_when_allowed() -> None:
    driver = Driver(small_cluster(nodes=2, per_rack=1))
    driver.submit(make_job("big").gpus(16))
    plan = driver.cycle()
    assert plan.admissions[0].placement.level is DomainLevel.POD


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


def test_unknown_gpu_type_is_infeasible() -> None:
    driver = Driver(small_cluster(nodes=1))
    driver.submit(make_job("x").gpus(1).gpu_type("B200"))
    plan = driver.cycle()
    assert plan.pending["x"].code is PendingCode.INFEASIBLE
    assert "B200" in plan.pending["x"].message


def test_worker_larger_than_any_node_is_infeasible() -> None:
    driver = Driver(small_cluster(nodes=2))
    driver.submit(make_job("x").workers(1, gpus_per_worker=16))
    plan = driver.cycle()
    assert plan.pending["x"].code is PendingCode.INFEASIBLE


def test_unschedulable_nodes_are_skipped() -> None:
    driver = Driver(small_cluster(nodes=2))
    driver.state.set_node_schedulable("node-0", False)
    driver.submit(make_job("a").gpus(8), make_job("b").gpus(8))
    plan = driver.cycle()
    assert admitted(plan) == ["a"]
    assert driver.node_of("a") == ("node-1",)


def test_placement_explains_its_score() -> None:
    driver = Driver(small_cluster(nodes=2))
    driver.submit(make_job("a").gpus(4))
    plan = driver.cycle()
    assert plan.admissions[0].reason.startswith("placed in node node-0")
    assert plan.admissions[0].placement.score["nodes"] == 1


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
