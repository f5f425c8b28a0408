"""Rollouts in the store, on real SQLite and PostgreSQL: one running per deployment, steps by
compare-and-set, outcomes, events in the same transaction, tenant scoping."""

from __future__ import annotations

import pytest

from aicluster.core import ManualClock, Tenant
from aicluster.store import Conflict, NotFound, StaleState, Store

pytestmark = pytest.mark.integration


@pytest.fixture
def teams(store: Store) -> Store:
    store.create_tenant(Tenant("team-a"), "admin")
    store.create_tenant(Tenant("team-b"), "admin")
    return store


def start(store: Store, name: str = "gpt", tenant: str = "team-a"):  # type: ignore[no-untyped-def]
    return store.create_rollout(
        tenant,
        name,
        from_version=1,
        to_version=2,
        steps=[10, 50, 100],
        interval_s=30,
        max_error_rate=0.01,
        max_p99_ms=500,
        actor="alice",
    )


def test_a_rollout_moves_through_its_steps_and_logs_each(teams: Store, clock: ManualClock) -> None:
    store = teams
    rollout = start(store)
    assert (rollout.state, rollout.step_index, rollout.weight) == ("running", -1, 0)
    assert rollout.traffic() == {1: 100.0, 2: 0.0}
    clock.advance(5)
    step = store.advance_rollout(rollout, 0, actor="ctl", figures={"ready": True}, reason="up")
    assert (step.weight, step.step_started_at) == (10, clock.now())
    assert step.traffic() == {1: 90.0, 2: 10.0}
    assert store.current_rollout("team-a", "gpt") == step
    done = store.finish_rollout(
        step, "rolled_back", actor="ctl", reason="too many errors", figures={"errors": 3}
    )
    assert done.state == "rolled_back" and done.traffic() == {1: 100.0}
    assert store.current_rollout("team-a", "gpt") is None
    events = store.rollout_events(done)
    assert [e.kind for e in events] == ["rollout.started", "rollout.step", "rollout.rolled_back"]
    assert events[1].details["figures"] == {"ready": True}
    assert events[1].details["weight"] == 10
    assert events[2].details["reason"] == "too many errors"
    assert events[2].details["traffic"] == {"1": 100.0}
    assert all(e.tenant == "team-a" and e.job_id is None for e in events)


def test_one_running_rollout_per_deployment(teams: Store) -> None:
    first = start(teams)
    with pytest.raises(Conflict, match="already has a rollout"):
        start(teams)
    start(teams, name="other")  # another deployment
    start(teams, tenant="team-b")  # the same name in another tenant
    teams.finish_rollout(first, "aborted", actor="alice", reason="changed my mind")
    again = start(teams)
    assert [r.id for r in teams.list_rollouts("team-a", "gpt")] == [again.id, first.id]
    latest = {(r.tenant, r.name): r.id for r in teams.latest_rollouts()}
    assert latest[("team-a", "gpt")] == again.id
    assert len(teams.running_rollouts()) == 3
    # Interleaved rollouts of one tenant: each reads only its own events.
    assert [e.kind for e in teams.rollout_events(first)] == ["rollout.started", "rollout.aborted"]
    assert [e.details["rollout"] for e in teams.rollout_events(again)] == [again.id]


def test_a_stale_step_loses_to_the_first_writer(teams: Store) -> None:
    rollout = start(teams)
    promoted = teams.finish_rollout(rollout, "promoted", actor="alice", reason="manual")
    assert promoted.traffic() == {2: 100.0}
    with pytest.raises(StaleState):
        teams.advance_rollout(rollout, 0, actor="ctl", figures={}, reason="healthy")
    with pytest.raises(StaleState):
        teams.finish_rollout(rollout, "rolled_back", actor="ctl", reason="errors")
    with pytest.raises(ValueError, match="not an outcome"):
        teams.finish_rollout(rollout, "running", actor="ctl", reason="?")


def test_other_tenants_rollouts_are_not_found(teams: Store) -> None:
    rollout = start(teams)
    assert teams.get_rollout("team-a", rollout.id) == rollout
    with pytest.raises(NotFound):
        teams.get_rollout("team-b", rollout.id)
    assert teams.list_rollouts("team-b", "gpt") == []
