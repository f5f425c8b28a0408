"""What a leader that died with Ray calls in flight leaves, and how its successor finishes it,
over the fake runtime on the injected clock: a launch cut short, a preemption cut short, a gang
preempted while its launch waits, an ended attempt's gang left running, and a gang of a queued
job launched by a deposed leader.

A crash is ``DeferredExecutor.crash()``: the calls in flight never complete and the store keeps
what was written before them; the successor is a new loop over the same store and runtime. (The
same crashes with SIGKILLed server processes and Ray: ``tests/integration/test_control_crash*``.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_control_loop_rules import run_until, state, submit, transitions

from aicluster.core import JobState, ManualClock, Tenant, make_cluster
from aicluster.scheduler import SchedulerConfig
from aicluster.store import Store
from fakeruntime import DeferredExecutor, FakeGang, FakeRuntime, Script, fake_loop

PRIORITY = SchedulerConfig(queue="priority")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000.0)


@pytest.fixture
def store(tmp_path: Path, clock: ManualClock) -> Iterator[Store]:
    opened = Store.open(tmp_path / "db", clock=clock)
    opened.create_tenant(Tenant("a"), "test")
    opened.create_tenant(Tenant("idle", quota={"H100": 0}, borrow_limit={"H100": 0}), "test")
    opened.upsert_nodes(make_cluster(nodes=2, gpus_per_node=8).nodes)
    yield opened
    opened.close()


def test_a_launch_cut_short_by_a_crash_is_finished_not_counted(
    store: Store, clock: ManualClock, tmp_path: Path
) -> None:
    """The leader dies while the launch waits for Ray (STARTING written, the call in flight).
    Its successor launches the same attempt: no failure, no second attempt."""
    calls = DeferredExecutor()
    with fake_loop(store, clock, tmp_path, executor=calls) as (first, runtime):
        job = submit(store, "late", max_restarts=3)
        runtime.scripts[job.id] = Script(steps=5)
        first.tick()
        assert state(store, job) is JobState.STARTING and calls.pending
        calls.crash()
    with fake_loop(store, clock, tmp_path, runtime=runtime) as (successor, _):
        run_until(successor, clock, lambda: state(store, job) is JobState.SUCCEEDED)
    record = store.get_job(None, job.id)
    assert (record.attempt, record.restarts) == (1, 0)
    assert transitions(store, job)[-3:] == ["STARTING", "RUNNING", "SUCCEEDED"]
    assert [spec.attempt for spec in runtime.launches] == [1]


def test_a_launch_that_landed_before_the_crash_is_followed_not_repeated(
    store: Store, clock: ManualClock, tmp_path: Path
) -> None:
    calls = DeferredExecutor()
    with fake_loop(store, clock, tmp_path, executor=calls) as (first, runtime):
        job = submit(store, "landed")
        runtime.scripts[job.id] = Script(steps=5)
        first.tick()
        calls.run_pending()  # Ray started the gang; the leader dies before it hears so
        calls.crash()
    with fake_loop(store, clock, tmp_path, runtime=runtime) as (successor, _):
        run_until(successor, clock, lambda: state(store, job) is JobState.SUCCEEDED)
    assert len(runtime.launches) == 1
    assert store.get_job(None, job.id).restarts == 0


def test_a_preemption_cut_short_by_a_crash_is_finished(
    store: Store, clock: ManualClock, tmp_path: Path
) -> None:
    """The victim ignores SIGTERM, and the leader dies while its stop waits out the grace
    (victim PREEMPTING, preemptor STARTING). The successor stops and requeues the victim (not a
    restart) and launches the preemptor once."""
    calls = DeferredExecutor(auto=True)
    with fake_loop(store, clock, tmp_path, PRIORITY, executor=calls) as (first, runtime):
        low = submit(store, "low", workers=2, priority="low", max_restarts=3)
        runtime.scripts[low.id] = Script(steps=None, ignores_sigterm=True)
        run_until(first, clock, lambda: state(store, low) is JobState.RUNNING)
        calls.crash()
        high = submit(store, "high", priority="high")
        runtime.scripts[high.id] = Script(steps=3)
        first.tick()
        assert (state(store, low), state(store, high)) == (JobState.PREEMPTING, JobState.STARTING)
    with fake_loop(store, clock, tmp_path, PRIORITY, runtime=runtime) as (successor, _):
        run_until(successor, clock, lambda: state(store, high) is JobState.RUNNING)
        run_until(successor, clock, lambda: state(store, low) is JobState.PENDING)
        victim = store.get_job(None, low.id)
        assert (victim.attempt, victim.restarts) == (1, 0)
        assert transitions(store, low)[-4:] == ["STARTING", "RUNNING", "PREEMPTING", "PENDING"]
        assert runtime.gangs[(low.id, 1)].stopped_at is not None
        store.cancel_job("a", low.id, "tester")
        run_until(successor, clock, lambda: state(store, high) is JobState.SUCCEEDED)
    record = store.get_job(None, high.id)
    assert (record.attempt, record.restarts) == (1, 0)
    assert transitions(store, high)[-3:] == ["STARTING", "RUNNING", "SUCCEEDED"]
    assert [s.attempt for s in runtime.launches if s.job_id == high.id] == [1]


def test_a_gang_preempted_while_its_launch_waits_is_stopped_once_launched(
    store: Store, clock: ManualClock, tmp_path: Path
) -> None:
    """No crash: a stop cannot act before the launch it follows has landed; it must act as soon
    as it does, or the victim runs on and its preemptor never gets the GPUs."""
    calls = DeferredExecutor()
    with fake_loop(store, clock, tmp_path, PRIORITY, executor=calls) as (loop, runtime):
        low = submit(store, "low", workers=2, priority="low")
        runtime.scripts[low.id] = Script(steps=None)
        loop.tick()  # admitted; its launch waits for Ray
        high = submit(store, "high", priority="high")
        runtime.scripts[high.id] = Script(steps=3)
        loop.tick()
        assert state(store, low) is JobState.PREEMPTING and (low.id, 1) not in runtime.gangs
        calls.run_pending()  # the launch lands, then the stop queued behind it runs
        assert runtime.gangs[(low.id, 1)].stopped_at is not None
        calls.auto = True
        run_until(loop, clock, lambda: state(store, high) is JobState.SUCCEEDED)
    assert transitions(store, low)[:4] == ["PENDING", "STARTING", "PREEMPTING", "PENDING"]
    assert store.get_job(None, low.id).restarts == 0


def test_an_ended_attempts_gang_left_by_a_crash_is_released(
    store: Store, clock: ManualClock, tmp_path: Path
) -> None:
    """A crash between a job's end and its gang's release leaves a gang whose ranks exited but
    whose resources are held: the next leader releases it."""
    job = submit(store, "gone", tenant="idle")
    store.cancel_job("idle", job.id, "tester")
    with fake_loop(store, clock, tmp_path) as (loop, runtime):
        leftover = _launched_behind_its_back(runtime, job.id, Script(steps=0))
        assert leftover.status().phase.terminal and leftover in runtime.live_gangs()
        loop.tick()
        assert leftover.stopped_at is not None and leftover not in runtime.live_gangs()


def test_a_gang_of_a_queued_job_is_released_and_the_job_left_queued(
    store: Store, clock: ManualClock, tmp_path: Path
) -> None:
    """A deposed leader launched after its last write: a running gang of a job the store has
    PENDING. The new leader releases it; the job stays queued, untouched."""
    job = submit(store, "queued", tenant="idle")
    with fake_loop(store, clock, tmp_path) as (loop, runtime):
        stray = _launched_behind_its_back(runtime, job.id, Script(steps=None))
        run_until(loop, clock, lambda: stray.stopped_at is not None, limit_s=5)
        clock.advance(5)
        loop.tick()
    record = store.get_job(None, job.id)
    assert (record.state, record.attempt) == (JobState.PENDING, 0)
    assert transitions(store, job) == ["PENDING"]


def _launched_behind_its_back(runtime: FakeRuntime, job_id: str, script: Script) -> FakeGang:
    """Attempt 1 of ``job_id`` on node-1, as a crashed or deposed leader would have left it."""
    from aicluster.core import DomainLevel, Placement, Slot
    from aicluster.runtime import GangSpec

    runtime.scripts[job_id] = script
    spec = GangSpec(
        job_id=job_id,
        entrypoint="train.py",
        placement=Placement((Slot("node-1", 1),), DomainLevel.NODE, "node-1"),
        gpus_per_worker=1,
        attempt=1,
    )
    return runtime.launch(spec)
