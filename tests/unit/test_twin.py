"""The twin export's conversion (aicluster.sim.twin): runs from state changes, the trace rows,
and that the three texts load as the simulator's trace, cluster and configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from aicluster.configuration import parse_configuration
from aicluster.core import Node, Tenant, parse_cluster
from aicluster.sim import load_csv, simulate
from aicluster.sim.twin import Run, TwinJob, cluster_text, config_text, runs_of, trace_text

T0 = 1_700_000_000.0


def twin_job(job_id: str, submitted: float, runs: tuple[Run, ...], **fields: object) -> TwinJob:
    values: dict[str, object] = {
        "id": job_id,
        "tenant": "a",
        "user": "alice",
        "name": job_id,
        "submitted_at": submitted,
        "priority": 200,
        "workers": 2,
        "gpus_per_worker": 1,
        "gpu_type": "any",
        "cpus_per_worker": 8.0,
        "memory_gb_per_worker": 0.5,
        "parallelism": (2, 1, 1),
        "duration_estimate": None,
        "outcome": "SUCCEEDED",
        "runs": runs,
        "restarts": 0,
    }
    values.update(fields)
    return TwinJob(**values)  # type: ignore[arg-type]


def test_runs_open_at_starting_and_close_when_the_job_gives_its_resources_back() -> None:
    changes = [
        (10.0, "STARTING"),
        (11.0, "RUNNING"),
        (20.0, "PREEMPTING"),
        (23.0, "PENDING"),  # preempted: lost work
        (30.0, "STARTING"),
        (31.0, "RUNNING"),
        (35.0, "RESTARTING"),  # a restart in place keeps the run open
        (36.0, "STARTING"),
        (40.0, "PENDING"),  # requeued without a preemption: a failure
        (50.0, "STARTING"),
        (80.0, "SUCCEEDED"),
    ]
    runs, restarts = runs_of(changes)
    assert runs == (Run(10, 23, True), Run(30, 40, False), Run(50, 80, False))
    assert restarts == 1


def test_a_trace_row_holds_the_final_run_and_counts_the_lost_work() -> None:
    runs = (Run(T0 + 10, T0 + 23, True), Run(T0 + 30, T0 + 40, False), Run(T0 + 50, T0 + 80, False))
    job = twin_job("j-1", T0 + 5, runs, restarts=1, duration_estimate=60.0)
    never_ran = twin_job("j-2", T0 + 6, (), outcome="CANCELLED")
    text = trace_text([job, never_ran], origin=T0)
    header, row, *rest = text.splitlines()
    assert rest == []  # the job that never ran is not in the trace
    assert header.startswith("id,submit_time,duration,num_gpus,workers,tenant,priority")
    assert row == "j-1,5,30,2,2,a,200,any,16,1,60,,alice,j-1,2x1x1,succeeded,1,2,23"


def test_the_exported_trace_replays_with_the_live_shape(tmp_path: Path) -> None:
    """Two jobs of 2 workers × (1 GPU, 8 CPUs) on nodes of 8 GPUs and 8 CPUs: each takes two
    whole nodes (the shape the export keeps; gang_shape would make one worker of 16 CPUs)."""
    first = twin_job("j-1", T0, (Run(T0, T0 + 100, False),))
    second = twin_job("j-2", T0 + 1, (Run(T0 + 100, T0 + 150, False),), tenant="b")
    path = tmp_path / "trace.csv"
    path.write_text(trace_text([second, first], origin=T0))
    jobs = load_csv(path)
    assert [(job.id, job.workers, job.num_gpus, job.cpus) for job in jobs] == [
        ("j-1", 2, 2, 16.0),
        ("j-2", 2, 2, 16.0),
    ]
    nodes = [Node(f"n{i}", 8, "sim-gpu", f"r{i % 2}", "p0", cpus=8, memory_gb=16) for i in range(2)]
    cluster = parse_cluster(cluster_text(nodes), "cluster.yaml")
    result = simulate(cluster, jobs, "fifo")
    starts = dict(zip(result.jobs.ids, result.jobs.start, strict=True))
    assert starts == {"j-1": 0.0, "j-2": 100.0}


def test_the_cluster_file_lists_the_live_nodes_as_they_are() -> None:
    nodes = [
        Node("node-1", 8, "H100", "rack-1", "pod-0", 96, 1024, 4, {"zone": "b"}),
        Node("node-0", 4, "A100", "rack-0", "pod-0", 32, 256),
    ]
    cluster = parse_cluster(cluster_text(nodes), "cluster.yaml")
    assert list(cluster.nodes) == sorted(nodes, key=lambda node: node.name)


def test_the_configuration_in_force_carries_the_stores_tenants() -> None:
    applied = "policy:\n  name: fair\nbackfill: none\n"
    tenants = [Tenant("b", weight=2.0), Tenant("a", quota={"H100": 8}, cpu_quota=64.0)]
    configuration, seeded = parse_configuration(config_text(applied, tenants), "config.yaml")
    assert configuration.policy.name == "fair" and configuration.backfill == "none"
    assert seeded == {"a": tenants[1], "b": tenants[0]}
    defaults, none = parse_configuration(config_text(None, []), "config.yaml")
    assert defaults.policy.name == parse_configuration("{}", "x")[0].policy.name and none == {}


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ("3", "workers must be a whole number (at least 1) dividing num_gpus (4), got '3'"),
        ("0", "got '0'"),
        ("x", "got 'x'"),
    ],
)
def test_a_bad_workers_cell_is_named(tmp_path: Path, cell: str, message: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(f"submit_time,duration,num_gpus,workers\n0,10,4,{cell}\n")
    with pytest.raises(ValueError) as caught:
        load_csv(path)
    assert str(caught.value).endswith(message) and ":2: " in str(caught.value)
