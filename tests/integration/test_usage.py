"""Usage per tenant and per job (store/usage.py, core/usage.py, GET /v1/usage, aicluster usage)
on a real store (SQLite and PostgreSQL) and a real API server: GPU-hours are GPUs x the time
each job ran (the runtime's measurement where it has one, on the embedded Ray cluster; else the
time the store recorded it RUNNING), kWh the power model over it, a tenant's total the sum of
its jobs', and a member sees only its own tenant's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apiserver import RunningServer, serve_tenants
from looprun import live_loop, run_until, state_of
from shipping import JOBS, ship
from typer.testing import CliRunner

from aicluster.cli.main import app as cli_app
from aicluster.core import (
    DomainLevel,
    GpuPower,
    JobState,
    ManualClock,
    Node,
    Placement,
    Slot,
    Tenant,
    jobspec_from_mapping,
)
from aicluster.core.usage import usage
from aicluster.runtime import RunDir, Runtime
from aicluster.scheduler import SchedulerConfig
from aicluster.store import Role, Store

pytestmark = pytest.mark.integration

NODES = [Node("n0", 8, "H100", "rack-0", "pod-0"), Node("n1", 8, "A100", "rack-0", "pod-0")]


def _job(store: Store, tenant: str, name: str, node: str, gpus: int, cpus: float = 0.0) -> str:
    spec = jobspec_from_mapping({"name": name, "entrypoint": "t.py", "tenant": tenant})
    job, _ = store.submit_job(tenant, spec, "test")
    slot = Slot(node, gpus, 0, cpus, 0.0)
    store.transition(
        job.id, JobState.STARTING, "loop", placement=Placement((slot,), DomainLevel.NODE, node)
    )
    return job.id


def _runs(store: Store, clock: ManualClock) -> tuple[dict[str, str], float]:
    """a1: 4 H100 GPUs, 8 CPUs, runs 1000 s, restarts, runs 500 s more; a2: 2 A100 GPUs, runs
    from 2000 s on (still running at 4000 s); b1: 8 H100 GPUs, 100 s."""
    store.upsert_nodes(NODES)
    for name in ("a", "b"):
        store.create_tenant(Tenant(name), "admin")
    t0 = clock.now()
    jobs = {
        "a1": _job(store, "a", "one", "n0", 4, cpus=8.0),
        "a2": _job(store, "a", "two", "n1", 2),
        "b1": _job(store, "b", "x", "n0", 8),
    }
    for at, job, state in [
        (0, "a1", JobState.RUNNING),
        (0, "b1", JobState.RUNNING),
        (100, "b1", JobState.SUCCEEDED),
        (1000, "a1", JobState.RESTARTING),
        (1200, "a1", JobState.RUNNING),
        (1700, "a1", JobState.SUCCEEDED),
        (2000, "a2", JobState.RUNNING),
    ]:
        clock.advance_to(t0 + at)
        store.transition(jobs[job], state, "loop")
    clock.advance_to(t0 + 4000)
    return jobs, t0


def test_gpu_hours_are_gpus_times_the_recorded_run_time(store: Store, clock: ManualClock) -> None:
    jobs, t0 = _runs(store, clock)
    power = {"H100": GpuPower(busy_watts=700, cpu_watts=10), "A100": GpuPower(busy_watts=400)}
    rows, totals = usage(store.job_runs(None, None, None), lambda t: power[t])
    by_id = {row.job_id: row for row in rows}
    a1, a2, b1 = by_id[jobs["a1"]], by_id[jobs["a2"]], by_id[jobs["b1"]]
    assert (a1.run_seconds, a1.gpu_hours, a1.cpu_hours) == (1500, 4 * 1500 / 3600, 8 * 1500 / 3600)
    assert a1.kwh == pytest.approx((4 * 700 + 8 * 10) * 1500 / 3.6e6)
    assert (a2.run_seconds, a2.kwh) == (2000, pytest.approx(2 * 400 * 2000 / 3.6e6))
    assert b1.gpu_hours == pytest.approx(8 * 100 / 3600)
    tenant_a = next(t for t in totals if t.tenant == "a")
    assert tenant_a.jobs == 2
    assert tenant_a.gpu_hours == pytest.approx(a1.gpu_hours + a2.gpu_hours)
    assert tenant_a.kwh == pytest.approx(a1.kwh + a2.kwh)
    # A period clips each run: [500, 2500) holds 500 + 500 s of a1 and 500 s of a2, none of b1.
    clipped, _ = usage(store.job_runs(["a", "b"], t0 + 500, t0 + 2500), lambda t: power[t])
    assert {row.job_id: row.run_seconds for row in clipped} == {jobs["a1"]: 1000, jobs["a2"]: 500}
    assert store.job_runs(["b"], t0 + 500, None) == []


@pytest.fixture(scope="module")
def server(
    module_store_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with serve_tenants(
        module_store_url,
        tmp_path_factory.mktemp("state"),
        [Tenant("a"), Tenant("b")],
        {"alice": ("a", Role.MEMBER), "bob": ("b", Role.MEMBER)},
        NODES,
    ) as running:
        store = running.plane.store
        for tenant, node in (("a", "n0"), ("b", "n1")):
            job = _job(store, tenant, f"job-of-{tenant}", node, 2)
            store.transition(job, JobState.RUNNING, "loop")
        yield running


def test_a_member_sees_only_its_tenants_usage(server: RunningServer) -> None:
    seen = {}
    for who in ("alice", "bob", "admin"):
        with server.client(who) as client:
            answer = client.get("/v1/usage")
        assert answer.status_code == 200, answer.text
        seen[who] = answer.json()
    assert [t["tenant"] for t in seen["alice"]["tenants"]] == ["a"]
    assert {j["tenant"] for j in seen["alice"]["jobs"]} == {"a"}
    assert [t["tenant"] for t in seen["bob"]["tenants"]] == ["b"]
    assert [t["tenant"] for t in seen["admin"]["tenants"]] == ["a", "b"]
    assert seen["alice"]["jobs"][0]["gpus"] == 2 and seen["alice"]["jobs"][0]["gpu_hours"] > 0
    with server.client("alice") as alice:
        assert alice.get("/v1/usage", params={"tenant": "b"}).status_code == 404
        assert alice.get("/v1/usage", params={"since": 10, "until": 5}).status_code == 422
        assert alice.get("/v1/usage", params={"since": "soon"}).status_code == 422
        assert alice.get("/v1/usage", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_the_cli_prints_a_table_and_csv(server: RunningServer) -> None:
    def cli(*args: str) -> Any:
        target = ["--url", server.url, "--token", server.tokens["alice"]]
        return CliRunner().invoke(cli_app, ["usage", *args, *target], env={"COLUMNS": "100"})

    table = cli()
    assert table.exit_code == 0, table.output
    assert "gpu-hours" in table.output and "\na " in table.output
    csv = cli("-o", "csv", "--since", "1h")
    assert csv.exit_code == 0, csv.output
    header, *rows = csv.output.splitlines()
    assert header == "tenant,job_id,name,gpus,cpus,run_seconds,gpu_hours,cpu_hours,kwh"
    assert len(rows) == 1 and rows[0].startswith("a,")
    bad = cli("--since", "yesterday")
    assert bad.exit_code == 2 and "--since 'yesterday'" in bad.output


def test_usage_counts_the_run_time_the_runtime_measured(tmp_path: Path, runtime: Runtime) -> None:
    """On the embedded Ray cluster: a job of 2 ranks of 1 GPU that sleeps 2 s. Its usage is
    GPUs x the run the runtime measured (its ranks' exit records: first process start to last
    exit), not the loop's RUNNING interval, which it sees a tick late at each end."""
    store = Store.open(f"sqlite:///{tmp_path / 'live.db'}")
    store.create_tenant(Tenant("a"), "test")
    spec = {
        "name": "sleeper",
        "entrypoint": "sleeps.py",
        "code": ship(runtime.state_dir, "a", JOBS),
        "workers": 2,
        "args": ["2"],
        "resources": {"gpus": 1, "cpus": 1, "memory_gb": 0.1},
    }
    job = store.submit_job("a", jobspec_from_mapping(spec), "u")[0].id
    power = GpuPower(busy_watts=300.0, cpu_watts=10.0)
    with live_loop(store, runtime, SchedulerConfig(queue="fifo"), estimates=None) as loop:
        run_until(loop, lambda: state_of(loop, job).terminal)
        assert state_of(loop, job) is JobState.SUCCEEDED
        run = RunDir(runtime.state_dir, job, store.get_job(None, job).attempt)
        exits = [run.exit_record(rank) for rank in range(2)]
        rows, totals = usage(store.job_runs(["a"], None, None), lambda _: power)
        events = store.events(job)
    assert all(e is not None for e in exits)
    measured = max(e["finished_at"] for e in exits) - min(e["started_at"] for e in exits)
    assert 2.0 <= measured < 30
    (row,) = rows
    assert row.run_seconds == pytest.approx(measured, rel=0.01)
    assert row.gpu_hours == pytest.approx(2 * measured / 3600, rel=0.01)
    assert row.kwh == pytest.approx((2 * 300 + 2 * 10) * measured / 3.6e6, rel=0.01)
    assert totals[0].gpu_hours == row.gpu_hours
    stored = [e.at for e in events if JobState.RUNNING.value in (e.to_state, e.from_state)]
    print(f"measured {measured:.3f} s; the store's RUNNING interval {stored[1] - stored[0]:.3f} s")
