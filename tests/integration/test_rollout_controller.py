"""The rollout controller on a real store (SQLite and PostgreSQL) and real ServingStats, driven by
a manual clock: steps, promotion, early rollback, warm-up, manual promote/abort, restarts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from stubmodels import register_stubs

from aicluster.core import ManualClock, Tenant
from aicluster.serve.rollout import RolloutController, abort, promote, start_rollout
from aicluster.serve.stats import ServingStats
from aicluster.store import Conflict, NotFound, RolloutRecord, Store

pytestmark = pytest.mark.integration
PLAN = {"steps": [10, 50, 100], "interval_s": 10.0, "max_error_rate": 0.01, "max_p99_ms": 500.0}


@pytest.fixture
def store(store_url: str, clock: ManualClock, tmp_path: Path) -> Iterator[Store]:
    """team-a serves gpt v1 at 100% and has v2 and v3 registered."""
    opened = Store.open(store_url, clock=clock, state_dir=tmp_path / "state")
    opened.create_tenant(Tenant("team-a"), "admin")
    opened.create_tenant(Tenant("team-b"), "admin")
    register_stubs(opened, "team-a", "gpt", tmp_path, 3)
    opened.put_deployment("team-a", "gpt", {"replicas": 1}, {1: 100.0}, "alice")
    try:
        yield opened
    finally:
        opened.close()


def begin(store: Store, version: int = 2, **plan: object) -> RolloutRecord:
    return start_rollout(store, "team-a", "gpt", version=version, actor="alice", **{**PLAN, **plan})  # type: ignore[arg-type]


def traffic(store: Store) -> dict[int, float]:
    return dict(store.get_deployment("team-a", "gpt").traffic)


def serve(stats: ServingStats, clock: ManualClock, version: int, ok: int, bad: int = 0) -> None:
    """``ok`` good and ``bad`` failed requests of ``version`` spread over the next second."""
    total = ok + bad
    for i in range(total):
        stats.record("team-a", "gpt", version, i >= bad, 0.02, clock.now() + i / total)
    clock.advance(1)


def kinds(store: Store, record: RolloutRecord) -> list[str]:
    return [e.kind for e in store.rollout_events(record)]


def test_a_healthy_version_is_promoted_through_every_step(store: Store, clock: ManualClock) -> None:
    stats = ServingStats()
    controller = RolloutController(store, stats)
    record = begin(store)
    assert traffic(store) == {1: 100.0, 2: 0.0}  # warming: v2's replicas start, no traffic
    controller.tick(clock.now())
    assert traffic(store) == {1: 90.0, 2: 10.0}
    # At 100% the old version keeps its replicas (0%) for one more interval: a rollback is
    # instant; once that interval is healthy too, the old version is dropped.
    for expected in ({1: 50.0, 2: 50.0}, {1: 0.0, 2: 100.0}, {2: 100.0}):
        for _ in range(10):
            controller.tick(clock.now())
            serve(stats, clock, 2, ok=5)
        controller.tick(clock.now())
        assert traffic(store) == expected
    done = store.get_rollout("team-a", record.id)
    assert done.state == "promoted" and done.reason and done.reason.startswith("healthy")
    assert kinds(store, done) == [
        "rollout.started", "rollout.step", "rollout.step", "rollout.step", "rollout.promoted",
    ]  # fmt: skip
    step = store.rollout_events(done)[2]
    assert step.details["weight"] == 50 and step.details["figures"]["requests"] == 50
    assert step.details["figures"]["errors"] == 0


def test_a_failing_version_is_rolled_back_within_the_first_interval(
    store: Store, clock: ManualClock
) -> None:
    stats = ServingStats()
    controller = RolloutController(store, stats)
    record = begin(store)
    controller.tick(clock.now())
    started = clock.now()
    while store.current_rollout("team-a", "gpt") is not None:
        serve(stats, clock, 2, ok=9, bad=1)  # 10% errors
        controller.tick(clock.now())
        assert clock.now() - started < PLAN["interval_s"]  # type: ignore[operator]
    assert traffic(store) == {1: 100.0}
    done = store.get_rollout("team-a", record.id)
    assert done.state == "rolled_back" and "95% confidence" in (done.reason or "")
    event = store.rollout_events(done)[-1]
    assert event.kind == "rollout.rolled_back" and event.details["figures"]["errors"] >= 2


def test_too_few_requests_hold_the_step(store: Store, clock: ManualClock) -> None:
    stats = ServingStats()
    controller = RolloutController(store, stats)
    begin(store)
    controller.tick(clock.now())
    for _ in range(30):
        serve(stats, clock, 2, ok=0 if clock.now() % 3 else 1)
        controller.tick(clock.now())
    current = store.current_rollout("team-a", "gpt")
    assert current is not None and current.step_index == 0
    assert traffic(store) == {1: 90.0, 2: 10.0}


def test_a_canary_that_never_serves_is_rolled_back(store: Store, clock: ManualClock) -> None:
    controller = RolloutController(store, ServingStats(), ready=lambda t, n, v: False)
    record = begin(store)
    controller.tick(clock.now())
    assert traffic(store) == {1: 100.0, 2: 0.0}
    clock.advance(121)
    controller.tick(clock.now())
    done = store.get_rollout("team-a", record.id)
    assert done.state == "rolled_back" and "not serving" in (done.reason or "")
    assert traffic(store) == {1: 100.0}


def test_manual_promote_and_abort(store: Store, clock: ManualClock) -> None:
    controller = RolloutController(store, ServingStats())
    first = begin(store)
    controller.tick(clock.now())
    done = promote(store, "team-a", "gpt", "bob")
    assert (done.id, done.state) == (first.id, "promoted")
    assert done.reason == "promoted by bob at 10%"
    assert traffic(store) == {2: 100.0}
    with pytest.raises(NotFound, match="no rollout in progress"):
        abort(store, "team-a", "gpt", "bob")
    second = begin(store, version=3)
    assert second.from_version == 2
    controller.tick(clock.now())
    assert abort(store, "team-a", "gpt", "bob").state == "aborted"
    assert traffic(store) == {2: 100.0}
    assert kinds(store, second) == ["rollout.started", "rollout.step", "rollout.aborted"]
    controller.tick(clock.now())  # the controller leaves a finished rollout alone
    assert traffic(store) == {2: 100.0}


def test_start_is_validated(store: Store) -> None:
    with pytest.raises(ValueError, match=r"strictly increasing; .*at least 1 s"):
        begin(store, steps=[50, 10, 100], interval_s=0.5)
    with pytest.raises(ValueError, match="last step must be 100"):
        begin(store, steps=[10, 50])
    with pytest.raises(NotFound, match="gpt:9"):
        begin(store, version=9)
    with pytest.raises(Conflict, match="already serves version 1"):
        begin(store, version=1)
    with pytest.raises(NotFound):
        start_rollout(store, "team-b", "gpt", version=2, actor="eve", **PLAN)  # type: ignore[arg-type]
    begin(store)
    with pytest.raises(Conflict, match="already has a rollout"):
        begin(store, version=3)
    abort(store, "team-a", "gpt", "alice")
    store.set_traffic("team-a", "gpt", {1: 60.0, 2: 40.0}, "alice")
    with pytest.raises(Conflict, match="split between versions"):
        begin(store, version=3)


def test_a_new_leader_resumes_the_step_where_it_was(store: Store, clock: ManualClock) -> None:
    stats = ServingStats()
    RolloutController(store, stats).tick(clock.now())
    record = begin(store)
    RolloutController(store, stats).tick(clock.now())  # step 0 begins
    step_started = store.get_rollout("team-a", record.id).step_started_at
    for _ in range(5):
        serve(stats, clock, 2, ok=5)
    # The leader dies; a new one (fresh controller, same store) takes over mid-step. (Here the
    # two share their statistics, so no takeover grace is needed: see the next test; it judges
    # from the canary's first answer it sees.)
    successor = RolloutController(store, stats, takeover_grace_s=0)
    successor.tick(clock.now())
    resumed = store.get_rollout("team-a", record.id)
    assert (resumed.step_index, resumed.step_started_at) == (0, step_started)
    for _ in range(5):
        serve(stats, clock, 2, ok=5)
        successor.tick(clock.now())
    assert store.get_rollout("team-a", record.id).step_index == 1  # 10 s after the step began


def taken_over(
    store: Store, clock: ManualClock, **options: float
) -> tuple[RolloutRecord, ServingStats, RolloutController]:
    """A rollout whose step 0 began, served a second, then its leader died: the rollout, the
    statistics and the new leader's controller (a 5 s takeover grace), after its first tick."""
    stats = ServingStats()
    RolloutController(store, stats).tick(clock.now())
    record = begin(store)
    RolloutController(store, stats).tick(clock.now())  # step 0 begins
    serve(stats, clock, 2, ok=5)
    successor = RolloutController(store, stats, takeover_grace_s=5, **options)
    successor.tick(clock.now())
    return record, stats, successor


