"""Anti-thrashing (scheduler/protection.py): the minimum run time, the cool-down after a
preemption, Tiresias' promotion guard, and the bound on how long protections hold a job back;
the same in the simulator. One table of named cases: add a row."""

from __future__ import annotations

import math
from typing import Any

import pytest

from aicluster.control.loop.progress import progress_from_json, progress_to_json
from aicluster.core import Job, Tenant, VictimKind, make_cluster
from aicluster.scheduler import Progress, SchedulerConfig, make_state, schedule
from aicluster.sim import SimConfig, simulate
from aicluster.sim.trace_job import TraceJob
from builders import Case, Driver, admitted, check, make_job, small_cluster
from builders import preempted as preempted_ids

QUOTAS = {"a": Tenant("a", quota={"H100": 8}), "b": Tenant("b", quota={"H100": 8})}
# Tenant b fills two nodes with 1-GPU jobs, started at 0 to 15 s: 8 in quota, 8 borrowed.
B_FILLS_TWO_NODES = tuple(make_job(f"b{i}").gpus(1).tenant("b").at(i) for i in range(16))
PROTECT = {"min_runtime_s": 600.0, "cooldown_s": 300.0}
TIRESIAS = {**PROTECT, "queue": "tiresias", "tiresias_thresholds": (800.0,)}
LOW_B = make_job("low").gpus(8).tenant("b").priority(100)
URGENT_A = make_job("urgent").gpus(8).tenant("a").priority(300)


def _reclaim_at(at: float, **outcome: Any) -> Case:
    """Tenant a asks for its 8 GPUs of quota at ``at``, b borrowing them since 8 to 15 s."""
    owner = make_job("owner").gpus(8).tenant("a").at(at)
    cluster, running = small_cluster(nodes=2), B_FILLS_TWO_NODES
    return Case(
        config=PROTECT,
        cluster=cluster,
        tenants=QUOTAS,
        running=running,
        submit=(owner,),
        at=at,
        **outcome,
    )


PROTECTION = {
    "another tenant's priority waits for the minimum run time": Case(
        config=PROTECT,
        running=(LOW_B,),
        submit=(URGENT_A.at(240),),
        at=240,
        preempts=(),
        says={"urgent": "protected: job low ran 4 min of its 10 min minimum"},
    ),
    "another tenant's priority preempts once the minimum is over": Case(
        config=PROTECT,
        running=(LOW_B,),
        submit=(URGENT_A.at(600),),
        at=600,
        preempts=("low",),
        kind=VictimKind.PRIORITY,
    ),
    "its own tenant's priority is not held back by the minimum": Case(
        config=PROTECT,
        running=(make_job("low").gpus(8).tenant("a").priority(100),),
        submit=(URGENT_A.at(240),),
        at=240,
        preempts=("low",),
    ),
    "reclaim waits for the minimum run time": _reclaim_at(
        100,
        preempts=(),
        says={"owner": "protected: job b8 ran 92 s of its 10 min minimum (and 7 more"},
    ),
    "reclaim takes its quota back once the minimum is over": _reclaim_at(
        615, victims=8, kind=VictimKind.RECLAIM
    ),
    "tiresias' right waits for the minimum run time": Case(
        config=TIRESIAS,
        running=(make_job("long").gpus(8),),
        submit=(make_job("new").gpus(8).at(300),),  # long: 2,400 GPU-s, queue 1
        at=300,
        preempts=(),
        says={"new": "protected: job long ran 5 min of its 10 min minimum"},
    ),
    "tiresias' right preempts once the minimum is over": Case(
        config=TIRESIAS,
        running=(make_job("long").gpus(8),),
        submit=(make_job("new").gpus(8).at(600),),
        at=600,
        preempts=("long",),
        kind=VictimKind.POLICY,
    ),
    "with both at 0 the preemption is at once": Case(
        config={"min_runtime_s": 0.0, "cooldown_s": 0.0},
        running=(LOW_B,),
        submit=(URGENT_A.at(1),),
        at=1,
        preempts=("low",),
    ),
}


@pytest.mark.parametrize("case", PROTECTION.values(), ids=PROTECTION.keys())
def test_protection(case: Case) -> None:
    check(case)


def _preempted_once(driver: Driver) -> None:
    """``low`` (tenant a) is preempted at 0 by its own tenant's ``mid`` and restarts at 10."""
    driver.submit(make_job("low").gpus(8).tenant("a").priority(100))
    assert admitted(driver.cycle(at=0.0)) == ["low"]
    driver.submit(make_job("mid").gpus(8).tenant("a").priority(200))
    assert preempted_ids(driver.cycle(at=0.0)) == ["low"]
    driver.finish("mid", at=10.0)
    assert admitted(driver.cycle(at=10.0)) == ["low"]
    assert driver.state.running["low"].preempted_at == 0.0


