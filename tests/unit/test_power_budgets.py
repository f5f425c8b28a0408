"""Power budgets per rack and circuit (the cluster file's power_budget_w): the file, the
placement rule and its reason, and a replay that stays within every budget at every event."""

from __future__ import annotations

import random

import pytest

from aicluster.core import ConfigError, parse_cluster
from aicluster.scheduler import SchedulerConfig
from aicluster.sim import SimConfig, Simulator, summarize, synthetic_jobs
from builders import Driver, admitted, make_job

QUIET = SimConfig(failures=False)

# 4 racks of 2 nodes x 8 GPUs; a node draws 100 + 8 x 50 = 500 W idle, 300 W a busy GPU more
# (2500 W full). Rack r1 may draw 3.5 kW: one full node and one idle; circuit "a" (r2, r3) 6 kW.
CLUSTER = """
name: budgeted
layout: {pods: 1, racks_per_pod: 4, nodes_per_rack: 2}
defaults: {gpus: 8, gpu_type: H100}
power:
  H100: {idle_watts: 50, busy_watts: 300, node_watts: 100}
racks:
  rack-1: {power_budget_w: 3500}
circuits:
  a: {racks: [rack-2, rack-3], power_budget_w: 6000}
"""


def test_the_file_gives_budgets_per_rack_and_circuit() -> None:
    budgets = parse_cluster(CLUSTER).budgets
    assert [(b.name, b.watts) for b in budgets] == [("rack rack-1", 3500), ("circuit a", 6000)]
    assert budgets[1].racks == frozenset({"rack-2", "rack-3"})


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("racks:\n  rack-9: {power_budget_w: 10}\n", "rack rack-9: no rack named rack-9"),
        ("power_budget_w: -1\n", "power_budget_w must be at least 0"),
        ("circuits:\n  b: {power_budget_w: 10}\n", "circuits.b.racks must list rack names"),
        ("racks:\n  rack-0: {budget: 10}\n", "unknown field 'budget'"),
    ],
)
def test_bad_budgets_are_refused_with_the_line(extra: str, message: str) -> None:
    text = "layout: {racks_per_pod: 2, nodes_per_rack: 1}\n" + extra
    with pytest.raises(ConfigError, match=message):
        parse_cluster(text, "c.yaml")


def test_placement_avoids_a_rack_over_budget_and_a_job_held_back_says_which() -> None:
    cluster = parse_cluster(CLUSTER)
    driver = Driver(cluster)
    driver.occupy("r1-full", "node-0002", 8)  # rack-1: 2500 + 500 = 3.0 of 3.5 kW
    for node in ("node-0000", "node-0001", "node-0004", "node-0005", "node-0006", "node-0007"):
        driver.occupy(f"on-{node}", node, 8)
    # Only node-0003 (rack-1) has GPUs free; 2 busy GPUs there would draw 3.5 kW: fits.
    driver.submit(make_job("two").gpus(2))
    assert admitted(driver.cycle()) == ["two"]
    driver.submit(make_job("one-more").gpus(1))
    reason = driver.cycle().reason_for("one-more")
    assert reason is not None
    assert "power budget rack rack-1: 3.5 of 3.5 kW; starting it would draw 3.8 kW" in (
        reason.message
    )


def _replay(text: str) -> dict[str, float]:
    jobs = list(synthetic_jobs(random.Random(7), total_gpus=64, load=0.9, horizon=86400))
    sim = Simulator(
        parse_cluster(text), jobs, scheduler=SchedulerConfig(queue="fifo"), config=QUIET
    )
    summary = summarize(sim.run())
    assert summary["completed"] == len(jobs)
    assert summary["peak_kw"] == {name: watts / 1000 for name, watts in sim.peak_watts.items()}
    return sim.peak_watts  # the most each rack and budget drew after any batch of events


def test_a_replay_keeps_every_rack_and_circuit_within_its_budget_at_every_event() -> None:
    peaks = _replay(CLUSTER)
    assert peaks["rack rack-1"] == peaks["rack-1"] <= 3500
    assert peaks["circuit a"] <= 6000
    # The same replay under a budget that never binds draws more there: the budgets held.
    loose = _replay(CLUSTER.split("racks:")[0] + "power_budget_w: 1000000\n")
    assert loose["rack-1"] > 3500
    assert loose["rack-2"] + loose["rack-3"] > 6000
