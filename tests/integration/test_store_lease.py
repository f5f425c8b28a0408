"""The leader lease and its fencing on real SQLite and PostgreSQL stores.

Leases are judged by injected monotonic clocks, one per contender (as on two machines whose
clocks need not agree), so expiry is tested without waiting for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select, text

from aicluster.core import JobState, Tenant, jobspec_from_mapping
from aicluster.store import LeaseLost, Store, leader_lock
from aicluster.store.leader import LeaderLease
from aicluster.store.schema import events, leases

pytestmark = pytest.mark.integration
#: Tests of what only one database does (the ``store`` fixture's backend, chosen).
POSTGRES_ONLY = pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
SQLITE_ONLY = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


class Monotonic:
    """A monotonic clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lease(store: Store, clock: Monotonic, holder: str) -> LeaderLease:
    return leader_lock(store, holder=holder, monotonic=clock)


def submit(store: Store, name: str = "job") -> str:
    spec = jobspec_from_mapping({"name": name, "entrypoint": "t.py", "workers": 1})
    job, _ = store.submit_job("team", spec, "user:u")
    return job.id


def lease_row(store: Store) -> tuple[str, int, int]:
    with store.engine.connect() as connection:
        row = connection.execute(select(leases).where(leases.c.name == "control")).one()
    return row.holder, row.epoch, row.renewals


def event_epochs(store: Store, job_id: str) -> list[int | None]:
    with store.engine.connect() as connection:
        query = select(events.c.epoch).where(events.c.job_id == job_id).order_by(events.c.id)
        return [epoch for (epoch,) in connection.execute(query)]


@pytest.fixture
def team(store: Store) -> Store:
    store.create_tenant(Tenant("team"), "admin")
    return store


def test_a_deposed_leaders_fenced_writes_change_nothing(team: Store) -> None:
    """Release and take over (works on both databases): the old epoch's writes are refused,
    the API's unfenced writes are not, and the new leader's events carry its epoch."""
    a = lease(team, Monotonic(), "a")
    assert a.try_acquire() and a.epoch == 1 and lease_row(team) == ("a", 1, 0)
    old = team.fenced(a.fence)  # type: ignore[arg-type]
    job = submit(team)
    old.transition(job, JobState.STARTING, "control-loop")
    assert event_epochs(team, job) == [None, 1]  # the submission is the API's: unfenced

    a.release()
    b = lease(team, Monotonic(), "b")
    assert b.try_acquire() and b.epoch == 2 and lease_row(team)[:2] == ("b", 2)
    with pytest.raises(LeaseLost):
        old.transition(job, JobState.RUNNING, "control-loop")
    with pytest.raises(LeaseLost):
        old.check_fence()
    assert team.get_job(None, job).state is JobState.STARTING

    new = team.fenced(b.fence)  # type: ignore[arg-type]
    new.check_fence()
    new.transition(job, JobState.RUNNING, "control-loop")
    submit(team, "other")  # the API writes whoever leads
    assert event_epochs(team, job) == [None, 1, 2]
    with team.engine.connect() as connection:
        elected = connection.execute(
            select(events.c.epoch, events.c.details)
            .where(events.c.kind == "leader.elected")
            .order_by(events.c.id)
        ).all()
    assert [epoch for epoch, _ in elected] == [1, 2]
    assert elected[1][1]["holder"] == "b"


@POSTGRES_ONLY
def test_a_standby_takes_over_only_after_a_lease_without_renewals(team: Store) -> None:
    clock_a, clock_b, clock_c = Monotonic(), Monotonic(), Monotonic()
    a = lease(team, clock_a, "a")
    b, c = lease(team, clock_b, "b"), lease(team, clock_c, "c")
    assert a.try_acquire()
    fenced = team.fenced(a.fence)  # type: ignore[arg-type]
    assert not b.try_acquire() and not c.try_acquire()  # both start watching the row

    for _ in range(5):  # renewals every 3 s keep a leading however long it runs
        clock_a.now += 3.0
        clock_b.now += 3.0
        assert a.renew_if_due()
        assert not b.try_acquire()
    assert lease_row(team) == ("a", 1, 5)

    clock_b.now += 14.9  # b has seen no change for 14.9 s: not yet
    assert not b.try_acquire()
    clock_a.now += 9.9  # a's own deadline (10 s after its last renewal) comes first
    assert a.still_leader()
    clock_a.now += 0.2
    assert not a.still_leader() and not a.held
    clock_b.now += 0.2
    assert b.try_acquire() and b.epoch == 2  # one compare-and-set on the row it watched
    clock_c.now += 30
    assert not c.try_acquire()  # c saw the takeover only now: it waits a lease again
    assert not a.renew()
    with pytest.raises(LeaseLost):
        fenced.check_fence()