def test_the_cool_down_holds_back_even_its_own_tenants_priority() -> None:
    driver = Driver(small_cluster(nodes=1), **PROTECT)
    _preempted_once(driver)
    driver.submit(URGENT_A.at(100))
    plan = driver.cycle(at=100.0)
    assert preempted_ids(plan) == []
    message = plan.reason_for("urgent").message  # type: ignore[union-attr]
    assert "protected: job low ran 90 s of its 5 min cool-down after a preemption" in message
    assert plan.protected_until == plan.next_wakeup == 310.0  # a cycle again when it lapses
    assert preempted_ids(driver.cycle(at=310.0)) == ["low"]


def test_a_waiting_job_waits_at_most_the_minimum_for_protections_to_lapse() -> None:
    """The bound: protected victims that started before a job arrived all lapse within
    max(min_runtime_s, cooldown_s) of its arrival, and each plan says when the next lapses."""
    driver = Driver(small_cluster(nodes=1), **PROTECT)
    for i in range(4):
        driver.submit(make_job(f"b{i}").gpus(2).tenant("b").priority(100).at(i * 50.0))
        assert admitted(driver.cycle(at=i * 50.0)) == [f"b{i}"]
    driver.submit(URGENT_A.at(200.0))
    now = 200.0
    plan = driver.cycle(at=now)
    while "urgent" not in driver.state.running:  # from wakeup to wakeup, nothing else happening
        wakeup = plan.next_wakeup
        assert wakeup is not None and wakeup > now
        now = wakeup
        plan = driver.cycle(at=now)
    assert now - 200.0 <= PROTECT["min_runtime_s"]
    assert now == 150.0 + 600.0  # when the youngest victim's minimum ends


def test_the_simulator_holds_the_same_minimum() -> None:
    """Live and simulated alike: the same scheduler, from the same config, in the simulator."""
    cluster = make_cluster(nodes=1, gpus_per_node=8)
    jobs = [
        TraceJob("low", 0.0, 5000.0, 8, "b", 100),
        TraceJob("urgent", 100.0, 100.0, 8, "a", 300),
    ]
    starts = {}
    for minimum in (600.0, 0.0):
        scheduler = SchedulerConfig(queue="priority", min_runtime_s=minimum, cooldown_s=0.0)
        result = simulate(cluster, jobs, scheduler=scheduler, config=SimConfig(failures=False))
        starts[minimum] = result.jobs.start[1]
    assert starts == {600.0: 600.0, 0.0: 100.0}


def test_tiresias_promotion_counts_the_last_run_as_at_least_the_minimum() -> None:
    config = SchedulerConfig(
        queue="tiresias", tiresias_thresholds=(100.0,), tiresias_promote_knob=2, explain=False
    )
    state = make_state(make_cluster(nodes=1, gpus_per_node=1), config=config)
    # Stopped after 10 s (its own tenant's priority, or a failure): without the guard it
    # would be promoted after 2 x 10 s and preempt jobs that have run far longer.
    state.submit(Job(id="j", tenant="t"), 50.0, progress=Progress(200.0, 10.0, 10.0, 1))
    assert state.policy.rekey_at(state.pending["j"]) == 50.0 + 2 * 600.0
    state.refresh(50.0 + 2 * 10.0)
    assert state.pending["j"].key[0] == 1  # not promoted yet
    state.refresh(50.0 + 2 * 600.0)
    assert state.pending["j"].key[0] == 0


def test_the_preemption_time_survives_the_store() -> None:
    """Live, a job's last preemption travels with its stored progress (a restarted control
    plane keeps the cool-down); absent, it was never preempted."""
    kept = progress_from_json(progress_to_json(Progress(1.0, 2.0, 3.0, 1, 42.5), 50.0))
    assert kept is not None and kept[0].preempted_at == 42.5
    never = progress_from_json(progress_to_json(Progress(1.0, 2.0, 3.0, 1), 50.0))
    assert never is not None and never[0].preempted_at == -math.inf


def test_a_cycle_that_finds_victims_protected_changes_nothing() -> None:
    """The cycle stays pure with protections (its note lists candidates, searches nothing)."""
    driver = Driver(small_cluster(nodes=1), **PROTECT)
    driver.submit(LOW_B)
    driver.cycle(at=0.0)
    driver.submit(URGENT_A.at(240))
    before = driver.state.digest()
    plan = schedule(driver.state.snapshot(240.0))
    assert plan.preemptions == [] and driver.state.digest() == before
