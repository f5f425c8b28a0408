"""CPUs and memory as placed resources: jobs without GPUs, per-node room, caps per tenant."""

from dataclasses import dataclass

import pytest

from aicluster.core import Cluster, Node, PendingCode, Tenant
from aicluster.scheduler import FreeIndex, find_placement
from aicluster.scheduler.placement import PlacementFailure
from builders import Driver, JobBuilder, admitted, make_job, small_cluster


def mixed_cluster() -> Cluster:
    """Two 8-GPU nodes with 16 CPUs and 64 GB, and one CPU node (no GPU) with 32 CPUs, 128 GB."""
    nodes = (
        Node("gpu-0", 8, "H100", "rack-0", "pod-0", cpus=16, memory_gb=64),
        Node("gpu-1", 8, "H100", "rack-0", "pod-0", cpus=16, memory_gb=64),
        Node("cpu-0", 0, "none", "rack-1", "pod-0", cpus=32, memory_gb=128),
    )
    return Cluster("mixed", nodes)


def test_a_job_without_gpus_goes_where_it_strands_no_gpu() -> None:
    driver = Driver(mixed_cluster())
    driver.submit(make_job("etl").workers(2, gpus_per_worker=0).host(cpus=4, memory_gb=8))
    plan = driver.cycle()
    assert admitted(plan) == ["etl"]
    assert driver.node_of("etl") == ("cpu-0",)
    slots = driver.state.running["etl"].placement.slots
    assert [(s.gpus, s.cpus, s.memory_gb) for s in slots] == [(0, 4.0, 8.0)] * 2


def test_a_job_without_gpus_prefers_a_full_gpu_node_to_an_idle_one() -> None:
    cluster = small_cluster(nodes=2, gpus=8, cpus=16, memory_gb=64)
    driver = Driver(cluster)
    driver.occupy("busy", "node-1", 8)
    driver.submit(make_job("etl").workers(1, gpus_per_worker=0).host(cpus=2))
    driver.cycle()
    assert driver.node_of("etl") == ("node-1",)


def test_gpus_fit_but_cpus_do_not_so_the_unit_goes_to_another_node() -> None:
    cluster = small_cluster(nodes=2, gpus=8, cpus=16, memory_gb=64)
    driver = Driver(cluster)
    driver.submit(make_job("cpu-heavy").workers(1, gpus_per_worker=1).host(cpus=14))
    driver.cycle()
    first = driver.node_of("cpu-heavy")
    driver.submit(make_job("next").workers(1, gpus_per_worker=1).host(cpus=4))
    driver.cycle()
    assert driver.node_of("next") != first  # 7 GPUs free there, but only 2 CPUs


@dataclass(frozen=True)
class Refusal:
    """A job the placement search refuses at once on an empty cluster, and what it says."""

    job: JobBuilder
    code: PendingCode
    says: str


# One table of named cases for the refusals of the placement extension point: add a row.
REFUSALS = {
    "more CPUs than any node": Refusal(
        make_job("big").workers(1, 1).host(cpus=20),
        PendingCode.INFEASIBLE,
        "a worker needs 20 CPUs on one node; the largest node has 16",
    ),
    "more CPUs than any node, no GPU": Refusal(
        make_job("huge").workers(1, gpus_per_worker=0).host(cpus=40),
        PendingCode.INFEASIBLE,
        "a worker needs 40 CPUs on one node; the largest node has 32",
    ),
    "more memory than any node": Refusal(
        make_job("big").workers(1, 1).host(memory_gb=100),
        PendingCode.INFEASIBLE,
        "100 GB of memory on one node; the largest node has 64",
    ),
    "a tensor-parallel group's CPUs together": Refusal(
        make_job("tp").workers(2, 1).tensor(2).host(cpus=10),
        PendingCode.INFEASIBLE,
        "a tensor-parallel group needs 20 CPUs on one node; the largest node has 16",
    ),
    "more CPUs than the cluster has free": Refusal(
        make_job("wide").workers(6, 1).host(cpus=12),
        PendingCode.NO_CAPACITY,
        "needs 72 CPUs, 64 free",
    ),
    "nothing at all": Refusal(
        make_job("nothing").workers(1, gpus_per_worker=0),
        PendingCode.INFEASIBLE,
        "a job must ask for GPUs, CPUs or memory",
    ),
}


@pytest.mark.parametrize("case", REFUSALS.values(), ids=REFUSALS.keys())
def test_the_placement_search_refuses_and_names_the_resource(case: Refusal) -> None:
    found = find_placement(FreeIndex(mixed_cluster()), case.job.build())
    assert isinstance(found, PlacementFailure)
    assert found.code is case.code
    assert case.says in found.message, found.message


def test_a_job_waiting_for_cpus_says_cpus() -> None:
    cluster = small_cluster(nodes=2, gpus=8, cpus=8, memory_gb=64)
    driver = Driver(cluster)
    driver.submit(*(make_job(f"a{i}").workers(1, 1).host(cpus=6).at(i) for i in range(3)))
    plan = driver.cycle()
    assert len(admitted(plan)) == 2
    reason = plan.pending["a2"]
    assert reason.code is PendingCode.NO_CAPACITY
    assert "CPUs" in reason.message and "GPU" not in reason.message
    driver.finish("a0")
    assert admitted(driver.cycle()) == ["a2"]


