"""Crash safety of the control plane: a real server process, SIGKILLed mid-work, then restarted.

1. 200 concurrent submissions (60 at once, the rest 10 ms apart), each with its own
   ``Idempotency-Key``; the server is SIGKILLed once 20 are acknowledged (HTTP 201). After the
   restart every submission that was not acknowledged is retried with its key, as a client
   would. Every acknowledged job exists exactly once with the id it was acknowledged with,
   every retried one exactly once, and nothing is doubled (SQLite, and PostgreSQL with
   ``--db``).
2. A gang RUNNING on Ray when the server dies is reconciled by the restarted control loop, not
   relaunched: the same attempt, no new run directory, the same processes (their telemetry goes on
   through the outage), and the job ends SUCCEEDED.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from serverproc import (
    ServerProcess,
    admin_token,
    job_state,
    last_step,
    pg_schema,
    placement_group_state,
    release_job_spec,
    servers_cleanup,
    starts,
    stop_gangs,
    telemetry_steps,
    wait_for,
    write_tenants,
)

from aicluster.runtime import RunDir
from aicluster.runtime.layout import gang_name

pytestmark = pytest.mark.integration

SUBMISSIONS = 200
KILL_AFTER = 20  # acknowledgements before the SIGKILL
BURST = 60  # submissions sent at once; the others follow one every STAGGER_S
STAGGER_S = 0.01

TENANTS: dict[str, dict[str, Any]] = {
    "team-a": {"quota": {"sim-gpu": 16}, "borrow_limit": {"sim-gpu": 16}},
    # No GPUs and no borrowing: its jobs wait (over quota) however many arrive, so a burst of
    # submissions exercises the store and the loop without flooding 4 Ray nodes with gangs.
    "burst": {"quota": {"sim-gpu": 0}, "borrow_limit": {"sim-gpu": 0}},
}


def burst_spec(index: int) -> str:
    return (
        f'{{"name": "burst-{index}", "tenant": "burst", "module": "never_runs",'
        f' "resources": {{"gpus": 1, "gpu_type": "sim-gpu"}}}}'
    )


def key_of(index: int) -> str:
    return f"crash-test-{index:03d}"


@dataclass
class Submission:
    index: int
    status: int | None = None
    job_id: str | None = None
    error: str | None = None

    @property
    def key(self) -> str:
        return key_of(self.index)


def post(client: httpx.Client, index: int) -> httpx.Response:
    return client.post(
        "/v1/jobs",
        content=burst_spec(index),
        headers={"Idempotency-Key": key_of(index), "Content-Type": "application/json"},
    )


def fire(server: ServerProcess, token: str) -> list[Submission]:
    """Send every submission at once from its own thread; SIGKILL the server after KILL_AFTER
    acknowledgements. Returns what each thread saw."""
    submissions = [Submission(i) for i in range(SUBMISSIONS)]
    acked = 0
    lock = threading.Lock()
    enough = threading.Event()
    start = threading.Barrier(SUBMISSIONS + 1)
    limits = httpx.Limits(max_connections=SUBMISSIONS, max_keepalive_connections=SUBMISSIONS)
    client = httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Bearer {token}"},
        timeout=120,
        limits=limits,
    )

    def submit(submission: Submission) -> None:
        nonlocal acked
        start.wait()
        # The first BURST at once (many in flight when the kill lands), the rest 10 ms apart:
        # a server fast enough to answer all 200 before the kill landed left nothing for the
        # retries (seen in CI); now some are always still to come.
        time.sleep(max(0, submission.index - BURST) * STAGGER_S)
        try:
            response = post(client, submission.index)
        except httpx.HTTPError as error:  # the server died with this request in flight
            submission.error = f"{type(error).__name__}: {error}"
            return
        submission.status = response.status_code
        if response.status_code == 201:
            submission.job_id = response.json()["id"]
            with lock:
                acked += 1
                if acked == KILL_AFTER:
                    # Killed from the thread that saw the threshold: waking the main thread first
                    # let a fast server answer every submission before the kill landed.
                    server.kill()
                    enough.set()
        else:
            submission.error = response.text

    threads = [threading.Thread(target=submit, args=(s,)) for s in submissions]
    for thread in threads:
        thread.start()
    start.wait()
    assert enough.wait(120), "fewer than KILL_AFTER acknowledgements" + server.context()
    for thread in threads:
        thread.join(timeout=120)
    client.close()
    return submissions


def jobs_in_store(server: ServerProcess, db_url: str | None) -> list[dict[str, Any]]:
    """The burst tenant's jobs straight from the database (not through the server)."""
    query = "SELECT id, name, idempotency_key, state FROM jobs WHERE tenant = 'burst'"
    if db_url is None:
        with sqlite3.connect(server.state_dir / "aicluster.db") as connection:
            return [
                dict(zip(("id", "name", "key", "state"), row, strict=True))
                for row in connection.execute(query)
            ]
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(text(query)).all()
    finally:
        engine.dispose()
    return [dict(zip(("id", "name", "key", "state"), row, strict=True)) for row in rows]


