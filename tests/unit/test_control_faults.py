"""One job never stops the loop: fault isolation per job and the tick watchdog, on a real SQLite
store. The loop runs without Ray (no runtime): the scheduling and the store are real; the only
double is an intake whose handling of one named job raises, as a bug or a poisoned input would."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from aicluster.control.loop.faults import FAULT_LIMIT, JobFaults
from aicluster.control.loop.intake import JobIntake
from aicluster.control.loop.loop import ControlLoop
from aicluster.control.loop.watchdog import TickWatchdog
from aicluster.core import JobState, Tenant, jobspec_from_mapping, make_cluster
from aicluster.scheduler import SchedulerState
from aicluster.store import JobRecord, Store
from aicluster.store.base import WallClock


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(tmp_path)
    opened.create_tenant(Tenant("a"), "test")
    opened.upsert_nodes(make_cluster(nodes=2, gpus_per_node=8).nodes)
    yield opened
    opened.close()


def submit(store: Store, name: str) -> JobRecord:
    spec = jobspec_from_mapping(
        {"name": name, "entrypoint": "train.py", "resources": {"gpus": 8}, "code": "0" * 64}
    )
    record, _ = store.submit_job("a", spec, "tester")
    return record


class PoisonedIntake(JobIntake):
    """Taking in the job named ``poisoned`` raises, every time."""

    def _take_in_one(self, state: SchedulerState, record: JobRecord, now: float) -> None:
        if record.name == "poisoned":
            raise RuntimeError("a record the loop cannot read")
        super()._take_in_one(state, record, now)


def test_a_job_whose_handling_fails_is_failed_and_the_others_are_scheduled(store: Store) -> None:
    poisoned, normal = submit(store, "poisoned"), submit(store, "normal")
    loop = ControlLoop(store, None, None, WallClock())
    loop.intake = PoisonedIntake(store, loop.gangs)
    loop.tick()
    assert store.get_job(None, normal.id).state is JobState.STARTING  # the first tick
    for _ in range(FAULT_LIMIT):
        loop.intake.full_at = float("-inf")  # read the whole queue again, as every 15 s
        loop.tick()
    failed = store.get_job(None, poisoned.id)
    assert failed.state is JobState.FAILED
    (ended,) = [e for e in store.events(poisoned.id) if e.to_state == "FAILED"]
    reason = ended.details["reason"]
    assert "could not handle the job" in reason
    assert "a record the loop cannot read" in reason
    kinds = [event.kind for event in store.events(poisoned.id)]
    assert kinds.count("job.handling_failed") == 2  # the first fault, then the last one
    assert loop.gangs.faults.total == FAULT_LIMIT


def test_a_store_failure_is_not_a_jobs_fault(store: Store) -> None:
    faults = JobFaults(store, "test", time.monotonic)
    gave_up: list[str] = []
    with (
        pytest.raises(OperationalError),
        faults.guard("j", "step", lambda job, why: gave_up.append(job)),
    ):
        raise OperationalError("SELECT 1", {}, Exception("the database is down"))
    assert faults.total == 0 and not gave_up


def test_dropped_output_is_reported_once_a_minute_and_flushed_at_the_end(store: Store) -> None:
    from collections import Counter

    job = submit(store, "noisy")
    now = [0.0]
    faults = JobFaults(store, "test", lambda: now[0])
    faults.rejected(job.id, Counter({"telemetry: not a JSON object": 2}))
    faults.rejected(job.id, Counter({"telemetry: not a JSON object": 3}))  # held back
    now[0] = 30.0
    faults.rejected(job.id, Counter({"telemetry: invalid UTF-8": 1}), flush=True)
    events = [e.details for e in store.events(job.id) if e.kind == "job.output_rejected"]
    assert events == [
        {"count": 2, "reasons": {"telemetry: not a JSON object": 2}},
        {"count": 4, "reasons": {"telemetry: not a JSON object": 3, "telemetry: invalid UTF-8": 1}},
    ]


def test_the_watchdog_reports_a_stuck_tick_once_with_where_it_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watchdog = TickWatchdog(budget_s=0.2, poll_s=0.05)
    watchdog.start()
    release = threading.Event()

    def stuck_tick() -> None:
        watchdog.begin()
        release.wait(5)
        watchdog.end()

    worker = threading.Thread(target=stuck_tick)
    worker.start()
    deadline = time.monotonic() + 5
    while watchdog.over_budget == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # more checks of the same tick: still one report
    release.set()
    worker.join()
    watchdog.stop()
    assert watchdog.over_budget == 1
    assert watchdog.running_s() == 0.0 and watchdog.longest_s > 0.2
    assert "over its 0.2s budget" in caplog.text and "stuck_tick" in caplog.text
