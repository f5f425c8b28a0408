"""Two control-plane servers on one PostgreSQL store: freeze or kill the leader in the middle of
a burst of submissions and running jobs, and read what the store says happened.

Shared by ``test_control_fencing.py`` (which asserts) and ``bench/failover.py`` (which prints the
takeover times). A *round*: the standby receives ``submissions`` short jobs (with idempotency
keys) while the leader runs them; once some run, the leader gets SIGSTOP (then SIGCONT after the
takeover) or SIGKILL; the standby takes over; after a while the round's unfinished jobs are
cancelled and everything is read back from the database.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from serverproc import (
    ServerProcess,
    admin_token,
    jobs_code,
    pg_schema,
    servers_cleanup,
    starts,
    stop_gangs,
    wait_for,
    write_tenants,
)
from sqlalchemy import Engine, create_engine, text

from aicluster.runtime import RunDir

#: One tenant; 8 one-GPU jobs run at a time, the rest queue.
TENANTS = {"fence": {"quota": {"sim-gpu": 8}, "borrow_limit": {"sim-gpu": 0}}}
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
#: Jobs the new leader must start and finish before a round's leftovers are cancelled: the
#: tests ask for one (it leads for real); two leave a margin without waiting for more.
RAN_AFTER = 2
#: The most seconds, from the takeover, that a round waits for them (it goes on as soon as they
#: have run). On a quiet machine they end 10 to 30 s after the takeover; at a load average of 15
#: on two cores a launch took 20 to 45 s (the new leader first finishes the launches the old one
#: left, four at a time) and a 0.9 s job ran for 15 s: 60 to 70 s in all, and a fixed window of
#: 45 s after the submissions cancelled the new leader's jobs half-way and counted none.
RAN_AFTER_S = 240.0


def short_job(name: str) -> str:
    """A one-rank job of ``jobs/steps.py``: 3 steps of 0.3 s, then exit 0."""
    return json.dumps(
        {
            "name": name,
            "tenant": "fence",
            "entrypoint": "steps.py",
            "code": jobs_code(),
            "args": ["--steps", "3", "--step-seconds", "0.3"],
            "workers": 1,
            "resources": {"gpus": 1, "cpus": 1, "memory_gb": 0.5, "gpu_type": "sim-gpu"},
            "max_restarts": 0,
            "env": {"OMP_NUM_THREADS": "1"},
        }
    )


@dataclass
class Pair:
    """Two servers on one store, one Ray cluster and one (shared) state directory."""

    servers: list[ServerProcess]
    state: Path
    db_url: str
    engine: Engine
    token: str = ""

    def roles(self) -> tuple[ServerProcess, ServerProcess]:
        """(leader, standby), waiting until exactly one leads."""
        found: list[ServerProcess] = []

        def one() -> bool:
            nonlocal found
            found = [s for s in self.servers if s.is_leader()]
            return len(found) == 1

        wait_for(one, 120, "exactly one leader", self.servers)
        leader = found[0]
        return leader, next(s for s in self.servers if s is not leader)

    def sql(self, query: str, **params: Any) -> list[Any]:
        with self.engine.connect() as connection:
            return list(connection.execute(text(query), params).all())

    def context(self) -> str:
        return "".join(server.context() for server in self.servers)


#: The tests' leader lease (seconds): a takeover waits for it, and 15 s (the default) adds up.
TEST_LEASE_S = 6.0


@contextmanager
def pair_of_servers(
    ray_address: str, pg_database: str, tmp_path: Path, lease_s: float | None = None
) -> Iterator[Pair]:
    """Server a leads (started first), server b stands by, on a fresh schema; ``lease_s``: the
    servers' leader lease (None: their default, as ``bench/failover.py`` measures it)."""
    lease = ("--lease-s", str(lease_s)) if lease_s is not None else ()
    state = tmp_path / "state"
    tenants = write_tenants(tmp_path / "tenants.json", TENANTS)
    with pg_schema(pg_database) as db_url:
        a, b = (
            ServerProcess(
                name,
                state,
                tmp_path,
                ray_address=ray_address,
                db_url=db_url,
                tenants=tenants,
                extra_args=lease,
            )
            for name in ("server-a", "server-b")
        )
        engine = create_engine(db_url)
        try:
            with stop_gangs(state), servers_cleanup(a, b):
                a.start()
                a.wait_for(a.is_leader, 120, "server a to lead")
                b.start()
                yield Pair([a, b], state, db_url, engine, admin_token(state))
        finally:
            engine.dispose()


