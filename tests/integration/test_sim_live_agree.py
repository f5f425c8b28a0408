"""One configuration file, two loops: ``aicluster sim`` replays a small trace and the live control
loop runs the same jobs on the embedded Ray cluster (scaled down in time, 1 live second for 10
simulated), and both start the jobs in the same order and preempt the same ones.

The trace (2, 2, then 4, then 1 nodes of 4): a low and a normal job run; a high one preempts
both; a short normal one waits behind it; when the high one ends the normal jobs go first (the
preempted one, then the short one), and the low one runs once the short one is done. Live, each
job is submitted once the one before it runs, which is the trace's order of arrivals.

A worker takes a whole node. In the replay a node is one GPU; live (the embedded cluster's nodes
of 8 GPUs and 8 CPUs), a worker asks one GPU and the node's 8 CPUs: one rank a node (a rank per
GPU), where asking the node's 8 GPUs would start 8.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from looprun import live_loop, run_until, state_of, wait_until_idle
from shipping import JOBS, ship
from typer.testing import CliRunner

from aicluster.cli.main import app
from aicluster.configuration import loop_options, parse_configuration, scheduler_config
from aicluster.control.loop.loop import ControlLoop
from aicluster.core import JobState, Tenant, jobspec_from_mapping
from aicluster.runtime import Runtime
from aicluster.store import Store

pytestmark = pytest.mark.integration

#: The embedded cluster's layout, a node counted as one GPU (see the module's docstring).
CLUSTER = """name: embedded-4-nodes
defaults: {gpus: 1, gpu_type: sim-gpu, cpus: 8, memory_gb: 16}
layout: {pods: 1, racks_per_pod: 2, nodes_per_rack: 2}
"""
NODE_CPUS = 8
CONFIG = "policy:\n  name: priority\npreemption:\n  grace_period_s: 3\n"
SCALE = 10.0  # simulated seconds per live second
#: (name, submit time, duration, nodes, priority) in simulated seconds.
TRACE = [
    ("low", 0, 150, 2, 100),
    ("normal", 5, 150, 2, 200),
    ("high", 10, 50, 4, 300),
    ("short", 15, 20, 1, 200),
]
PRIORITY_NAMES = {100: "low", 200: "normal", 300: "high"}


def simulated(tmp_path: Path) -> tuple[list[str], dict[str, int], int]:
    """The replay's order of first starts, restarts per job and preemptions."""
    trace = tmp_path / "trace.csv"
    rows = [f"{name},{t},{d},{g},a,{p}" for name, t, d, g, p in TRACE]
    trace.write_text("id,submit_time,duration,num_gpus,tenant,priority\n" + "\n".join(rows) + "\n")
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    out = tmp_path / "sim"
    options = ["--trace", str(trace), "--cluster", str(cluster), "--config", str(config)]
    done = CliRunner().invoke(
        app, ["sim", *options, "--no-failures", "--out", str(out), "--no-report", "-o", "json"]
    )
    assert done.exit_code == 0, done.output
    (run,) = json.loads((out / "summary.json").read_text())["runs"]
    with (out / "jobs-priority.csv").open() as handle:
        jobs = list(csv.DictReader(handle))
    order = [row["id"] for row in sorted(jobs, key=lambda row: float(row["start_time"]))]
    return order, {row["id"]: int(row["restarts"]) for row in jobs}, int(run["preemptions"])


@pytest.fixture
def loop(tmp_path: Path, runtime: Runtime) -> Iterator[ControlLoop]:
    configuration, _ = parse_configuration(CONFIG, "config.yaml")
    store = Store.open(f"sqlite:///{tmp_path / 'live.db'}")
    store.create_tenant(Tenant("a"), "test")
    wait_until_idle()  # the live run must start from idle nodes, as its twin does
    with live_loop(
        store, runtime, scheduler_config(configuration), **loop_options(configuration)
    ) as control:
        yield control


def test_the_live_loop_and_the_simulator_agree_on_one_configuration(
    loop: ControlLoop, tmp_path: Path
) -> None:
    order, restarts, preemptions = simulated(tmp_path)
    assert order == ["low", "normal", "high", "short"] and preemptions == 2  # the story above
    assert loop.runtime is not None
    code = ship(loop.runtime.state_dir, "a", JOBS)
    ids: dict[str, str] = {}
    for name, _, duration, nodes, priority in TRACE:
        spec = {
            "name": name,
            "entrypoint": "steps.py",
            "code": code,
            "workers": nodes,
            "args": ["--steps", str(round(duration / SCALE / 0.2)), "--step-seconds", "0.2"],
            "resources": {"gpus": 1, "cpus": NODE_CPUS, "memory_gb": 0.1},
            "priority": PRIORITY_NAMES[priority],
        }
        record, _ = loop.store.submit_job("a", jobspec_from_mapping(spec), "tester")
        ids[record.id] = name
        run_until(loop, lambda job=record.id: state_of(loop, job) is not JobState.PENDING)
    run_until(loop, lambda: all(state_of(loop, job) is JobState.SUCCEEDED for job in ids), 240)
    events = sorted((e for job in ids for e in loop.store.events(job)), key=lambda e: e.id)
    starts = [ids[str(e.job_id)] for e in events if e.to_state == "STARTING"]
    first_starts = list(dict.fromkeys(starts))
    live_restarts = {ids[j]: loop.store.get_job(None, j).attempt - 1 for j in ids}
    preempted = [ids[str(e.job_id)] for e in events if e.to_state == "PREEMPTING"]
    assert first_starts == order, starts
    assert live_restarts == restarts
    assert sorted(preempted) == ["low", "normal"] and len(preempted) == preemptions
    # After the high job, the normal jobs start before the low one, in both.
    assert starts[3:] == ["normal", "short", "low"], starts