def test_a_job_waiting_for_memory_says_memory() -> None:
    cluster = small_cluster(nodes=2, gpus=8, cpus=64, memory_gb=16)
    driver = Driver(cluster)
    driver.submit(*(make_job(f"m{i}").workers(1, 1).host(memory_gb=10).at(i) for i in range(3)))
    plan = driver.cycle()
    assert "GB of memory" in plan.pending["m2"].message


def test_a_cpu_cap_holds_and_frees_with_the_tenants_own_jobs() -> None:
    tenants = {"a": Tenant("a", cpu_quota=8.0), "b": Tenant("b")}
    driver = Driver(small_cluster(nodes=2, cpus=64), tenants)
    driver.submit(
        *(make_job(f"a{i}").tenant("a").workers(1, 1).host(cpus=3).at(i) for i in range(3))
    )
    driver.submit(make_job("b0").tenant("b").workers(1, 1).host(cpus=30).at(5))
    plan = driver.cycle()
    assert sorted(admitted(plan)) == ["a0", "a1", "b0"]
    reason = plan.pending["a2"]
    assert reason.code is PendingCode.OVER_QUOTA
    assert "uses 6 of 8 CPUs and the job needs 3" in reason.message
    driver.finish("b0")  # another tenant's job ending frees nothing under a's cap
    assert admitted(driver.cycle()) == []
    driver.finish("a0")
    assert admitted(driver.cycle()) == ["a2"]


def test_a_memory_cap_holds() -> None:
    tenants = {"a": Tenant("a", memory_quota_gb=10.0)}
    driver = Driver(small_cluster(nodes=1), tenants)
    driver.submit(
        *(make_job(f"a{i}").tenant("a").workers(1, 1).host(memory_gb=4).at(i) for i in range(3))
    )
    plan = driver.cycle()
    assert len(admitted(plan)) == 2
    assert "GB of memory" in plan.pending["a2"].message


def test_tentative_allocations_give_cpus_and_memory_back_exactly() -> None:
    index = FreeIndex(small_cluster(nodes=2, cpus=16, memory_gb=64))
    before = index.digest()
    job = make_job("x").workers(3, 1).host(cpus=0.1, memory_gb=0.3).build()
    with index.tentative():
        found = find_placement(index, job)
        index.allocate(found.slots)  # type: ignore[union-attr]
        assert index.free_millicpus_total == 32000 - 300
    assert index.digest() == before


def test_workers_without_gpus_spread_inside_one_rack_when_asked() -> None:
    from aicluster.core import DomainLevel

    cluster = small_cluster(nodes=4, gpus=8, per_rack=2, cpus=8, memory_gb=64)
    driver = Driver(cluster)
    driver.submit(
        make_job("spread").workers(4, gpus_per_worker=0).host(cpus=4).within(DomainLevel.RACK)
    )
    driver.cycle()
    nodes = driver.node_of("spread")
    assert len(nodes) == 2
    racks = {n.rack for n in cluster.nodes if n.name in nodes}
    assert len(racks) == 1


def test_cpus_and_memory_in_proportion_to_gpus_are_not_searched() -> None:
    """The shortcut of ``FreeIndex.host_binds``: a GPU job asking no more CPUs and memory per
    GPU than any node has needs no CPU test while no slot is heavier than its node (here 2 CPUs
    and 8 GB per GPU); a heavier job, a heavier slot held (a CPU-only one), or the shortcuts
    switched off bring the tests back, and a tentative allocation's rollback restores the count."""
    index = FreeIndex(small_cluster(nodes=2, gpus=8, cpus=16, memory_gb=64))
    light = make_job("light").workers(2, 4).host(cpus=8, memory_gb=32).build()
    heavy = make_job("heavy").workers(1, 1).host(cpus=3).build()
    cpu_only = make_job("etl").workers(1, gpus_per_worker=0).host(cpus=1).build()
    assert (index.host_binds(light), index.host_binds(heavy)) == (False, True)
    with index.tentative():
        index.allocate(find_placement(index, cpu_only).slots)  # type: ignore[union-attr]
        assert index.host_heavy_slots == 1 and index.host_binds(light)
    assert index.host_heavy_slots == 0 and not index.host_binds(light)
    index.host_shortcut = False
    assert index.host_binds(light)


def test_a_heavy_slot_held_brings_the_cpu_test_back() -> None:
    """With a heavy job holding most of a node's CPUs, a light job must go where CPUs are."""
    driver = Driver(small_cluster(nodes=2, gpus=8, cpus=16, memory_gb=64))
    driver.submit(make_job("heavy").workers(1, 1).host(cpus=15))
    driver.cycle()
    taken = driver.node_of("heavy")
    driver.submit(make_job("light").workers(1, 2).host(cpus=2))
    driver.cycle()
    assert driver.node_of("light") != taken  # 7 GPUs free there, but 1 CPU
