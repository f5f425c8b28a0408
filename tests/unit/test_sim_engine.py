"""The simulator on hand-worked cases: exact JCTs, checkpoints, restarts, failures, energy."""

from __future__ import annotations

import gc
import random

import pytest

from aicluster.core import GpuPower, ManualClock, NodeShape, make_cluster
from aicluster.scheduler import SchedulerConfig
from aicluster.sim import (
    SimConfig,
    Simulator,
    TraceJob,
    engine,
    simulate,
    summarize,
    synthetic_jobs,
)
from aicluster.sim.config import GC_THRESHOLD

QUIET = SimConfig(failures=False, restart_overhead=60.0, checkpoint_interval=300.0)
FIFO = SchedulerConfig(queue="fifo")


def job(name: str, submit: float, duration: float, gpus: int = 8, tenant: str = "a") -> TraceJob:
    return TraceJob(name, submit, duration, gpus, tenant)


def jcts(result: Simulator | object) -> dict[str, float]:
    table = result.jobs  # type: ignore[attr-defined]
    return {job_id: table.end[i] - table.submit[i] for i, job_id in enumerate(table.ids)}


def test_fifo_and_sjf_give_the_hand_computed_completion_times() -> None:
    cluster = make_cluster(nodes=1)
    trace = [job("a", 0, 300), job("b", 1, 200), job("c", 2, 100)]
    fifo = simulate(cluster, trace, "fifo", config=QUIET)
    sjf = simulate(cluster, trace, "sjf", config=QUIET)
    # fifo: a 0-300, b 300-500, c 500-600; sjf: a 0-300, c 300-400, b 400-600.
    assert jcts(fifo) == {"a": 300, "b": 499, "c": 598}
    assert jcts(sjf) == {"a": 300, "b": 599, "c": 398}
    assert summarize(sjf)["jct_mean"] == pytest.approx((300 + 599 + 398) / 3)
    assert summarize(fifo)["makespan"] == 600


def test_preemption_loses_work_since_the_checkpoint_and_pays_the_restart() -> None:
    cluster = make_cluster(nodes=1)
    # Under Tiresias the long job drops to queue 1 after 3,600 GPU-seconds (450 s on 8 GPUs);
    # the short one arrives at 1,000 s in queue 0 and preempts it. Checkpoints every 300 s keep
    # 900 s of progress: 100 s × 8 GPUs are lost, and the resumed run restores for 60 s first.
    result = simulate(
        cluster, [job("long", 0, 10_000), job("short", 1_000, 100)], "tiresias", config=QUIET
    )
    assert jcts(result) == {"long": 1_100 + 60 + (10_000 - 900), "short": 100}
    summary = summarize(result)
    assert summary["preemptions"] == 1
    assert summary["lost_gpu_hours_preemptions"] == pytest.approx(100 * 8 / 3600)
    assert summary["restart_overhead_gpu_hours"] == pytest.approx(60 * 8 / 3600)
    allocated = (1_000 + 100 + 60 + 9_100) * 8
    assert summary["goodput"] == pytest.approx(1 - (100 + 60) * 8 / allocated)


def test_a_node_failure_requeues_its_jobs_with_their_checkpointed_progress() -> None:
    cluster = make_cluster(nodes=2)
    config = SimConfig(
        failures=False, restart_overhead=60.0, checkpoint_interval=300.0, repair_seconds=500.0
    )
    sim = Simulator(cluster, [job("a", 0, 1_000)], scheduler=FIFO, config=config)
    sim.inject_failure(700.0, cluster.nodes[0].name)  # the node job a was placed on (best fit)
    result = sim.run()
    # Kept 600 s (checkpoint at 600), restarted at once on the other node: 700 + 60 + 400.
    assert jcts(result) == {"a": 1_160}
    summary = summarize(result)
    assert (summary["failures"], summary["failure_interruptions"]) == (1, 1)
    assert summary["lost_gpu_hours_failures"] == pytest.approx(100 * 8 / 3600)
    assert result.jobs.restarts[0] == 1
    assert max(result.series.columns["nodes_down"]) == 1