def test_failures_just_after_a_takeover_do_not_judge_an_inherited_step(
    store: Store, clock: ManualClock
) -> None:
    # A new leader's cold handles fail its first calls to the canary: not the canary's fault.
    record, stats, successor = taken_over(store, clock)
    for _ in range(3):
        serve(stats, clock, 2, ok=0, bad=10)
        successor.tick(clock.now())
    assert store.get_rollout("team-a", record.id).state == "running"
    clock.advance(3)
    for _ in range(5):  # after the grace, its own answers judge it: failures now roll it back
        serve(stats, clock, 2, ok=5, bad=5)
        successor.tick(clock.now())
    assert store.get_rollout("team-a", record.id).state == "rolled_back"


def test_a_new_leaders_handles_cold_past_the_grace_do_not_roll_back_a_healthy_canary(
    store: Store, clock: ManualClock
) -> None:
    record, stats, successor = taken_over(store, clock)
    for _ in range(12):  # a loaded machine: the cold handles fail well past the 5 s grace
        serve(stats, clock, 2, ok=0, bad=10)
        successor.tick(clock.now())
    assert store.get_rollout("team-a", record.id).state == "running"
    for _ in range(12):  # warm: the canary answers, and is judged from then on
        serve(stats, clock, 2, ok=10)
        successor.tick(clock.now())
    assert store.get_rollout("team-a", record.id).step_index >= 1


