"""Quotas, borrowing, reclaim, priority preemption, backfill and power: hand-worked cases."""

from aicluster.core import PendingCode, Tenant
from builders import Driver, admitted, make_job, preempted, small_cluster

QUOTAS = {
    "a": Tenant("a", quota={"H100": 8}),
    "b": Tenant("b", quota={"H100": 8}),
}


def test_borrowing_uses_idle_quota_up_to_the_limit() -> None:
    tenants = {
        "a": Tenant("a", quota={"H100": 8}, borrow_limit={"H100": 4}),
        "b": Tenant("b", quota={"H100": 8}),
    }
    driver = Driver(small_cluster(nodes=2), tenants)
    driver.submit(*(make_job(f"a{i}").gpus(1).tenant("a").at(i) for i in range(14)))
    plan = driver.cycle()
    assert len(plan.admissions) == 12  # 8 of its own quota + 4 borrowed
    assert sum(admit.borrowed for admit in plan.admissions) == 4
    reason = plan.pending["a12"]
    assert reason.code is PendingCode.BORROW_LIMIT
    assert "may borrow 4" in reason.message


def test_no_borrowing_means_over_quota() -> None:
    tenants = {"a": Tenant("a", quota={"H100": 2}, borrow_limit={"H100": 0})}
    driver = Driver(small_cluster(nodes=1), tenants)
    driver.submit(make_job("x").gpus(4).tenant("a"))
    plan = driver.cycle()
    assert plan.pending["x"].code is PendingCode.OVER_QUOTA
    assert "uses 0 of 2 H100 GPUs" in plan.pending["x"].message


def test_reclaim_frees_exactly_the_owners_quota() -> None:
    driver = Driver(small_cluster(nodes=2), QUOTAS)
    # Tenant b fills all 16 GPUs with 1-GPU jobs: 8 in quota, 8 borrowed from a.
    for i in range(16):
        driver.now = float(i)
        driver.submit(make_job(f"b{i}").gpus(1).tenant("b").at(i))
        driver.cycle()
    assert len(driver.state.running) == 16
    driver.now = 100.0
    driver.submit(make_job("owner").gpus(8).tenant("a").at(100))
    plan = driver.cycle()
    assert admitted(plan) == ["owner"]
    victims = preempted(plan)
    assert len(victims) == 8
    assert all(p.kind == "reclaim" and p.for_job == "owner" for p in plan.preemptions)
    # b is back at exactly its quota; a has exactly its own.
    assert driver.state.used("b", "H100") == 8
    assert driver.state.used("a", "H100") == 8


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


def test_reclaim_takes_the_fewest_victims_on_one_node() -> None:
    driver = Driver(small_cluster(nodes=2), QUOTAS)
    for i in range(16):
        driver.now = float(i)
        driver.submit(make_job(f"b{i}").gpus(1).tenant("b").at(i))
        driver.cycle()
    node_of = {job_id: driver.node_of(job_id)[0] for job_id in driver.state.running}
    driver.now = 100.0
    driver.submit(make_job("owner").gpus(4).tenant("a").at(100))
    plan = driver.cycle()
    assert admitted(plan) == ["owner"]
    assert len(plan.preemptions) == 4
    (node,) = plan.admissions[0].placement.nodes
    assert {node_of[victim] for victim in preempted(plan)} == {node}


def test_in_quota_jobs_of_others_are_never_reclaimed() -> None:
    driver = Driver(small_cluster(nodes=1), QUOTAS)
    driver.submit(*(make_job(f"b{i}").gpus(1).tenant("b") for i in range(8)))
    driver.cycle()
    driver.submit(make_job("a-big").gpus(8).tenant("a").priority(400))
    plan = driver.cycle()
    assert plan.preemptions == []
    assert plan.pending["a-big"].code is PendingCode.NO_CAPACITY


def test_priority_preemption_within_a_tenant_takes_lowest_priority_victims() -> None:
    driver = Driver(small_cluster(nodes=1))
    driver.submit(make_job("low").gpus(4).priority(100), make_job("mid").gpus(4).priority(200))
    driver.cycle()
    driver.submit(make_job("urgent").gpus(4).priority(300))
    plan = driver.cycle()
    assert preempted(plan) == ["low"]
    assert plan.preemptions[0].kind == "priority"
    assert admitted(plan) == ["urgent"]


def test_preemption_prefers_the_most_recently_checkpointed_victim() -> None:
    driver = Driver(small_cluster(nodes=1))
    driver.submit(make_job("stale").gpus(4).priority(100))
    driver.cycle(at=0)
    driver.submit(make_job("fresh").gpus(4).priority(100))
    driver.cycle(at=10)
    driver.state.checkpointed("fresh", 95)
    driver.state.checkpointed("stale", 50)
    driver.submit(make_job("urgent").gpus(4).priority(300))
    plan = driver.cycle(at=100)
    assert preempted(plan) == ["fresh"]  # loses 5 s of work; "stale" would lose 50 s


def test_non_preemptible_jobs_are_never_victims() -> None:
    driver = Driver(small_cluster(nodes=1))
    driver.submit(make_job("keep").gpus(8).priority(100).not_preemptible())
    driver.cycle()
    driver.submit(make_job("urgent").gpus(8).priority(300))
    assert driver.cycle().preemptions == []