def test_energy_of_a_known_schedule() -> None:
    cluster = make_cluster(nodes=1, shape=NodeShape(power=GpuPower(idle_watts=50, busy_watts=300)))
    result = simulate(cluster, [job("half", 0, 3_600, gpus=4)], "fifo", config=QUIET)
    # 8 GPUs idle at 50 W plus 4 of them 250 W busier, for one hour: 1.4 kWh.
    assert summarize(result)["energy_kwh"] == pytest.approx(1.4)
    assert summarize(result)["utilization"] == pytest.approx(0.5)


def test_cycle_interval_coalesces_decisions_on_a_fixed_grid() -> None:
    cluster = make_cluster(nodes=1)
    config = SimConfig(failures=False, cycle_interval=10.0)
    trace = [job("a", 1, 50, gpus=1), job("b", 2, 50, gpus=1), job("c", 3, 50, gpus=1)]
    result = simulate(cluster, trace, "fifo", config=config)
    assert list(result.jobs.start) == [10.0, 10.0, 10.0]
    assert result.totals.cycles == 1


def test_the_clock_is_the_injected_one_and_ends_at_the_last_event() -> None:
    clock = ManualClock(0.0)
    Simulator(make_cluster(nodes=1), [job("a", 5, 20)], clock=clock, config=QUIET).run()
    assert clock.now() == 25.0


def test_jobs_that_can_never_fit_are_reported_unfinished() -> None:
    result = simulate(make_cluster(nodes=1), [job("huge", 0, 10, gpus=16)], config=QUIET)
    assert summarize(result)["unfinished"] == 1


def test_the_same_seed_gives_identical_results() -> None:
    cluster = make_cluster(nodes=4, nodes_per_rack=2)

    def run(seed: int) -> str:  # repr: NaN (a job not finished) equals itself there
        config = SimConfig(gpu_hours_per_failure=100.0, seed=seed, until=3 * 86_400.0)
        trace = synthetic_jobs(random.Random(3), total_gpus=32, load=0.8, horizon=86_400.0)
        result = simulate(cluster, trace, "tiresias", config=config)
        summary = summarize(result)
        summary.pop("wall_seconds")
        summary.pop("jobs_per_second")
        assert summary["failures"] and summary["preemptions"]
        return repr((summary, list(result.jobs.end)))

    first = run(7)
    assert run(7) == first
    assert run(8) != first


def test_a_horizon_stops_the_run_and_counts_partial_allocation() -> None:
    config = SimConfig(failures=False, until=100.0)
    result = simulate(make_cluster(nodes=1), [job("a", 0, 1_000)], config=config)
    summary = summarize(result)
    assert summary["completed"] == 0 and summary["unfinished"] == 1
    assert result.totals.end_time == 100.0
    assert summary["utilization"] == pytest.approx(1.0)
    assert summary["tenant_share"] == {"a": 1.0}


@pytest.mark.parametrize("fewer", [True, False])
def test_a_run_collects_garbage_less_often_only_while_it_runs(fewer: bool) -> None:
    before = gc.get_threshold()
    seen: list[int] = []
    cluster = make_cluster(nodes=4, gpus_per_node=8)
    jobs = [TraceJob(f"j{i}", submit_time=i * 10.0, duration=600.0, num_gpus=8) for i in range(8)]
    simulator = Simulator(cluster, jobs, config=SimConfig(fewer_collections=fewer))
    simulator.run(lambda now, arrived, done: seen.append(gc.get_threshold()[0]))
    assert seen[-1] == (max(before[0], GC_THRESHOLD) if fewer else before[0])
    assert gc.get_threshold() == before  # put back as found


def test_overlapping_runs_put_the_collector_back_only_when_the_last_ends() -> None:
    before = gc.get_threshold()
    engine._collect_less()
    engine._collect_less()  # a second run (the control plane's forecast thread)
    engine._collect_as_before()
    assert gc.get_threshold()[0] == max(before[0], GC_THRESHOLD)
    engine._collect_as_before()
    assert gc.get_threshold() == before