@dataclass
class Round:
    """What one round did and what the store says about it."""

    how: str  # "SIGSTOP" or "SIGKILL"
    prefix: str
    old: ServerProcess
    new: ServerProcess
    signalled_at: float  # wall clock
    takeover_s: float = 0.0  # signal -> the new holder's lease row (its acquired_at)
    leads_s: float = 0.0  # signal -> the new leader's /healthz says so
    old_epoch: int = 0
    new_epoch: int = 0
    acked: dict[str, str] = field(default_factory=dict)  # idempotency key -> job id
    refused: list[str] = field(default_factory=list)
    ran_after: int = 0  # jobs the new leader started and finished
    waited: str = ""  # how long the round waited for them, and what it found


def lease(pair: Pair) -> tuple[str, int, float]:
    rows = pair.sql("SELECT holder, epoch, acquired_at FROM leases WHERE name = 'control'")
    holder, epoch, acquired_at = rows[0]
    return str(holder), int(epoch), float(acquired_at)


def holder_pid(holder: str) -> int:
    return int(holder.split("/")[1])  # host/pid/random


def round_jobs(pair: Pair, prefix: str) -> dict[str, tuple[str, str, int, int]]:
    """key -> (id, state, attempt, restarts) of the round's jobs, straight from the store."""
    rows = pair.sql(
        "SELECT idempotency_key, id, state, attempt, restarts FROM jobs "
        "WHERE idempotency_key LIKE :like",
        like=f"{prefix}-%",
    )
    return {row[0]: (row[1], row[2], row[3], row[4]) for row in rows}


def run_round(
    pair: Pair,
    how: str,
    prefix: str,
    *,
    submissions: int = 200,
    pace_s: float = 0.05,
    after_s: float = RAN_AFTER_S,
) -> Round:
    """One round (see the module docstring); returns once every job of it has ended. Its
    leftovers are cancelled once the new leader has started and finished :data:`RAN_AFTER`
    jobs, or ``after_s`` after the takeover."""
    leader, standby = pair.roles()
    assert leader.process is not None
    acked: dict[str, str] = {}
    refused: list[str] = []
    done = threading.Event()

    def submit() -> None:  # to the standby: user requests do not need the leader
        headers = {"Authorization": f"Bearer {pair.token}", "Content-Type": "application/json"}
        with httpx.Client(base_url=standby.url, headers=headers, timeout=60) as client:
            for index in range(submissions):
                key = f"{prefix}-{index:03d}"
                for _ in range(3):
                    try:
                        response = client.post(
                            "/v1/jobs",
                            content=short_job(f"{prefix}-{index}"),
                            headers={"Idempotency-Key": key},
                        )
                    except httpx.HTTPError as error:
                        refused.append(f"{key}: {error}")
                        continue
                    if response.status_code == 201:
                        acked[key] = response.json()["id"]
                    else:
                        refused.append(f"{key}: {response.status_code} {response.text[:200]}")
                    break
                time.sleep(pace_s)
        done.set()

    thread = threading.Thread(target=submit, name="submissions", daemon=True)
    thread.start()

    def running() -> int:
        states = [job[1] for job in round_jobs(pair, prefix).values()]
        return sum(state in ("RUNNING", "SUCCEEDED") for state in states)

    wait_for(
        lambda: len(acked) >= submissions // 4 and running() >= 4,
        240,
        "jobs to run before the leader is stopped",
        pair.servers,
    )
    _, old_epoch, _ = lease(pair)
    signalled = time.time()
    started = time.monotonic()
    if how == "SIGSTOP":  # the whole session: the server and anything it spawned
        os.killpg(leader.process.pid, signal.SIGSTOP)
    else:
        leader.kill()
    wait_for(standby.is_leader, 120, f"the standby to lead after the {how}", [standby])
    took_over = time.monotonic()
    leads_s = took_over - started
    holder, new_epoch, acquired_at = lease(pair)
    result = Round(how, prefix, leader, standby, signalled, acquired_at - signalled, leads_s)
    result.old_epoch, result.new_epoch = old_epoch, new_epoch
    assert standby.process is not None and holder_pid(holder) == standby.process.pid, holder
    if how == "SIGSTOP":
        time.sleep(2)  # the frozen leader stays frozen a little past the takeover
        os.killpg(leader.process.pid, signal.SIGCONT)
        wait_for(lambda: not leader.is_leader(), 60, "the old leader to stand down", [leader])
    assert done.wait(300), "the submissions did not finish" + pair.context()
    thread.join()
    result.acked, result.refused = acked, refused

    # The new leader runs some of the round's jobs to the end; then the rest are cancelled.
    def started_after() -> dict[str, int]:
        """The round's jobs the new leader started (moved to STARTING), by their state now."""
        query = (
            "SELECT j.state, count(DISTINCT j.id) FROM events e JOIN jobs j ON j.id = e.job_id "
            "WHERE e.kind = 'job.transition' AND e.to_state = 'STARTING' AND e.epoch = :epoch "
            "AND j.idempotency_key LIKE :like GROUP BY j.state"
        )
        rows = pair.sql(query, epoch=new_epoch, like=f"{prefix}-%")
        return {str(state): int(count) for state, count in rows}

    deadline = took_over + after_s
    while (found := started_after()).get("SUCCEEDED", 0) < RAN_AFTER:
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    result.ran_after = found.get("SUCCEEDED", 0)
    waited_s = time.monotonic() - took_over
    result.waited = (
        f"{'waited' if result.ran_after >= RAN_AFTER else 'gave up after'} {waited_s:.1f}s "
        f"from the takeover for {RAN_AFTER}; the jobs it started, by state: "
        f"{dict(sorted(found.items()))}"
    )
    if result.ran_after < RAN_AFTER:
        print(
            f"{how}: {result.ran_after} jobs started and finished by the new leader (epoch "
            f"{new_epoch}): {result.waited}"
        )
    with standby.client(pair.token) as client:
        for key, (job_id, state, _, _) in round_jobs(pair, prefix).items():
            if state not in TERMINAL:
                response = client.post(f"/v1/jobs/{job_id}/cancel")
                assert response.status_code in (200, 202, 409), (key, response.text)
    wait_for(
        lambda: all(job[1] in TERMINAL for job in round_jobs(pair, prefix).values()),
        180,
        "every job of the round to end",
        [standby],
    )
    return result