def submitted_events(server: ServerProcess, token: str, job_ids: list[str]) -> dict[str, int]:
    """How many ``job.submitted`` events each job has in the event log (via the API)."""
    counts: dict[str, int] = {}
    with server.client(token) as client:
        for job_id in job_ids:
            events = client.get(f"/v1/jobs/{job_id}/events").json()
            counts[job_id] = sum(1 for event in events if event["kind"] == "job.submitted")
    return counts


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    if request.param == "sqlite":
        yield None
        return
    with pg_schema(request.getfixturevalue("pg_database")) as url:
        yield url


def test_acknowledged_submissions_survive_a_sigkill_exactly_once(
    ray_cluster: Any, tmp_path: Path, db_url: str | None
) -> None:
    state = tmp_path / "state"
    tenants = write_tenants(tmp_path / "tenants.json", TENANTS)
    server = ServerProcess(
        "server", state, tmp_path, ray_address=ray_cluster.address, db_url=db_url, tenants=tenants
    )
    with servers_cleanup(server):
        server.start()
        server.wait_for(server.is_leader, 120, "the server to lead")
        token = admin_token(state)

        submissions = fire(server, token)
        acked = {s.index: s.job_id for s in submissions if s.status == 201}
        unexpected = [s for s in submissions if s.status not in (None, 201)]
        assert not unexpected, f"refused submissions: {unexpected[:3]}" + server.context()
        assert len(acked) >= KILL_AFTER
        assert len(acked) < SUBMISSIONS, "the kill landed after every submission was answered"
        in_flight = sum(s.error is not None and "ConnectError" not in s.error for s in submissions)
        print(f"acknowledged before the kill: {len(acked)} of {SUBMISSIONS}; cut off: {in_flight}")

        server.start()
        server.wait_for(server.is_leader, 120, "the restarted server to lead")
        retried: dict[int, str] = {}
        created_by_retry = 0
        with server.client(token) as client:
            for submission in submissions:
                if submission.index in acked:
                    continue
                response = post(client, submission.index)
                assert response.status_code == 201, response.text + server.context()
                retried[submission.index] = response.json()["id"]
                created_by_retry += 1
            # A retry of an acknowledged submission returns the job it was acknowledged with.
            for index in list(acked)[:10]:
                response = post(client, index)
                assert response.status_code == 201, response.text
                assert response.json()["id"] == acked[index]

        rows = jobs_in_store(server, db_url)
        by_key: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_key.setdefault(row["key"], []).append(row)
        doubled = {key: found for key, found in by_key.items() if len(found) > 1}
        assert not doubled, f"submissions stored twice: {doubled}"
        assert len(rows) == SUBMISSIONS, f"{len(rows)} jobs stored for {SUBMISSIONS} submissions"
        for index in range(SUBMISSIONS):
            (row,) = by_key[key_of(index)]
            assert row["name"] == f"burst-{index}"
            expected = acked.get(index) or retried[index]
            assert row["id"] == expected, f"{key_of(index)}: stored {row['id']}, told {expected}"
        assert {row["state"] for row in rows} == {"PENDING"}
        events = submitted_events(server, token, [row["id"] for row in rows])
        assert set(events.values()) == {1}, "a job was logged as submitted more than once"
        with server.client(token) as client:
            listed = client.get("/v1/jobs", params={"tenant": "burst", "limit": 1000}).json()
        assert sorted(job["id"] for job in listed["jobs"]) == sorted(row["id"] for row in rows)


