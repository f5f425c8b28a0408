"""The store's aggregate reads (counts, placements, events by kind) on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from aicluster.core import DomainLevel, JobState, Placement, Slot, Tenant, jobspec_from_mapping
from aicluster.store import JobCount, Store

pytestmark = pytest.mark.integration


def _submit(store: Store, tenant: str, name: str) -> str:
    spec = jobspec_from_mapping(
        {"name": name, "entrypoint": "t.py", "workers": 2, "resources": {"gpus": 1}}
    )
    job, _ = store.submit_job(tenant, spec, "test")
    return job.id


def test_counts_placements_and_events_by_kind(store: Store) -> None:
    store.create_tenant(Tenant("a", quota={"H100": 8}), "admin")
    store.create_tenant(Tenant("b"), "admin")
    a1, a2, b1 = _submit(store, "a", "one"), _submit(store, "a", "two"), _submit(store, "b", "x")
    placement = Placement((Slot("n0", 1), Slot("n0", 1)), DomainLevel.NODE, "n0", {"nodes": 1})
    store.transition(a1, JobState.STARTING, "loop", placement=placement)
    store.transition(a1, JobState.RUNNING, "loop")
    store.transition(a1, JobState.RESTARTING, "loop", reason="rank 1 died")
    store.record_event(b1, "job.goodput", "loop", {"ettr": 0.5, "wall_seconds": 10.0})

    counts = {(c.tenant, c.state): c for c in store.job_counts()}
    assert counts[("a", JobState.RESTARTING)] == JobCount("a", JobState.RESTARTING, 1, 1)
    assert counts[("a", JobState.PENDING)].jobs == 1
    assert counts[("b", JobState.PENDING)] == JobCount("b", JobState.PENDING, 1, 0)

    (placed,) = store.placed_jobs()  # RESTARTING holds its GPUs until requeued
    assert (placed.id, placed.tenant, placed.name, placed.gpus) == (a1, "a", "one", 2)
    assert placed.placement["slots"] == [["n0", 1, 0, 0.0, 0.0], ["n0", 1, 0, 0.0, 0.0]]

    (goodput,) = store.events_of_kind(["job.goodput"])
    assert goodput.job_id == b1 and goodput.details["ettr"] == 0.5
    assert store.events_of_kind(["job.goodput"], after_id=goodput.id) == []
    assert store.events_of_kind(["job.goodput"], tenant="a") == []
    assert a2 not in {event.job_id for event in store.events_of_kind(["job.goodput"])}
