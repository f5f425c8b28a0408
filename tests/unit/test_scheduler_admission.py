"""Admission: quotas per GPU type, borrowing, the power cap, elastic sizes. One table of named
cases (add a row), then the cases that take more than one cycle."""

from dataclasses import replace

import pytest

from aicluster.core import PendingCode, Tenant
from aicluster.core.topology import PowerBudget
from builders import Case, Driver, admitted, check, make_job, small_cluster

TWO_NODES = small_cluster(nodes=2)

ADMISSION = {
    "borrowing uses idle quota up to the limit": Case(
        cluster=TWO_NODES,
        tenants={
            "a": Tenant("a", quota={"H100": 8}, borrow_limit={"H100": 4}),
            "b": Tenant("b", quota={"H100": 8}),
        },
        submit=tuple(make_job(f"a{i}").gpus(1).tenant("a").at(i) for i in range(14)),
        admits=tuple(f"a{i}" for i in range(12)),  # 8 of its own quota + 4 borrowed
        borrowed=4,
        waits={"a12": PendingCode.BORROW_LIMIT},
        says={"a12": "may borrow 4"},
    ),
    "no borrowing means over quota": Case(
        tenants={"a": Tenant("a", quota={"H100": 2}, borrow_limit={"H100": 0})},
        submit=(make_job("x").gpus(4).tenant("a"),),
        admits=(),
        waits={"x": PendingCode.OVER_QUOTA},
        says={"x": "uses 0 of 2 H100 GPUs"},
    ),
    "a cluster's power budget refuses what would exceed it": Case(
        # 2 nodes × 8 GPUs at 60 W idle, 300 W busy: 960 W idle in all; a busy GPU adds 240 W.
        cluster=replace(TWO_NODES, budgets=(PowerBudget("cluster", None, 960 + 240 * 10),)),
        submit=(make_job("a").gpus(8), make_job("b").gpus(4)),
        admits=("a",),
        waits={"b": PendingCode.POWER_CAP},
        says={"b": "power budget cluster: 2.9 of 3.4 kW; starting it would draw 3.8 kW"},
    ),
    "an elastic job starts smaller when the cluster is short": Case(
        cluster=TWO_NODES,
        running=(make_job("busy").gpus(8),),
        submit=(make_job("elastic").workers(4, gpus_per_worker=4)._with(min_workers=2),),
        admits=("elastic",),
        says={"elastic": "elastic: 2 of 4 workers"},
        used={"default": 8 + 8},
    ),
    "an elastic job never goes below its minimum": Case(
        running=(make_job("busy").gpus(6),),
        submit=(make_job("elastic").workers(4, gpus_per_worker=2)._with(min_workers=2),),
        admits=(),
    ),
    "every job left waiting has a reason": Case(
        submit=tuple(make_job(f"j{i}").gpus(8).at(i) for i in range(5)),
        admits=("j0",),
        says={f"j{i}": " " for i in range(1, 5)},
    ),
}


@pytest.mark.parametrize("case", ADMISSION.values(), ids=ADMISSION.keys())
def test_admission(case: Case) -> None:
    check(case)


def test_reclaims_in_one_cycle_stop_at_the_owners_quota() -> None:
    """Two of b's waiting jobs could each reclaim within b's quota, but not both: the second
    would put b over quota, and a would reclaim it back next cycle, forever."""
    tenants = {name: Tenant(name, quota={"H100": 8}, borrow_limit={"H100": 8}) for name in "ab"}
    driver = Driver(small_cluster(nodes=2), tenants)
    driver.submit(*(make_job(f"a{i}").gpus(8).tenant("a").at(i) for i in range(2)))
    driver.cycle()
    driver.submit(*(make_job(f"b{i}").gpus(8).tenant("b").at(10 + i) for i in range(2)))
    plans = [driver.cycle(at=20.0 + n) for n in range(4)]
    assert [len(plan.preemptions) for plan in plans] == [1, 0, 0, 0]
    assert driver.state.used("a", "H100") == driver.state.used("b", "H100") == 8


def test_an_elastic_job_is_requeued_at_full_size() -> None:
    driver = Driver(small_cluster(nodes=2))
    driver.occupy("busy", "node-0", 8)
    driver.submit(make_job("elastic").workers(4, gpus_per_worker=4)._with(min_workers=2))
    assert admitted(driver.cycle()) == ["elastic"]
    running = driver.state.running["elastic"]
    assert running.job.workers == 2 and running.requested.workers == 4
    driver.state.stop("elastic", 10, requeue=True)
    assert driver.state.pending["elastic"].job.workers == 4