def history(pair: Pair, job_id: str) -> str:
    """A job's events, one per line, with the epoch that wrote each: why it ended as it did."""
    rows = pair.sql(
        "SELECT at, kind, from_state, to_state, epoch, details FROM events "
        "WHERE job_id = :job ORDER BY id",
        job=job_id,
    )
    return "\n".join(
        f"  {at:.3f} {kind} {before}->{after} epoch {epoch} {details}"
        for at, kind, before, after, epoch, details in rows
    )


def problems(pair: Pair, result: Round, submissions: int = 200) -> list[str]:
    """What the store shows went wrong in a round (empty: nothing)."""
    found: list[str] = []
    jobs = round_jobs(pair, result.prefix)
    if result.refused:
        found.append(f"submissions refused: {result.refused[:3]}")
    if len(jobs) != submissions or set(jobs) != set(result.acked):
        found.append(f"{len(jobs)} jobs in the store for {len(result.acked)} acknowledged")
    for key, job_id in result.acked.items():
        if jobs.get(key, ("",))[0] != job_id:
            found.append(f"{key}: acknowledged as {job_id}, stored as {jobs.get(key)}")
    startings = dict(
        pair.sql(
            "SELECT e.job_id, count(*) FROM events e JOIN jobs j ON j.id = e.job_id "
            "WHERE e.kind = 'job.transition' AND e.to_state = 'STARTING' "
            "AND j.idempotency_key LIKE :like GROUP BY e.job_id",
            like=f"{result.prefix}-%",
        )
    )
    for key, (job_id, state, attempt, restarts) in sorted(jobs.items()):
        if state not in ("SUCCEEDED", "CANCELLED"):
            found.append(f"{key} ({job_id}) ended {state}:\n{history(pair, job_id)}")
        if restarts or attempt > 1 or startings.get(job_id, 0) != attempt:
            found.append(
                f"{key} ({job_id}): attempt {attempt}, restarts {restarts}, "
                f"{startings.get(job_id, 0)} STARTING transitions"
            )
        if attempt == 1 and state == "SUCCEEDED":
            attempts = RunDir.attempts(pair.state, job_id)
            launched = starts(RunDir(pair.state, job_id, 1), 1)
            if attempts != [1] or len(launched[0]) != 1:
                found.append(f"{key} ({job_id}): attempts {attempts}, rank starts {launched}")
    # Fencing: the takeover is logged with the new epoch; after it, nothing of an older one.
    elected = pair.sql(
        "SELECT id FROM events WHERE kind = 'leader.elected' AND epoch = :epoch",
        epoch=result.new_epoch,
    )
    if result.new_epoch != result.old_epoch + 1 or len(elected) != 1:
        found.append(f"epochs {result.old_epoch} -> {result.new_epoch}, elected {elected}")
    else:
        late = pair.sql(
            "SELECT id, kind, job_id, epoch FROM events WHERE id > :id AND epoch < :epoch",
            id=elected[0][0],
            epoch=result.new_epoch,
        )
        if late:
            found.append(f"writes of a deposed leader after the takeover: {late[:5]}")
    return found
