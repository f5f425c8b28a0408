"""Estimated starts (sim/forecast.py): the simulator run forward from a scheduler state, with
known durations; the state forecast from is left as it was."""

from __future__ import annotations

import random

import pytest

from aicluster.control.loop.launchtimes import LaunchTimes
from aicluster.control.views.queueview import queue_order
from aicluster.core import make_cluster
from aicluster.core.power import PowerPolicy, PowerState
from aicluster.scheduler import SchedulerConfig
from aicluster.sim import SimConfig, Simulator, TraceJob
from aicluster.sim.forecast import OVERDUE_S, ForecastOptions, estimate_starts, expected_end
from builders import Driver, make_job, small_cluster

WEEK = 7 * 86_400.0


def busy_node(estimate: float | None, **config: object) -> Driver:
    """One node of 8 GPUs that a job ("r", started at 0, all 8 GPUs) holds."""
    driver = Driver(small_cluster(nodes=1), **config)
    builder = make_job("r").gpus(8)
    driver.submit(builder.estimate(estimate) if estimate is not None else builder)
    driver.cycle(0.0)
    return driver


def forecast(driver: Driver, now: float, horizon_s: float = WEEK) -> dict[str, float | None]:
    queued = sorted(driver.state.pending, key=lambda job_id: driver.state.pending[job_id].seq)
    return estimate_starts(driver.state, now, queued, horizon_s)


def test_known_run_times_give_exact_starts_and_the_state_is_left_as_it_was() -> None:
    driver = busy_node(100.0)
    driver.now = 20.0
    driver.submit(
        make_job("a").gpus(8).estimate(50.0),
        make_job("b").gpus(4).estimate(30.0),
        make_job("c").gpus(4).estimate(10.0),
        make_job("d").gpus(8).estimate(5.0),
    )
    before = driver.state.digest()
    starts = forecast(driver, 20.0)
    assert starts == {"a": 100.0, "b": 150.0, "c": 150.0, "d": 180.0}
    assert driver.state.digest() == before
    assert set(driver.state.pending) == {"a", "b", "c", "d"}


def test_easy_backfill_starts_a_job_ahead_of_the_reservation_only_if_it_ends_before() -> None:
    driver = Driver(small_cluster(nodes=1), backfill="easy")
    driver.submit(make_job("r").gpus(4).estimate(100.0))
    driver.cycle(0.0)
    driver.submit(make_job("big").gpus(8).estimate(10.0), make_job("short").gpus(4).estimate(60))
    driver.cycle(0.0)  # the short one backfills at once: it ends before r does
    driver.submit(make_job("fits").gpus(4).estimate(30.0), make_job("long").gpus(4).estimate(50))
    # fits backfills when short ends (60 + 30 <= 100); long would delay big: after it
    assert forecast(driver, 0.0) == {"big": 100.0, "fits": 60.0, "long": 110.0}


def test_each_job_holds_its_gpus_for_its_launch_then_its_estimate() -> None:
    driver = busy_node(100.0)
    driver.submit(make_job("a").gpus(8).estimate(50.0), make_job("b").gpus(8).estimate(5.0))
    queued = ["a", "b"]
    assert estimate_starts(driver.state, 20.0, queued, WEEK, launch_s=10.0) == {
        "a": 110.0,
        "b": 170.0,
    }


def test_the_typical_launch_is_the_median_of_the_latest() -> None:
    launches = LaunchTimes(kept=3)
    assert launches.typical == 0.0
    for seconds in (100.0, 2.0, 4.0, 3.0):  # the first is forgotten
        launches.observe(seconds)
    assert launches.typical == 3.0
    launches.observe(-1.0)  # a clock step: never below 0
    assert launches.typical == 3.0


def test_a_job_without_an_estimate_holds_its_gpus_to_the_end_of_the_forecast() -> None:
    driver = busy_node(None)
    driver.submit(make_job("a").gpus(8).estimate(50.0))
    assert forecast(driver, 10.0) == {"a": None}
    driver = busy_node(100.0)
    driver.submit(make_job("open").gpus(8), make_job("after").gpus(8).estimate(5.0))
    assert forecast(driver, 10.0) == {"open": 100.0, "after": None}


def test_a_start_beyond_the_horizon_is_unknown() -> None:
    driver = busy_node(100.0)
    driver.submit(make_job("a").gpus(8).estimate(50.0), make_job("b").gpus(8).estimate(5.0))
    assert forecast(driver, 20.0, horizon_s=100.0) == {"a": 100.0, "b": None}


