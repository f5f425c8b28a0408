"""The control loop's recovery rules on a real store, without Ray: states a crash can leave behind
between two of the loop's writes, and a loop whose leader lease is gone. (Recovery with Ray and
real server processes: ``test_control_crash*.py``.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from aicluster.control.loop.loop import ControlLoop
from aicluster.core import (
    DomainLevel,
    JobState,
    ManualClock,
    Node,
    Placement,
    Slot,
    Tenant,
    parse_jobspec,
)
from aicluster.store import Store

pytestmark = pytest.mark.integration

SPEC = "name: train\ntenant: team-a\nentrypoint: train.py\nworkers: 1\nresources: {gpus: 8}\n"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(tmp_path / "state", clock=ManualClock(1_700_000_000.0))
    opened.create_tenant(Tenant("team-a"), "test")
    opened.upsert_nodes([Node("node-0", 8, "H100", "rack-0", "pod-0")])
    try:
        yield opened
    finally:
        opened.close()


def loop(store: Store, lease: bool = True) -> ControlLoop:
    return ControlLoop(store, None, None, ManualClock(1_700_000_100.0), lease=lambda: lease)


def moves(store: Store, job_id: str) -> list[str | None]:
    return [event.to_state for event in store.events(job_id) if event.kind == "job.transition"]


def test_a_job_left_restarting_by_a_crash_is_requeued_without_a_second_restart(
    store: Store,
) -> None:
    """``_finish`` writes RESTARTING, then PENDING: a crash between the two leaves RESTARTING."""
    job, _ = store.submit_job("team-a", parse_jobspec(SPEC), "alice")
    placement = Placement((Slot("node-0", 8),), DomainLevel.NODE, "node-0")
    store.transition(job.id, JobState.STARTING, "test", placement=placement)
    store.transition(job.id, JobState.RUNNING, "test")
    store.transition(job.id, JobState.RESTARTING, "test", reason="rank 0 exited with code 1")

    loop(store).tick()  # a new leader: requeues it, then admits it again (attempt 2)

    record = store.get_job(None, job.id)
    assert (record.state, record.attempt, record.restarts) == (JobState.STARTING, 2, 1)
    assert moves(store, job.id)[-3:] == ["RESTARTING", "PENDING", "STARTING"]


def test_a_loop_without_the_lease_does_nothing(store: Store) -> None:
    job, _ = store.submit_job("team-a", parse_jobspec(SPEC), "alice")
    assert loop(store, lease=False).tick() is None
    assert store.get_job(None, job.id).state is JobState.PENDING
    assert moves(store, job.id) == []

    assert loop(store, lease=True).tick() is not None
    assert store.get_job(None, job.id).state is JobState.STARTING