def test_an_inherited_canary_that_never_answers_is_rolled_back_after_the_warmup_timeout(
    store: Store, clock: ManualClock
) -> None:
    record, stats, successor = taken_over(store, clock, warmup_timeout_s=30)
    for _ in range(40):
        serve(stats, clock, 2, ok=0, bad=10)
        successor.tick(clock.now())
    assert store.get_rollout("team-a", record.id).state == "rolled_back"


def test_a_new_leader_finishes_the_traffic_of_a_decided_rollout(
    store: Store, clock: ManualClock
) -> None:
    record = begin(store)
    RolloutController(store, ServingStats()).tick(clock.now())
    # Decided in the store, then the leader died before writing the traffic.
    store.finish_rollout(
        store.get_rollout("team-a", record.id), "rolled_back", actor="x", reason="errors"
    )
    assert traffic(store) == {1: 90.0, 2: 10.0}
    RolloutController(store, ServingStats()).tick(clock.now())
    assert traffic(store) == {1: 100.0}


def test_a_deleted_deployment_aborts_its_rollout(store: Store, clock: ManualClock) -> None:
    record = begin(store)
    store.delete_deployment("team-a", "gpt", "alice")
    RolloutController(store, ServingStats()).tick(clock.now())
    done = store.get_rollout("team-a", record.id)
    assert done.state == "aborted" and done.reason == "the deployment was deleted"


def test_a_newer_deployment_change_supersedes_the_rollout(store: Store, clock: ManualClock) -> None:
    record = begin(store)
    controller = RolloutController(store, ServingStats())
    controller.tick(clock.now())
    store.set_traffic("team-a", "gpt", {1: 90.0, 2: 10.0, 3: 0.0}, "alice")  # serve gpt:3
    controller.tick(clock.now())
    done = store.get_rollout("team-a", record.id)
    assert done.state == "aborted" and "also serves version 3" in (done.reason or "")
    assert traffic(store) == {1: 90.0, 2: 10.0, 3: 0.0}  # left to the newer change


def test_a_controller_holding_an_old_step_never_undoes_a_manual_promote(
    store: Store, clock: ManualClock
) -> None:
    stats = ServingStats()
    controller = RolloutController(store, stats)
    record = begin(store)
    controller.tick(clock.now())
    stale = store.get_rollout("team-a", record.id)  # what the controller read at step 0...
    promote(store, "team-a", "gpt", "bob")  # ...before a manual promote landed
    for _ in range(10):
        serve(stats, clock, 2, ok=5)
    controller._guard(stale, lambda r: controller._advance(r, clock.now()))
    assert traffic(store) == {2: 100.0}
    assert store.get_rollout("team-a", record.id).state == "promoted"