def test_backfill_never_delays_the_reserved_head() -> None:
    # Two nodes. "wide" (8 GPUs, ends at 100) and "half" (4 GPUs, ends at 50) are running.
    driver = Driver(small_cluster(nodes=2, per_rack=2))
    driver.occupy("wide", "node-0", 8, duration_estimate=100)
    driver.occupy("half", "node-1", 4, duration_estimate=50)
    driver.submit(
        make_job("head").gpus(16).at(1),  # needs both nodes: reserved from t=100
        make_job("slow").gpus(4).at(2).estimate(200),  # would end at 200 > 100: must wait
        make_job("quick").gpus(4).at(3).estimate(60),  # ends at 60 <= 100: may backfill
        make_job("unknown").gpus(2).at(2.5),  # no estimate: may not touch reserved nodes
    )
    plan = driver.cycle(at=0)
    assert admitted(plan) == ["quick"]
    assert plan.admissions[0].backfilled
    assert plan.pending["head"].message.startswith("head of the queue")
    slow = plan.pending["slow"]
    assert slow.code is PendingCode.RESERVATION and slow.blocking_job == "head"
    assert "expected at t=100" in slow.message
    assert plan.pending["unknown"].code is PendingCode.RESERVATION
    assert "no duration estimate" in plan.pending["unknown"].message


def test_backfill_uses_capacity_outside_the_reservation() -> None:
    # Three nodes in one rack; the head needs two whole nodes, the third node is free to use.
    driver = Driver(small_cluster(nodes=3, per_rack=3))
    driver.occupy("x", "node-0", 4)
    driver.occupy("y", "node-1", 4)
    driver.occupy("z", "node-2", 6)
    driver.submit(make_job("head").gpus(16).at(1), make_job("small").gpus(2).at(2))
    plan = driver.cycle()
    assert admitted(plan) == ["small"]
    assert driver.node_of("small") == ("node-2",)


def test_without_backfill_nothing_passes_a_blocked_head() -> None:
    driver = Driver(small_cluster(nodes=1), backfill="none")
    driver.occupy("busy", "node-0", 4)
    driver.submit(make_job("head").gpus(8).at(1), make_job("small").gpus(1).at(2))
    plan = driver.cycle()
    assert admitted(plan) == []
    assert plan.reason_for("small") is not None
    assert plan.reason_for("small").code is PendingCode.QUEUE_ORDER  # type: ignore[union-attr]


def test_every_pending_job_has_a_reason() -> None:
    driver = Driver(small_cluster(nodes=1))
    driver.submit(*(make_job(f"j{i}").gpus(8).at(i) for i in range(5)))
    plan = driver.cycle()
    assert admitted(plan) == ["j0"]
    assert set(plan.pending) == {"j1", "j2", "j3", "j4"}
    assert all(reason.message for reason in plan.pending.values())


def test_power_cap_refuses_admissions_that_would_exceed_it() -> None:
    # 2 nodes × 8 GPUs at 60 W idle, 300 W busy: 960 W idle in all; each busy GPU adds 240 W.
    driver = Driver(small_cluster(nodes=2), power_cap_watts=960 + 240 * 10)
    driver.submit(make_job("a").gpus(8), make_job("b").gpus(4))
    plan = driver.cycle()
    assert admitted(plan) == ["a"]
    assert plan.pending["b"].code is PendingCode.POWER_CAP


def test_energy_aware_prefers_powered_nodes_and_powers_idle_ones_off() -> None:
    driver = Driver(small_cluster(nodes=2), energy_aware=True)
    assert driver.state.index.watts == 0  # idle nodes are off
    driver.submit(make_job("a").gpus(2))
    driver.cycle()
    driver.submit(make_job("b").gpus(2))
    driver.cycle()
    assert driver.node_of("a") == driver.node_of("b")
    assert driver.state.index.watts == 8 * 60 + 4 * 240


def test_an_elastic_job_starts_smaller_and_is_requeued_at_full_size() -> None:
    driver = Driver(small_cluster(nodes=2))
    driver.occupy("busy", "node-0", 8)
    driver.submit(make_job("elastic").workers(4, gpus_per_worker=4)._with(min_workers=2))
    plan = driver.cycle()
    assert admitted(plan) == ["elastic"] and plan.admissions[0].workers == 2
    assert "elastic: 2 of 4 workers" in plan.admissions[0].reason
    running = driver.state.running["elastic"]
    assert running.job.workers == 2 and running.requested.workers == 4
    assert driver.state.used("default", "H100") == 8 + 8
    driver.state.stop("elastic", 10, requeue=True)
    assert driver.state.pending["elastic"].job.workers == 4


def test_an_elastic_job_never_goes_below_its_minimum() -> None:
    driver = Driver(small_cluster(nodes=1))
    driver.occupy("busy", "node-0", 6)
    driver.submit(make_job("elastic").workers(4, gpus_per_worker=2)._with(min_workers=2))
    assert admitted(driver.cycle()) == []
