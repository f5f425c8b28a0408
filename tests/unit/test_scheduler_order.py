"""Queue-order policies on small cases worked out by hand."""

from aicluster.core import Tenant
from aicluster.scheduler import SchedulerConfig, make_state, names, schedule
from builders import Driver, admitted, make_job, preempted, small_cluster


def one_node() -> Driver:
    return Driver(small_cluster(nodes=1), queue="fifo")


def three_jobs() -> list:
    # Submitted long, medium, short; each needs the whole 8-GPU node.
    return [
        make_job("long").gpus(8).at(0).duration(300),
        make_job("medium").gpus(8).at(1).duration(200),
        make_job("short").gpus(8).at(2).duration(100),
    ]


def run_to_completion(queue: str) -> dict[str, float]:
    """Drive three whole-node jobs to completion; return each job's completion time."""
    driver = Driver(small_cluster(nodes=1), queue=queue)
    driver.submit(*three_jobs())
    done: dict[str, float] = {}
    now = 2.0
    driver.cycle(at=now)
    while driver.state.running:
        (job_id, entry), *_ = driver.state.running.items()
        now = entry.started_at + (entry.job.true_duration or 0)
        driver.finish(job_id, at=now)
        done[job_id] = now
        driver.cycle(at=now)
    return done


def test_fifo_runs_in_submission_order() -> None:
    done = run_to_completion("fifo")
    assert list(done) == ["long", "medium", "short"]
    # Completion times 2+300, +200, +100; mean JCT = ((302-0)+(502-1)+(602-2))/3.
    assert done == {"long": 302.0, "medium": 502.0, "short": 602.0}


def test_sjf_runs_shortest_first_and_lowers_mean_jct() -> None:
    done = run_to_completion("sjf")
    assert list(done) == ["short", "medium", "long"]
    fifo = run_to_completion("fifo")
    submit = {"long": 0, "medium": 1, "short": 2}
    mean = lambda d: sum(d[j] - submit[j] for j in d) / 3  # noqa: E731
    assert mean(done) < mean(fifo)
    assert mean(done) == ((102 - 2) + (302 - 1) + (602 - 0)) / 3


def test_priority_policy_orders_by_priority_then_arrival() -> None:
    driver = Driver(small_cluster(nodes=1), queue="priority", preemption=False)
    driver.submit(
        make_job("a").gpus(8).at(0).priority(100),
        make_job("b").gpus(8).at(1).priority(300),
        make_job("c").gpus(8).at(2).priority(300),
    )
    assert admitted(driver.cycle()) == ["b"]
    driver.finish("b")
    assert admitted(driver.cycle()) == ["c"]


def test_fair_share_alternates_between_tenants_by_weight() -> None:
    tenants = {"a": Tenant("a", weight=1.0), "b": Tenant("b", weight=3.0)}
    driver = Driver(small_cluster(nodes=1), tenants, queue="fair")
    for i in range(8):
        driver.submit(make_job(f"a{i}").gpus(1).tenant("a").at(i))
        driver.submit(make_job(f"b{i}").gpus(1).tenant("b").at(i + 0.5))
    plan = driver.cycle()
    got = admitted(plan)
    # Weighted DRF on 8 GPUs: b (weight 3) ends with 6, a with 2.
    assert sum(j.startswith("b") for j in got) == 6
    assert sum(j.startswith("a") for j in got) == 2


def test_tiresias_demotes_long_runners_and_lets_new_jobs_preempt_them() -> None:
    driver = Driver(small_cluster(nodes=1), queue="tiresias", tiresias_thresholds=(800.0,))
    driver.submit(make_job("old").gpus(8).at(0))
    assert admitted(driver.cycle(at=0)) == ["old"]
    driver.submit(make_job("new").gpus(8).at(50))
    plan = driver.cycle(at=50)
    assert admitted(plan) == [] and preempted(plan) == []  # same queue: no preemption
    # 8 GPUs × 100 s = 800 GPU-seconds: "old" drops to queue 1 at t=100.
    assert plan.next_wakeup is not None and abs(plan.next_wakeup - 100) < 1e-3
    plan = driver.cycle(at=plan.next_wakeup)
    assert preempted(plan) == ["old"] and admitted(plan) == ["new"]
    assert "tiresias" in plan.preemptions[0].reason


def test_tiresias_promotes_a_starving_job() -> None:
    config = SchedulerConfig(
        queue="tiresias", tiresias_thresholds=(100.0,), tiresias_promote_knob=2
    )
    state = make_state(small_cluster(nodes=1, gpus=1, per_rack=1), config=config)
    state.submit(make_job("j").gpus(1).build(), 0)
    state.start("j", schedule(state.snapshot(0)).admissions[0].placement, 0)
    state.stop("j", 200, requeue=True)  # ran 200 s: attained 200 > 100, so queue 1
    assert state.pending["j"].key[0] == 1
    assert state.next_wakeup(200) == 600  # promoted after waiting 2 × 200 s
    state.refresh(600)
    assert state.pending["j"].key[0] == 0


def test_srtf_preempts_a_job_with_more_time_left() -> None:
    driver = Driver(small_cluster(nodes=1), queue="srtf")
    driver.submit(make_job("long").gpus(8).duration(1000))
    driver.cycle(at=0)
    driver.submit(make_job("short").gpus(8).duration(100).at(10))
    plan = driver.cycle(at=10)
    assert preempted(plan) == ["long"] and admitted(plan) == ["short"]


def test_all_registered_policies_schedule() -> None:
    for name in names():
        driver = Driver(small_cluster(nodes=2), queue=name)
        driver.submit(make_job("x").gpus(4), make_job("y").gpus(8))
        assert sorted(admitted(driver.cycle())) == ["x", "y"], name