def test_running_gang_is_reconciled_not_relaunched(ray_cluster: Any, tmp_path: Path) -> None:
    state, release = tmp_path / "state", tmp_path / "release"
    tenants = write_tenants(tmp_path / "tenants.json", TENANTS)
    server = ServerProcess(
        "server", state, tmp_path, ray_address=ray_cluster.address, tenants=tenants
    )
    with stop_gangs(state, release), servers_cleanup(server):
        server.start()
        server.wait_for(server.is_leader, 120, "the server to lead")
        token = admin_token(state)
        with server.client(token) as client:
            spec = release_job_spec("survivor", "team-a", release)
            response = client.post("/v1/jobs", content=spec)
            assert response.status_code == 201, response.text
            job_id = response.json()["id"]

            def job() -> dict[str, Any]:
                return dict(client.get(f"/v1/jobs/{job_id}").json())

            server.wait_for(lambda: job()["state"] == "RUNNING", 180, f"{job_id} to run")
        run = RunDir(state, job_id, 1)
        server.wait_for(lambda: last_step(run, 2) >= 3, 120, "steps from every rank")
        before = starts(run, 2)
        assert all(len(pids) == 1 for pids in before), before

        server.kill()
        at_kill = last_step(run, 2)
        # No control plane runs now; the gang must not notice.
        wait_for(
            lambda: last_step(run, 2) >= at_kill + 3,
            120,
            "the gang to go on training while the server is down",
            [server],
        )

        server.start()
        server.wait_for(server.is_leader, 120, "the restarted server to lead")
        with server.client(token) as client:
            # The restarted loop has adopted the job once its state counts it as running.
            server.wait_for(
                lambda: client.get("/v1/cluster").json()["running_jobs"] == 1,
                120,
                "the restarted loop to adopt the running job",
            )
            resumed = last_step(run, 2)
            server.wait_for(  # a few control-loop ticks later, still the same gang
                lambda: last_step(run, 2) >= resumed + 5,
                120,
                "the adopted gang's telemetry to advance",
            )
            record = client.get(f"/v1/jobs/{job_id}").json()
            assert record["state"] == "RUNNING", record
            assert record["attempt"] == 1, record
            assert RunDir.attempts(state, job_id) == [1], "a new attempt was started"
            assert starts(run, 2) == before, "a rank process was started again"
            assert placement_group_state(gang_name(job_id, 1)) == "CREATED"

            release.touch()
            server.wait_for(lambda: job_state(client, job_id) == "SUCCEEDED", 180, "success")
            record = client.get(f"/v1/jobs/{job_id}").json()
            events = client.get(f"/v1/jobs/{job_id}/events").json()
        server.wait_for(  # the ended gang gives its Ray resources back
            lambda: placement_group_state(gang_name(job_id, 1)) in (None, "REMOVED"),
            120,
            "the finished gang's placement group to be removed",
        )
        assert record["attempt"] == 1 and record["restarts"] == 0, record
        assert RunDir.attempts(state, job_id) == [1]
        assert [run.exit_record(rank)["exit_code"] for rank in range(2)] == [0, 0]
        assert starts(run, 2) == before
        for steps in telemetry_steps(run, 2):  # one process per rank: steps 1, 2, 3, ... once
            assert steps == list(range(1, len(steps) + 1))
        moves = [event["to_state"] for event in events if event["kind"] == "job.transition"]
        assert moves == ["STARTING", "RUNNING", "SUCCEEDED"], moves
