"""Queue order: which job each policy starts first. One table of named cases (add a row): jobs
that each need the whole node, run to completion one after another."""

from dataclasses import dataclass, field

import pytest

from aicluster.core import Tenant
from aicluster.scheduler import SchedulerConfig, make_state, names, schedule
from builders import Case, Driver, JobBuilder, admitted, check, make_job, small_cluster


@dataclass(frozen=True)
class Order:
    """Jobs submitted together on one node, each as large as the node, and the order in which
    ``policy`` runs them to completion."""

    policy: str
    jobs: tuple[JobBuilder, ...]
    runs: tuple[str, ...]
    config: dict[str, object] = field(default_factory=dict)


# Submitted long, medium, short; each needs the whole 8-GPU node.
THREE_JOBS = (
    make_job("long").gpus(8).at(0).duration(300),
    make_job("medium").gpus(8).at(1).duration(200),
    make_job("short").gpus(8).at(2).duration(100),
)

ORDER = {
    "fifo: submission order": Order("fifo", THREE_JOBS, ("long", "medium", "short")),
    "sjf: shortest first": Order("sjf", THREE_JOBS, ("short", "medium", "long")),
    "srtf: least time left first": Order("srtf", THREE_JOBS, ("short", "medium", "long")),
    "priority: highest first, then arrival": Order(
        "priority",
        (
            make_job("a").gpus(8).at(0).priority(100).duration(10),
            make_job("b").gpus(8).at(1).priority(300).duration(10),
            make_job("c").gpus(8).at(2).priority(300).duration(10),
        ),
        ("b", "c", "a"),
        {"preemption": False},
    ),
    "tiresias: least attained service, then arrival": Order(
        "tiresias", THREE_JOBS, ("long", "medium", "short")
    ),
}


def run_to_completion(order: Order) -> list[tuple[str, float]]:
    """Each job and when it completed, in the order they completed."""
    driver = Driver(small_cluster(nodes=1), queue=order.policy, **order.config)
    driver.submit(*order.jobs)
    done: list[tuple[str, float]] = []
    now = max(job.build().submit_time for job in order.jobs)
    driver.cycle(at=now)
    while driver.state.running:
        (job_id, entry), *_ = driver.state.running.items()
        now = entry.started_at + (entry.job.true_duration or 0)
        driver.finish(job_id, at=now)
        done.append((job_id, now))
        driver.cycle(at=now)
    return done


@pytest.mark.parametrize("order", ORDER.values(), ids=ORDER.keys())
def test_queue_order(order: Order) -> None:
    assert tuple(job_id for job_id, _ in run_to_completion(order)) == order.runs


def test_sjf_lowers_the_mean_completion_time_by_the_hand_worked_amount() -> None:
    submitted = {"long": 0, "medium": 1, "short": 2}

    def mean(order: Order) -> float:
        return sum(at - submitted[job] for job, at in run_to_completion(order)) / 3

    assert mean(ORDER["fifo: submission order"]) == ((302 - 0) + (502 - 1) + (602 - 2)) / 3
    assert mean(ORDER["sjf: shortest first"]) == ((102 - 2) + (302 - 1) + (602 - 0)) / 3


# Tenants a and b submit eight 1-GPU jobs each, alternating.
EIGHT_ONE_GPU_JOBS_EACH = tuple(
    make_job(f"{tenant}{i}").gpus(1).tenant(tenant).at(i + offset)
    for i in range(8)
    for tenant, offset in (("a", 0.0), ("b", 0.5))
)

FAIR = {
    "fair: weighted shares of one node": Case(
        # Weighted DRF on 8 GPUs: b (weight 3) ends with 6, a with 2.
        tenants={"a": Tenant("a", weight=1.0), "b": Tenant("b", weight=3.0)},
        config={"queue": "fair"},
        submit=EIGHT_ONE_GPU_JOBS_EACH,
        used={"a": 2, "b": 6},
    ),
    "fair: equal weights take equal shares": Case(
        tenants={"a": Tenant("a"), "b": Tenant("b")},
        config={"queue": "fair"},
        submit=EIGHT_ONE_GPU_JOBS_EACH,
        used={"a": 4, "b": 4},
    ),
}


@pytest.mark.parametrize("case", FAIR.values(), ids=FAIR.keys())
def test_fair_share(case: Case) -> None:
    check(case)


def test_tiresias_promotes_a_starving_job() -> None:
    config = SchedulerConfig(
        queue="tiresias",
        tiresias_thresholds=(100.0,),
        tiresias_promote_knob=2,
        min_runtime_s=0,  # promoted after 2 x its 200 s run (the guard: tests/unit/
        cooldown_s=0,  # test_preemption_protection.py)
    )
    state = make_state(small_cluster(nodes=1, gpus=1, per_rack=1), config=config)
    state.submit(make_job("j").gpus(1).build(), 0)
    state.start("j", schedule(state.snapshot(0)).admissions[0].placement, 0)
    state.stop("j", 200, requeue=True)  # ran 200 s: attained 200 > 100, so queue 1
    assert state.pending["j"].key[0] == 1
    assert state.next_wakeup(200) == 600  # promoted after waiting 2 × 200 s
    state.refresh(600)
    assert state.pending["j"].key[0] == 0


@pytest.mark.parametrize("name", names())
def test_every_registered_policy_schedules(name: str) -> None:
    driver = Driver(small_cluster(nodes=2), queue=name)
    driver.submit(make_job("x").gpus(4), make_job("y").gpus(8))
    assert sorted(admitted(driver.cycle())) == ["x", "y"]
