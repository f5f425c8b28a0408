"""The twin of the live cluster: 30 short jobs of two tenants contend for the embedded Ray
cluster (4 nodes of 8 GPUs and 8 CPUs) under the priority policy; their history is exported as
a trace, the nodes and the configuration in force (``export_twin``, what ``aicluster twin
export`` asks the server for), and ``aicluster sim`` replays the three files. The replay starts
the jobs in the live order, and each job's wait is within 10% or 5 s of its live wait.

Each worker asks one GPU and its node's 8 CPUs, so a worker takes a whole node (one rank a
node, as in test_sim_live_agree); a job is one or two workers, and holds its nodes for its
launch (seconds here) and 0.5-1.5 s of sleep (jobs/sleeps.py). The first four jobs (one worker
each) are submitted one a tick and take the four nodes; the other 26 follow at once, before
any job can have ended, and queue. The priorities order that queue (high-priority jobs pass
normal and low ones), and the waits reach a minute. The run time the export measures, from
admission to the end, includes the launch. Preemption is off: each job runs once.

Why this shape and strict order (``backfill: none``): which of two jobs starts first must not
hang on a race the replay cannot see. The live loop starts a job a tick after a node frees, the
replay at that instant, so the replay runs ahead of the live run by a tick for every job before
it on its nodes (seconds, on a loaded machine). With a submission every 0.8 s, one that landed
within that drift of a job's end was decided one way live and the other way in the replay (in
CI). With every job queued before the first end and strict order, the start order is the
queue's whatever the drift, and the waits measure the twin's timing. EASY backfill would race
too: live it knows no run times (the jobs give no estimate), the replay reads the trace's.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from looprun import live_loop, run_until, state_of, wait_until_idle
from shipping import JOBS, ship
from typer.testing import CliRunner

from aicluster.cli.main import app
from aicluster.configuration import loop_options, parse_configuration, scheduler_config
from aicluster.control.loop.loop import ControlLoop
from aicluster.control.views.twin import export_twin
from aicluster.core import JobState, Tenant, jobspec_from_mapping
from aicluster.runtime import Runtime
from aicluster.store import Store

pytestmark = pytest.mark.integration

CONFIG = "policy:\n  name: priority\nbackfill: none\npreemption:\n  enabled: false\n"
NODE_CPUS = 8
ONE_A_TICK = 4  # the first jobs, submitted one a tick: one a node
PRIORITIES = ("normal", "high", "low")


def workload() -> list[dict[str, object]]:
    """30 jobs: (tenant, name, workers, seconds of sleep, priority), a fixed mix."""
    jobs = []
    for i in range(30):
        tenant = "a" if i % 2 == 0 else "b"
        jobs.append(
            {
                "tenant": tenant,
                "name": f"{tenant}-{i:02d}",
                "workers": 2 if i % 5 == 4 else 1,
                "seconds": 0.5 + (i * 3) % 5 * 0.25,  # of work
                "priority": PRIORITIES[(i * 2) % 3] if tenant == "b" else "normal",
            }
        )
    return jobs


@pytest.fixture
def loop(tmp_path: Path, runtime: Runtime) -> Iterator[ControlLoop]:
    configuration, _ = parse_configuration(CONFIG, "config.yaml")
    store = Store.open(f"sqlite:///{tmp_path / 'live.db'}")
    for name in ("a", "b"):
        store.create_tenant(Tenant(name), "test")
    store.apply_config(CONFIG, "config.yaml", "test")
    wait_until_idle()  # the live run must start from idle nodes, as its twin does
    with live_loop(
        store, runtime, scheduler_config(configuration), **loop_options(configuration)
    ) as control:
        yield control


def run_live(loop: ControlLoop) -> dict[str, str]:
    """Submit the workload on its schedule, ticking the loop; returns job id -> name."""
    assert loop.runtime is not None
    codes = {tenant: ship(loop.runtime.state_dir, tenant, JOBS) for tenant in ("a", "b")}
    names: dict[str, str] = {}
    for i, job in enumerate(workload()):
        spec = {
            "name": job["name"],
            "entrypoint": "sleeps.py",
            "code": codes[str(job["tenant"])],
            "workers": job["workers"],
            "args": [str(job["seconds"])],
            "resources": {"gpus": 1, "cpus": NODE_CPUS, "memory_gb": 0.1},
            "priority": job["priority"],
        }
        record, _ = loop.store.submit_job(str(job["tenant"]), jobspec_from_mapping(spec), "u")
        names[record.id] = str(job["name"])
        if i < ONE_A_TICK:
            loop.tick()
    queued_at = time.time()
    try:
        run_until(loop, lambda: all(state_of(loop, j).terminal for j in names), 480)
    finally:
        for job_id, name in names.items():
            moves = [
                (round(e.at % 1000, 1), e.to_state or e.kind, e.details.get("reason", ""))
                for e in loop.store.events(job_id)
            ]
            print(name, state_of(loop, job_id), moves)
    assert all(state_of(loop, j) is JobState.SUCCEEDED for j in names)
    first_end = min(_end(loop, job_id) for job_id in names)
    assert first_end > queued_at, "every job must be queued before the first one ends"
    return names


def _end(loop: ControlLoop, job_id: str) -> float:
    return next(e.at for e in loop.store.events(job_id) if e.to_state == "SUCCEEDED")


def live_waits(loop: ControlLoop, names: dict[str, str]) -> dict[str, tuple[float, float]]:
    """Per job name: (first start, wait) in live seconds."""
    found = {}
    for job_id, name in names.items():
        record = loop.store.get_job(None, job_id)
        start = next(e.at for e in loop.store.events(job_id) if e.to_state == "STARTING")
        found[name] = (start, start - record.submitted_at)
    return found


def replay(folder: Path) -> dict[str, tuple[float, float]]:
    """``aicluster sim`` on the exported files: per job id, (start, wait), in the replay's order
    of starts (jobs started at one instant in the policy's order, as one live cycle starts
    them)."""
    out = folder / "sim"
    files = ["--trace", "trace.csv", "--cluster", "cluster.yaml", "--config", "config.yaml"]
    options = [str(folder / name) if name.endswith((".csv", ".yaml")) else name for name in files]
    done = CliRunner().invoke(
        app, ["sim", *options, "--no-failures", "--out", str(out), "--no-report", "-o", "json"]
    )
    assert done.exit_code == 0, done.output
    (run,) = json.loads((out / "summary.json").read_text())["runs"]
    assert run["policy"] == "priority"
    with (out / "jobs-priority.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    trace = {row["id"]: row for row in csv.DictReader((folder / "trace.csv").open())}

    def order(row: dict[str, str]) -> tuple[float, ...]:
        job = trace[row["id"]]
        return (float(row["start_time"]), -int(job["priority"]), float(job["submit_time"]))

    rows.sort(key=order)
    return {
        row["id"]: (float(row["start_time"]), float(row["start_time"]) - float(row["submit_time"]))
        for row in rows
    }


def test_a_replay_of_the_exported_history_starts_jobs_as_the_live_cluster_did(
    loop: ControlLoop, tmp_path: Path
) -> None:
    names = run_live(loop)
    live = live_waits(loop, names)
    twin = export_twin(loop.store)
    assert twin.jobs == 30
    folder = tmp_path / "twin"
    folder.mkdir()
    (folder / "trace.csv").write_text(twin.trace_csv)
    (folder / "cluster.yaml").write_text(twin.cluster_yaml)
    (folder / "config.yaml").write_text(twin.config_yaml)
    replayed = {names[job_id]: found for job_id, found in replay(folder).items()}
    live_order = sorted(live, key=lambda name: live[name][0])
    replay_order = list(replayed)
    assert replay_order == live_order
    assert live_order != sorted(live), "the priorities must reorder the queue"
    assert max(wait for _, wait in live.values()) > 10, "the jobs must contend"
    far = {
        name: (round(wait, 1), round(replayed[name][1], 1))
        for name, (_, wait) in live.items()
        if abs(replayed[name][1] - wait) > max(5.0, 0.1 * wait)
    }
    assert far == {}, far