@POSTGRES_ONLY
def test_a_renewal_that_finds_a_takeover_ends_leadership(team: Store) -> None:
    clock_a, clock_b = Monotonic(), Monotonic()
    a, b = lease(team, clock_a, "a"), lease(team, clock_b, "b")
    assert a.try_acquire()
    fenced = team.fenced(a.fence)  # type: ignore[arg-type]
    assert not b.try_acquire()
    clock_b.now += 15.0  # a is "frozen": its clock says nothing passed
    assert b.try_acquire() and b.epoch == 2
    assert a.still_leader()  # by its own clock a would go on: the epoch stops it
    job = submit(team)
    with pytest.raises(LeaseLost):
        fenced.transition(job, JobState.STARTING, "control-loop")
    assert not a.still_leader()  # the refused write revoked the fence
    assert not a.renew()
    assert team.get_job(None, job).state is JobState.PENDING
    assert event_epochs(team, job) == [None]
    a.release()  # a no-op: the row is b's
    assert lease_row(team)[:2] == ("b", 2)
    b.release()
    assert lease_row(team)[:2] == ("", 2)
    assert a.try_acquire() and a.epoch == 3  # a released lease is taken at once


@POSTGRES_ONLY
def test_a_takeover_waits_for_the_old_leaders_open_write(team: Store) -> None:
    """The fence's share lock: a write that began under epoch 1 commits before epoch 2 exists,
    and its event precedes the takeover's."""
    clock_a, clock_b = Monotonic(), Monotonic()
    a, b = lease(team, clock_a, "a"), lease(team, clock_b, "b")
    assert a.try_acquire()
    fenced = team.fenced(a.fence)  # type: ignore[arg-type]
    job = submit(team)
    assert not b.try_acquire()
    clock_b.now += 15.0
    inside, done = threading.Event(), threading.Event()

    def slow_write() -> None:
        with fenced._write() as connection:
            fenced._log(connection, actor="control-loop", kind="job.test", job_id=job)
            inside.set()
            time.sleep(1.0)
        done.set()

    writer = threading.Thread(target=slow_write)
    writer.start()
    assert inside.wait(10)
    started = time.monotonic()
    assert b.try_acquire()
    assert done.is_set() and time.monotonic() - started >= 0.5
    writer.join()
    with team.engine.connect() as connection:
        rows = connection.execute(
            select(events.c.kind, events.c.epoch).order_by(events.c.id.desc()).limit(2)
        ).all()
    assert [tuple(row) for row in rows] == [("leader.elected", 2), ("job.test", 1)]


@POSTGRES_ONLY
def test_postgres_sessions_do_not_idle_in_a_transaction(team: Store) -> None:
    with team.engine.connect() as connection:
        value = connection.execute(text("SHOW idle_in_transaction_session_timeout")).scalar()
    assert value == "10s"


@SQLITE_ONLY
def test_sqlite_keeps_its_flock_with_an_epoch(team: Store) -> None:
    a, b = lease(team, Monotonic(), "a"), lease(team, Monotonic(), "b")
    assert a.try_acquire() and a.epoch == 1
    assert not b.try_acquire()  # the flock decides
    assert a.renew() and a.still_leader()
    a.release()
    assert b.try_acquire() and b.epoch == 2
    assert a.try_acquire() is False


@POSTGRES_ONLY
def test_a_frozen_leader_process_wakes_up_fenced(team: Store) -> None:
    """A real process that writes through its fenced store without pause (so it is most likely
    frozen inside a transaction, holding the lease row's share lock): SIGSTOP it, take over,
    SIGCONT it. The server ends its idle transaction, the takeover goes through, and the woken
    writer's next write is refused: nothing of its epoch is logged after the takeover."""
    url = team.engine.url.render_as_string(hide_password=False)
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("fence_worker.py")), url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "leader 1"
        time.sleep(1.0)  # writing all along
        os.kill(child.pid, signal.SIGSTOP)
        standby = leader_lock(team, holder="standby", lease_s=3.0, renew_s=1.0, margin_s=1.0)
        started = time.monotonic()
        assert standby.acquire(timeout=30, poll=0.2) and standby.epoch == 2
        took = time.monotonic() - started
        os.kill(child.pid, signal.SIGCONT)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    print(f"took over in {took:.1f}s; the woken writer said: {out.split()}")
    assert child.returncode == 0, out + err
    assert "refused" in out, out + err
    assert took < 3.0 + 10.0 + 5.0  # the lease, the server's idle-transaction timeout, polling
    with team.engine.connect() as connection:
        elected = connection.execute(
            select(events.c.id).where(events.c.kind == "leader.elected", events.c.epoch == 2)
        ).scalar_one()
        written = connection.execute(
            select(events.c.id, events.c.epoch).where(events.c.kind == "test.write")
        ).all()
    assert written and all(epoch == 1 for _, epoch in written)
    assert max(event_id for event_id, _ in written) < elected, "a write after the takeover"


@POSTGRES_ONLY
def test_a_shorter_lease_scales_its_renewals_and_margin(team: Store) -> None:
    """``--lease-s 6`` (the servers' setting, which the failover tests use): renewals every
    1.2 s, the leader stops acting 4 s after its last renewal, a standby takes over at 6 s."""
    clock_a, clock_b = Monotonic(), Monotonic()
    a = leader_lock(team, holder="a", lease_s=6.0, monotonic=clock_a)
    b = leader_lock(team, holder="b", lease_s=6.0, monotonic=clock_b)
    assert (a.renew_s, a.margin_s) == pytest.approx((1.2, 2.0))
    assert a.try_acquire() and not b.try_acquire()
    clock_a.now += 3.9
    assert a.still_leader()
    clock_a.now += 0.2
    assert not a.still_leader()
    clock_b.now += 5.9
    assert not b.try_acquire()
    clock_b.now += 0.2
    assert b.try_acquire() and b.epoch == 2
