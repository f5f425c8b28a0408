"""Power saving in the simulator, on a hand-worked case: the engine drives the scheduler's
PowerManager (the same code the live loop drives) and integrates the draw of nodes that are on."""

from __future__ import annotations

import random

import pytest

from aicluster.core import GpuPower, NodeShape, make_cluster
from aicluster.core.power import PowerPolicy
from aicluster.scheduler import SchedulerConfig
from aicluster.sim import SimConfig, Simulator, TraceJob, summarize, synthetic_jobs

QUIET = SimConfig(failures=False, restart_overhead=0.0, checkpoint_interval=300.0)
POWER = PowerPolicy(suspend_after=100, suspend_time=10, resume_time=50)


def _run(power: PowerPolicy | None) -> Simulator:
    shape = NodeShape(power=GpuPower(idle_watts=50, busy_watts=300, node_watts=100))
    cluster = make_cluster(nodes=2, shape=shape)
    jobs = [TraceJob("a", 0, 1000, 8), TraceJob("b", 2000, 1000, 16)]
    sim = Simulator(
        cluster, jobs, scheduler=SchedulerConfig(queue="fifo", power=power), config=QUIET
    )
    sim.run()
    return sim


def test_idle_nodes_power_down_and_the_queue_brings_them_back() -> None:
    sim = _run(POWER)
    node_1 = [(t.after.value, t.at) for t in sim.transitions if t.node == "node-1"]
    assert node_1 == [("suspending", 100), ("off", 110), ("resuming", 2000), ("on", 2050)]
    table = sim.table
    assert table.end[1] - table.submit[1] == 1050  # waited for the resume
    summary = summarize(sim._result())
    # busy 2500 W, idle 500 W, off 0: node-0 busy 2000 s, idle 160 s; node-1 busy 1000 s,
    # idle 160 s (before its suspend ends and while it resumes).
    joules = 2500 * 3000 + 500 * (160 + 160)
    assert summary["energy_kwh"] == pytest.approx(joules / 3.6e6)


def test_always_on_draws_more_for_the_same_jobs() -> None:
    saved, always = summarize(_run(POWER)._result()), summarize(_run(None)._result())
    assert always["completed"] == saved["completed"] == 2
    assert saved["energy_kwh"] < always["energy_kwh"]


def test_a_replay_with_failures_and_power_saving_finishes_every_job() -> None:
    """Failures of off and resuming nodes, repairs, resumes: every job still ends, and a node
    repaired while off stays off until the queue resumes it."""
    cluster = make_cluster(nodes=8, nodes_per_rack=4)
    jobs = list(synthetic_jobs(random.Random(3), total_gpus=64, load=0.5, horizon=3 * 86400))
    failing = SimConfig(failures=True, gpu_hours_per_failure=2000.0, repair_seconds=1800.0)
    sim = Simulator(cluster, jobs, scheduler=SchedulerConfig(power=POWER), config=failing)
    summary = summarize(sim.run())
    assert summary["failures"] > 0 and summary["completed"] == len(jobs)
    assert {t.after.value for t in sim.transitions} == {"suspending", "off", "resuming", "on"}
