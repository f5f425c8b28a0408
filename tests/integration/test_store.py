"""The store on real SQLite and PostgreSQL: migrations, jobs, auth, the log, crash safety."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError

from aicluster.core import (
    DomainLevel,
    IllegalTransition,
    JobSpec,
    JobSpecError,
    JobState,
    ManualClock,
    Node,
    PendingCode,
    PendingReason,
    Placement,
    Slot,
    Tenant,
    jobspec_from_mapping,
)
from aicluster.store import (
    AuthenticationError,
    Conflict,
    IdempotencyConflict,
    NodeHealth,
    NotFound,
    Role,
    StaleState,
    Store,
    leader_lock,
    placement_from_json,
)
from aicluster.store.engine import head_revision
from aicluster.store.schema import events, jobs, metadata

pytestmark = pytest.mark.integration
WORKER = Path(__file__).with_name("store_worker.py")


def spec(name: str = "train", workers: int = 2, **fields: object) -> JobSpec:
    return jobspec_from_mapping({"name": name, "entrypoint": "t.py", "workers": workers, **fields})


@pytest.fixture
def teams(store: Store) -> Store:
    store.create_tenant(Tenant("team-a", quota={"H100": 8}, weight=2.0), "admin")
    store.create_tenant(Tenant("team-b"), "admin")
    return store


def _child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_open_refuses_what_it_cannot_serve() -> None:
    with pytest.raises(ValueError, match="in-memory"):
        Store.open("sqlite:///:memory:")
    with pytest.raises(ValueError, match="unsupported database 'mysql'"):
        Store.open("mysql://localhost/db")


def test_migrations_reach_head_and_match_the_schema(store: Store, store_url: str) -> None:
    with store.engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), metadata) == []
        version = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    assert version == head_revision() == "0016"
    Store.open(store_url).close()  # at head already: a no-op
    if store.dialect == "sqlite":
        with store.engine.connect() as connection:
            pragmas = [
                connection.execute(text(f"PRAGMA {name}")).scalar()
                for name in ("journal_mode", "synchronous", "foreign_keys")
            ]
        assert pragmas == ["wal", 2, 1]  # synchronous 2 = FULL


def test_a_service_job_keeps_its_kind_and_deployment(teams: Store) -> None:
    service = {"model": "gpt", "version": 2}
    replica, _ = teams.submit_job("team-a", spec("svc", 1), "serving", service=service)
    batch, _ = teams.submit_job("team-a", spec("train", 1), "user:ann")
    assert (replica.kind, replica.service, batch.kind, batch.service) == (
        "service", service, "batch", None
    )  # fmt: skip
    assert teams.get_job(None, replica.id) == replica
    assert [j.id for j in teams.service_jobs()] == [replica.id]
    teams.cancel_job("team-a", replica.id, "serving")
    assert teams.service_jobs() == []  # ended ones are not counted


def test_two_processes_migrate_a_fresh_store_at_once(store_url: str) -> None:
    children = [_child("open", store_url) for _ in range(2)]
    for child in children:
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        assert out.strip() == "opened"
    with Store.open(store_url) as store, store.engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1


def test_submit_is_acknowledged_with_a_pending_job_and_its_event(
    teams: Store, clock: ManualClock
) -> None:
    record, created = teams.submit_job("team-a", spec(resources={"gpus": 4}), "user:ann")
    assert created and record.state is JobState.PENDING and record.tenant == "team-a"
    assert (record.submitted_at, record.submitted_by) == (clock.now(), "user:ann")
    assert record.spec.tenant == "team-a"
    assert teams.get_job("team-a", record.id) == record
    assert record.to_job().total_gpus == 8
    [event] = teams.events(record.id)
    assert (event.kind, event.to_state, event.actor) == ("job.submitted", "PENDING", "user:ann")
    assert event.details["spec_hash"] == record.spec_hash
    with pytest.raises(NotFound, match="no tenant"):
        teams.submit_job("nobody", spec(), "user:ann")
    with pytest.raises(JobSpecError, match="names tenant 'team-b'"):
        teams.submit_job("team-a", spec(tenant="team-b"), "user:ann")


def test_a_retried_submit_with_the_same_key_returns_the_original(teams: Store) -> None:
    first, created = teams.submit_job("team-a", spec(), "user:ann", idempotency_key="abc")
    again, created_again = teams.submit_job("team-a", spec(), "user:ann", idempotency_key="abc")
    assert created and not created_again and again == first
    with pytest.raises(IdempotencyConflict, match="different spec"):
        teams.submit_job("team-a", spec(workers=3), "user:ann", idempotency_key="abc")
    other, created_other = teams.submit_job("team-b", spec(), "user:bob", idempotency_key="abc")
    assert created_other and other.id != first.id  # keys are per tenant
    assert teams.submit_job("team-a", spec(), "user:ann")[0].id != first.id  # no key: new job
    page, _ = teams.list_jobs("team-a")
    assert len(page) == 2
    with pytest.raises(ValueError, match="1 to 255"):
        teams.submit_job("team-a", spec(), "user:ann", idempotency_key="x" * 256)


def test_lifecycle_counts_attempts_and_stamps_times(teams: Store, clock: ManualClock) -> None:
    job, _ = teams.submit_job("team-a", spec(resources={"gpus": 4}), "user:ann")
    placement = Placement((Slot("n1", 4), Slot("n2", 4)), DomainLevel.RACK, "rack-0", {"x": 1.0})
    clock.advance(5)
    starting = teams.transition(
        job.id, JobState.STARTING, "control", expected_from=JobState.PENDING, placement=placement
    )
    assert starting.attempt == 1 and starting.version == 2
    assert placement_from_json(starting.placement or {}) == placement
    clock.advance(5)
    running = teams.transition(job.id, JobState.RUNNING, "control")
    assert running.started_at == clock.now()
    restarting = teams.transition(job.id, JobState.RESTARTING, "control", reason="node lost")
    assert restarting.restarts == 1
    teams.transition(job.id, JobState.RUNNING, "control")
    clock.advance(100)
    done = teams.transition(job.id, JobState.SUCCEEDED, "control", exit_code=0, reason="ok")
    assert (done.finished_at, done.exit_code, done.exit_message) == (clock.now(), 0, "ok")
    assert done.started_at == running.started_at  # the first start, not the restart
    assert teams.get_job(None, job.id) == done
    history = [(e.from_state, e.to_state) for e in teams.events(job.id)]
    assert history == [
        (None, "PENDING"),
        ("PENDING", "STARTING"),
        ("STARTING", "RUNNING"),
        ("RUNNING", "RESTARTING"),
        ("RESTARTING", "RUNNING"),
        ("RUNNING", "SUCCEEDED"),
    ]


def test_a_failed_job_keeps_how_it_failed_and_each_attempt_logs_its_own(teams: Store) -> None:
    """``failure`` goes with every failed attempt's transition (its event) and, once FAILED,
    with the job (the ``failure`` column: JSON, JSONB on PostgreSQL)."""
    job, _ = teams.submit_job("team-a", spec(), "user:ann")
    first = {"rank": 1, "node": "n2", "summary": "rank 1 on n2 was killed by SIGKILL",
             "exit_code": -9, "signal": "SIGKILL", "lost": False, "attempt": 1,
             "stderr_tail": []}  # fmt: skip
    tail = ["Traceback (most recent call last):", "ValueError: ünïcode 名前"]
    last = {**first, "summary": "rank 0 on n1 exited with code 1", "rank": 0, "node": "n1",
            "exit_code": 1, "signal": None, "attempt": 2, "stderr_tail": tail}  # fmt: skip
    teams.transition(job.id, JobState.STARTING, "control")
    restarting = teams.transition(
        job.id, JobState.RESTARTING, "control", exit_code=-9, failure=first
    )
    assert restarting.failure is None  # the job's own is how it ended: not yet
    teams.transition(job.id, JobState.PENDING, "control")
    teams.transition(job.id, JobState.STARTING, "control")
    failed = teams.transition(
        job.id, JobState.FAILED, "control", exit_code=1, reason="boom", failure=last
    )
    assert failed.failure == last and teams.get_job(None, job.id) == failed
    logged = [e.details.get("failure") for e in teams.events(job.id) if e.details.get("failure")]
    assert logged == [first, last]
    (listed,), _ = teams.list_jobs("team-a", state=[JobState.FAILED])
    assert listed.failure == last
    other, _ = teams.submit_job("team-a", spec(), "user:ann")
    assert teams.cancel_job("team-a", other.id, "user:ann").failure is None


def test_illegal_and_stale_transitions_are_refused(teams: Store) -> None:
    job, _ = teams.submit_job("team-a", spec(), "user:ann")
    with pytest.raises(IllegalTransition, match="PENDING job cannot become RUNNING"):
        teams.transition(job.id, JobState.RUNNING, "control")
    with pytest.raises(StaleState, match="is PENDING, not RUNNING"):
        teams.transition(job.id, JobState.PREEMPTING, "control", expected_from=JobState.RUNNING)
    started = teams.transition(job.id, JobState.STARTING, "control", expected_from=JobState.PENDING)
    # The same call again (a retry after a lost reply) finds it done and changes nothing.
    retried = teams.transition(job.id, JobState.STARTING, "control", expected_from=JobState.PENDING)
    assert retried == started
    with pytest.raises(NotFound):
        teams.transition("j-missing", JobState.STARTING, "control")
    assert len(teams.events(job.id)) == 2  # refused moves leave no trace
    teams.transition(job.id, JobState.FAILED, "control", exit_code=1)
    with pytest.raises(IllegalTransition):
        teams.transition(job.id, JobState.PENDING, "control")


def test_cancel_pending_at_once_and_running_by_request(teams: Store) -> None:
    waiting, _ = teams.submit_job("team-a", spec(), "user:ann")
    cancelled = teams.cancel_job("team-a", waiting.id, "user:ann", reason="typo")
    assert cancelled.state is JobState.CANCELLED and cancelled.exit_message == "typo"
    assert teams.cancel_job("team-a", waiting.id, "user:ann") == cancelled  # idempotent
    running, _ = teams.submit_job("team-a", spec(), "user:ann")
    teams.transition(running.id, JobState.STARTING, "control")
    requested = teams.cancel_job("team-a", running.id, "user:ann")
    assert requested.state is JobState.STARTING and requested.cancel_requested_at is not None
    assert [j.id for j in teams.active_jobs()] == [running.id]
    assert teams.events(running.id)[-1].kind == "job.cancel_requested"
    teams.transition(running.id, JobState.CANCELLED, "control")
    requeued, _ = teams.submit_job("team-a", spec(), "user:ann")
    teams.transition(requeued.id, JobState.STARTING, "control")
    teams.cancel_job("team-a", requeued.id, "user:ann")
    teams.transition(requeued.id, JobState.PENDING, "control", reason="preempted first")
    assert teams.cancel_job(None, requeued.id, "user:ann").state is JobState.CANCELLED
    finished, _ = teams.submit_job("team-a", spec(), "user:ann")
    teams.transition(finished.id, JobState.STARTING, "control")
    teams.transition(finished.id, JobState.SUCCEEDED, "control")
    with pytest.raises(IllegalTransition):
        teams.cancel_job("team-a", finished.id, "user:ann")


def test_tenants_cannot_see_each_others_jobs(teams: Store) -> None:
    job, _ = teams.submit_job("team-a", spec(), "user:ann")
    with pytest.raises(NotFound):
        teams.get_job("team-b", job.id)
    with pytest.raises(NotFound):
        teams.cancel_job("team-b", job.id, "user:bob")
    with pytest.raises(NotFound):
        teams.events(job.id, tenant="team-b")
    assert teams.list_jobs("team-b") == ([], None)
    assert [j.id for j in teams.list_jobs(None)[0]] == [job.id]
    assert teams.get_job(None, job.id).id == job.id  # operators and the control loop
    assert all(e.tenant in (None, "team-a") for e in teams.audit("team-a"))
    assert not [e for e in teams.audit("team-b") if e.job_id == job.id]


def test_listing_pages_filters_and_queues(teams: Store, clock: ManualClock) -> None:
    ids = []
    for n in range(7):
        clock.advance(1)
        ids.append(teams.submit_job("team-a", spec(f"j{n}"), "user:ann")[0].id)
    teams.transition(ids[0], JobState.STARTING, "control")
    seen, cursor = [], None
    while True:
        page, cursor = teams.list_jobs("team-a", limit=3, cursor=cursor)
        seen += [j.id for j in page]
        if cursor is None:
            break
    assert seen == ids[::-1]  # newest first, every job once
    pending, _ = teams.list_jobs("team-a", state=JobState.PENDING)
    assert len(pending) == 6
    both, _ = teams.list_jobs(None, state=[JobState.PENDING, JobState.STARTING], limit=100)
    assert len(both) == 7
    assert [j.id for j in teams.pending_jobs()] == ids[1:]  # oldest first
    assert [j.id for j in teams.active_jobs()] == ids[:1]
    reason = PendingReason(PendingCode.NO_CAPACITY, "needs 8 GPUs, 4 free")
    assert teams.set_pending_reasons({ids[1]: reason, ids[2]: "waiting", ids[0]: reason}) == 2
    assert teams.set_pending_reasons({ids[1]: reason}) == 0  # unchanged: no write
    waiting = teams.get_job("team-a", ids[1])
    assert (waiting.pending_code, waiting.pending_reason) == ("no-capacity", "needs 8 GPUs, 4 free")
    assert teams.get_job("team-a", ids[0]).pending_reason is None  # not PENDING: skipped


def test_the_event_log_is_a_change_feed_of_jobs(teams: Store, clock: ManualClock) -> None:
    mark = teams.newest_event_id()
    first = teams.submit_job("team-a", spec("first"), "user:ann")[0]
    clock.advance(1)  # oldest first: ids alone do not order jobs submitted in one millisecond
    second = teams.submit_job("team-b", spec("second"), "user:bob")[0]
    newest, changed = teams.jobs_changed_since(mark)
    assert [job.id for job in changed] == [first.id, second.id] and newest > mark
    assert teams.jobs_changed_since(newest) == (newest, [])  # nothing new: nothing read
    teams.cancel_job("team-a", first.id, "user:ann")
    latest, changed = teams.jobs_changed_since(newest)
    assert [(job.id, job.state) for job in changed] == [(first.id, JobState.CANCELLED)]
    assert latest == teams.newest_event_id()


def test_tokens_are_stored_hashed_and_checked(teams: Store, clock: ManualClock) -> None:
    teams.create_user("ann", "admin")
    teams.grant_role("ann", "team-a", Role.MEMBER, "admin")
    teams.grant_role("ann", "team-b", Role.VIEWER, "admin")
    issued = teams.create_token("ann", "admin", description="laptop")
    with teams.engine.connect() as connection:
        stored = connection.execute(text("SELECT token_hash FROM api_tokens")).scalar()
    assert stored == hashlib.sha256(issued.token.encode()).hexdigest()
    assert issued.token not in repr(issued)
    principal = teams.authenticate(issued.token)
    assert principal.user == "ann" and principal.token_id == issued.info.id
    assert principal.can("team-a", Role.MEMBER) and not principal.can("team-a", Role.ADMIN)
    assert principal.can("team-b", Role.VIEWER) and not principal.can("team-b", Role.MEMBER)
    assert principal.role_in("team-c") is None
    forged = issued.token[:-4] + ("AAAA" if not issued.token.endswith("AAAA") else "BBBB")
    for bad in (forged, "aic_000000000000_" + "A" * 43, "not-a-token", ""):
        with pytest.raises(AuthenticationError, match="invalid or expired token"):
            teams.authenticate(bad)
    teams.revoke_token(issued.info.id, "admin")
    with pytest.raises(AuthenticationError):
        teams.authenticate(issued.token)
    short = teams.create_token("ann", "admin", expires_at=clock.now() + 60)
    assert teams.authenticate(short.token).user == "ann"
    clock.advance(61)
    with pytest.raises(AuthenticationError):
        teams.authenticate(short.token)
    third = teams.create_token("ann", "admin")
    teams.set_user_disabled("ann", True, "admin")
    with pytest.raises(AuthenticationError):
        teams.authenticate(third.token)
    listed = {t.id: t for t in teams.list_tokens("ann")}
    assert set(listed) == {issued.info.id, short.info.id, third.info.id}
    assert listed[issued.info.id].revoked_at is not None


def test_bootstrap_admin_once_and_roles(teams: Store) -> None:
    issued = teams.bootstrap_admin()
    assert issued is not None and teams.bootstrap_admin() is None
    admin = teams.authenticate(issued.token)
    assert admin.cluster_admin and admin.can("team-b", Role.ADMIN)
    with pytest.raises(Conflict):
        teams.create_user("admin", "admin")
    teams.create_user("bob", "admin")
    teams.grant_role("bob", "team-b", Role.ADMIN, "admin")
    teams.grant_role("bob", "team-b", Role.VIEWER, "admin")  # replaces
    assert teams.get_user("bob").roles == {"team-b": Role.VIEWER}
    teams.revoke_role("bob", "team-b", "admin")
    teams.revoke_role("bob", "team-b", "admin")  # idempotent
    assert teams.get_user("bob").roles == {}
    with pytest.raises(NotFound):
        teams.grant_role("bob", "nope", Role.VIEWER, "admin")


def test_the_event_log_is_append_only(teams: Store) -> None:
    job, _ = teams.submit_job("team-a", spec(), "user:ann")
    for statement in ("UPDATE events SET actor = 'mallory'", "DELETE FROM events"):
        with pytest.raises(DBAPIError, match="append-only"), teams.engine.begin() as connection:
            connection.execute(text(statement))
    kinds = [e.kind for e in teams.audit()]
    assert kinds == ["tenant.created", "tenant.created", "job.submitted"]
    assert [e.kind for e in teams.audit("team-a", after_id=teams.audit()[0].id)] == [
        "job.submitted"
    ]
    assert teams.events(job.id)[0].actor == "user:ann"


def test_tenant_and_node_records(teams: Store, clock: ManualClock) -> None:
    assert teams.get_tenant("team-a") == Tenant("team-a", quota={"H100": 8}, weight=2.0)
    teams.put_tenant(Tenant("team-a", quota={"H100": 16}, borrow_limit={"H100": 4}), "admin")
    assert teams.get_tenant("team-a").borrow_limit == {"H100": 4}
    assert [t.name for t in teams.list_tenants()] == ["team-a", "team-b"]
    with pytest.raises(Conflict):
        teams.create_tenant(Tenant("team-b"), "admin")
    teams.submit_job("team-b", spec(), "user:bob")
    with pytest.raises(Conflict, match="still has jobs"):
        teams.delete_tenant("team-b", "admin")
    nodes = [Node(f"n{i}", 8, "H100", "rack-0", "pod-0", labels={"zone": "a"}) for i in range(3)]
    assert teams.upsert_nodes(nodes) == 3
    teams.set_node_health("n1", NodeHealth.CORDONED, "user:ops", reason="maintenance")
    clock.advance(30)
    assert teams.upsert_nodes(nodes) == 0
    records = {r.node.name: r for r in teams.list_nodes()}
    assert records["n1"].health is NodeHealth.CORDONED and not records["n1"].schedulable
    assert records["n0"].last_seen == clock.now() and records["n0"].node == nodes[0]
    teams.remove_node("n2", "user:ops")
    with pytest.raises(NotFound):
        teams.get_node("n2")


def test_concurrent_submits_from_threads_store_each_key_once(teams: Store, store_url: str) -> None:
    # Two Store objects (two pools, as two API processes would have) race on the same keys.
    second = Store.open(store_url)
    errors: list[BaseException] = []
    results: list[tuple[str, str, bool]] = []
    lock = threading.Lock()

    def work(thread: int) -> None:
        try:
            for n in range(20):
                key = f"key-{(thread // 2) * 20 + n}"  # two threads race on every key
                store = teams if thread % 2 else second
                record, created = store.submit_job("team-a", spec(), "user:ann", key)
                with lock:
                    results.append((key, record.id, created))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    second.close()
    assert not errors
    ids_by_key: dict[str, set[str]] = {}
    for key, job_id, _ in results:
        ids_by_key.setdefault(key, set()).add(job_id)
    assert len(ids_by_key) == 80 and all(len(ids) == 1 for ids in ids_by_key.values())
    assert sum(created for *_, created in results) == 80
    with teams.engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(jobs)).scalar() == 80


def test_a_bad_submission_in_a_group_commit_fails_alone(teams: Store) -> None:
    barrier = threading.Barrier(8)
    outcomes: dict[int, object] = {}

    def work(n: int) -> None:
        barrier.wait()  # all at once, so SQLite commits them in shared batches
        try:
            outcomes[n] = teams.submit_job("team-a", spec(workers=n + 1), "user:ann", "same")
        except IdempotencyConflict as error:
            outcomes[n] = error
        teams.submit_job("team-a", spec(), "user:ann", f"own-{n}")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    kinds = Counter(type(outcome).__name__ for outcome in outcomes.values())
    assert kinds == {"tuple": 1, "IdempotencyConflict": 7}
    page, _ = teams.list_jobs("team-a")
    assert sorted(j.idempotency_key or "" for j in page) == sorted(
        ["same"] + [f"own-{n}" for n in range(8)]
    )


def test_every_acknowledged_submit_survives_sigkill(teams: Store, store_url: str) -> None:
    child = _child("submit", store_url, "100000")
    acknowledged: list[str] = []
    assert child.stdout is not None
    deadline = time.monotonic() + 60
    while len(acknowledged) < 150 and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        acknowledged.append(line.strip())
    os.kill(child.pid, signal.SIGKILL)  # in the middle of the stream: more submits in flight
    child.communicate(timeout=30)
    assert len(acknowledged) >= 150, child.stderr.read() if child.stderr else ""
    with Store.open(store_url) as reopened, reopened.engine.connect() as connection:
        if reopened.dialect == "sqlite":
            assert connection.execute(text("PRAGMA integrity_check")).scalar() == "ok"
        rows = connection.execute(select(jobs.c.id, jobs.c.idempotency_key)).all()
        keys = Counter(key for _, key in rows)
        assert all(keys[key] == 1 for key in acknowledged)  # present, exactly once
        assert max(keys.values()) == 1
        submitted = connection.execute(
            select(events.c.job_id).where(events.c.kind == "job.submitted")
        ).all()
        assert sorted(j for (j,) in submitted) == sorted(j for j, _ in rows)  # no partial rows
        for key in acknowledged[:20]:  # a client retrying after the crash gets the same job
            job, created = reopened.submit_job("team-a", spec("crash"), "user:crash", key)
            assert not created and job.idempotency_key == key


def test_leader_lease_is_exclusive_between_processes(store: Store) -> None:
    child = _child("lead", _url_of(store))
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "leader"
        # On PostgreSQL the child's lease expires 3 s (this standby's lease_s) after the standby
        # last saw it change; on SQLite its flock goes with the process.
        standby = leader_lock(store, lease_s=3.0, renew_s=1.0, margin_s=1.0)
        assert not standby.try_acquire() and not standby.still_leader()
        os.kill(child.pid, signal.SIGKILL)
        child.communicate(timeout=30)
        assert standby.acquire(timeout=20, poll=0.1)
        assert standby.still_leader() and standby.epoch == 2
        rival = leader_lock(store)
        assert not rival.try_acquire()
        standby.release()
        assert rival.try_acquire()
        rival.release()
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()


def _url_of(store: Store) -> str:
    return store.engine.url.render_as_string(hide_password=False)