def test_a_job_past_its_estimate_is_expected_to_end_soon() -> None:
    driver = busy_node(100.0)
    driver.submit(make_job("a").gpus(8).estimate(50.0))
    assert forecast(driver, 150.0) == {"a": 150.0 + OVERDUE_S}


def test_only_the_jobs_asked_for_are_forecast() -> None:
    driver = busy_node(100.0)
    driver.submit(make_job("a").gpus(8).estimate(50.0), make_job("b").gpus(8).estimate(5.0))
    assert estimate_starts(driver.state, 0.0, ["b"], WEEK) == {"b": 100.0}


def test_a_cordoned_node_takes_no_work_in_the_forecast() -> None:
    driver = Driver(small_cluster(nodes=2))
    driver.submit(make_job("r").gpus(8).estimate(100.0))
    driver.cycle(0.0)
    free = next(node.name for node in driver.state.cluster.nodes if node.name != "node-0")
    driver.state.set_node_schedulable(free, False)
    driver.submit(make_job("a").gpus(8).estimate(50.0))
    assert forecast(driver, 0.0) == {"a": 100.0}


def test_a_resumed_job_is_expected_to_run_what_its_estimate_leaves() -> None:
    driver = Driver(small_cluster(nodes=1), preemption=True)
    driver.submit(make_job("low").gpus(8).estimate(100.0).priority(0))
    driver.cycle(0.0)
    driver.submit(make_job("high").gpus(8).estimate(10.0).priority(100))
    driver.cycle(40.0)  # preempts low, which keeps its 40 s of work
    driver.finish("high", 50.0)
    driver.cycle(50.0)
    resumed = driver.state.running["low"]
    assert expected_end(resumed, 50.0) == 110.0
    assert expected_end(resumed, 200.0) == 200.0 + OVERDUE_S


def test_options_are_checked() -> None:
    with pytest.raises(ValueError):
        ForecastOptions(horizon_s=0)
    with pytest.raises(ValueError):
        ForecastOptions(max_jobs=0)


def test_off_nodes_are_resumed_in_the_forecast_and_take_their_resume_time() -> None:
    """Under power saving, as the live loop leaves it: one node busy, one off. A job that needs
    the off node starts once it is back (resume_time), not never; the live state is unchanged."""
    policy = PowerPolicy(suspend_after=10, suspend_time=5, resume_time=120)
    driver = Driver(small_cluster(nodes=2), power=policy)
    driver.submit(make_job("r").gpus(8).estimate(1000.0))
    driver.cycle(0.0)
    power = driver.state.power
    assert power is not None
    power.step(10.0)
    power.step(15.0)
    assert power.state_of(1) is PowerState.OFF and power.state_of(0) is PowerState.ON
    driver.submit(make_job("a").gpus(8).estimate(50.0))
    before = (driver.state.digest(), list(power.states))
    assert forecast(driver, 20.0) == {"a": 20.0 + 120.0}
    assert (driver.state.digest(), list(power.states)) == before


@pytest.mark.parametrize("seed", range(3))
def test_forecasts_made_during_a_replay_give_the_starts_the_replay_gives(seed: int) -> None:
    """Under fifo without backfill, on true run times, no later arrival passes a queued job (nor
    delays it), so a forecast made at
    any point of a replay must give each queued job exactly the start the replay gives it: the
    forecast runs the scheduler the replay runs (bench/predict_durations.py measures the same on
    Philly, with predictions). Each forecast starts from the replay run up to a cut."""
    rng = random.Random(seed)
    arrivals = sorted(rng.uniform(0, 20_000) for _ in range(300))
    jobs = [
        TraceJob(f"j{k}", at, d, rng.choice([1, 2, 4, 8]), duration_estimate=d)
        for k, at in enumerate(arrivals)
        if (d := rng.uniform(300, 6_000))
    ]
    cluster = make_cluster(nodes=4, gpus_per_node=8)

    def replay(until: float | None) -> Simulator:
        fifo = SchedulerConfig(queue="fifo", backfill="none")
        simulator = Simulator(
            cluster, jobs, scheduler=fifo, config=SimConfig(failures=False, until=until)
        )
        simulator.run()
        return simulator

    whole = replay(None)
    starts = dict(zip(whole.table.ids, whole.table.start, strict=True))
    compared = []
    for cut in range(2_000, 20_000, 2_000):
        state = replay(float(cut)).state
        queued = queue_order(state, float(cut))
        estimates = estimate_starts(state, float(cut), queued, 7 * 86_400.0)
        compared += [(estimate, starts[job_id]) for job_id, estimate in estimates.items()]
    assert len(compared) > 100  # jobs queued at the cuts
    assert all(estimate == pytest.approx(start, abs=1e-6) for estimate, start in compared)
