"""The control loop's rules over the fake runtime, on the injected clock: success, restart and
back-off, failure after max_restarts, hang detection, a lost node, a failed launch, cancellation,
preemption with a grace checkpoint, reconciliation after a restart of the loop, cordoned and
draining nodes, stragglers, elastic jobs, and the cost of preemption per tenant and kind.

The store (SQLite), the scheduler and the loop are real; the runtime port is
``tests/fakeruntime.py`` (scripted gangs). Simulated minutes take milliseconds; the same paths
run once on Ray in ``tests/integration/test_control_loop.py``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from aicluster.configuration import Configuration, PolicySection
from aicluster.control.loop.health import HealthConfig
from aicluster.control.loop.loop import ControlLoop
from aicluster.control.settings import LoopSettings
from aicluster.control.views.preemptioncost import PreemptionTally
from aicluster.core import JobState, ManualClock, jobspec_from_mapping
from aicluster.scheduler import SchedulerConfig
from aicluster.store import JobRecord, NodeHealth, Store
from fakeruntime import (
    TICK_S,
    FakeGang,
    FakeRuntime,
    InlineExecutor,
    Script,
    fake_loop,
    run_until,
    state,
    submit,
    transitions,
    two_tenant_store,
)

START = 1_700_000_000.0


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def store(tmp_path: Path, clock: ManualClock) -> Iterator[Store]:
    with two_tenant_store(tmp_path / "db", clock) as opened:
        yield opened


@pytest.fixture
def live(
    store: Store, clock: ManualClock, tmp_path: Path
) -> Iterator[tuple[ControlLoop, FakeRuntime]]:
    with fake_loop(
        store, clock, tmp_path / "state", SchedulerConfig(queue="priority"), stop_grace_s=3
    ) as made:
        yield made


def test_a_job_runs_its_steps_and_succeeds_with_its_goodput(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    loop, runtime = live
    job = submit(store, "ok", workers=2)
    runtime.scripts[job.id] = Script(steps=20, step_s=1.0)
    took = run_until(loop, clock, lambda: state(store, job) is JobState.SUCCEEDED)
    assert 20 <= took <= 20 + 2 * TICK_S
    assert transitions(store, job)[-3:] == ["STARTING", "RUNNING", "SUCCEEDED"]
    (report,) = [e.details for e in store.events(job.id) if e.kind == "job.goodput"]
    assert report["attempts"] == 1 and 0 < report["ettr"] <= 1
    assert loop.state is not None and not loop.state.running


def test_a_crash_loop_backs_off_exponentially_then_fails_and_frees_its_gpus(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    """Attempts that crash before their first step wait 2 s, then 4 s (backoff_s (2, 60))
    before they queue again; after max_restarts the job FAILS with the script's exit code.
    ``restart_on: any``: the same error restarts too (by default its repeat ends the job)."""
    loop, runtime = live
    job = submit(store, "crash", max_restarts=2, restart_on="any")
    runtime.scripts[job.id] = Script(steps=0, start_s=1.0, exit_code=3)
    run_until(loop, clock, lambda: state(store, job) is JobState.FAILED)
    failed = store.get_job(None, job.id)
    assert (failed.restarts, failed.attempt, failed.exit_code) == (2, 3, 3)
    assert "after 2 restarts" in (failed.exit_message or "")
    launched = [runtime.gangs[(job.id, n)].launched_at for n in (1, 2, 3)]
    ended = [at + 1.0 for at in launched]  # each crashed 1 s after its launch
    gaps = [launched[1] - ended[0], launched[2] - ended[1]]
    assert 2.0 <= gaps[0] <= 2.0 + 2 * TICK_S and 4.0 <= gaps[1] <= 4.0 + 2 * TICK_S, gaps
    assert loop.state is not None and not loop.state.running


def test_an_attempt_that_trained_restarts_at_once(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    loop, runtime = live
    job = submit(store, "trained-then-crashed", max_restarts=1)
    runtime.scripts[job.id] = Script(steps=5, exit_code=1)
    run_until(loop, clock, lambda: (job.id, 2) in runtime.gangs)
    first = runtime.gangs[(job.id, 1)]
    assert runtime.gangs[(job.id, 2)].launched_at - (first.launched_at + 5) <= 2 * TICK_S


def test_a_gang_that_stops_stepping_is_hung_and_restarted(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    """No step for max(hang_factor x median step, hang_floor_s) = 30 s: a ``job.hung`` event,
    its gang stopped without a grace period, and a restart."""
    loop, runtime = live
    job = submit(store, "hangs", max_restarts=1, workers=2)
    runtime.scripts[job.id] = Script(steps=None, hang_at=3)
    run_until(loop, clock, lambda: (job.id, 2) in runtime.gangs)
    hung = [e for e in store.events(job.id) if e.kind == "job.hung"]
    assert len(hung) == 1
    reason = hung[0].details["reason"]
    assert reason.startswith("rank 0 made no progress for 30s after its last step (limit 30s")
    assert "health.hang_floor_s 30s" in reason and "hang_check: off" in reason
    first = runtime.gangs[(job.id, 1)]
    assert first.stopped_at is not None and first.stop_grace_s == 2.0
    last_step_at = first.launched_at + 3
    assert 30 <= first.stopped_at - last_step_at <= 30 + 2 * TICK_S
    assert "RESTARTING" in transitions(store, job)


def test_a_job_that_said_it_steps_but_never_does_is_hung_after_the_startup_grace(
    store: Store, clock: ManualClock, tmp_path: Path
) -> None:
    """Its ranks wrote train.init's start record at launch; no step came within 60 s."""
    health = HealthConfig(startup_grace_s=60.0)
    with fake_loop(store, clock, tmp_path / "state", health=health) as (loop, runtime):
        job = submit(store, "slow-start")
        runtime.scripts[job.id] = Script(steps=None, start_s=10_000)
        run_until(loop, clock, lambda: state(store, job) is JobState.FAILED)
        gang = runtime.gangs[(job.id, 1)]
        assert gang.stopped_at is not None
        assert 60 <= gang.stopped_at - gang.launched_at <= 60 + 2 * TICK_S
        message = store.get_job(None, job.id).exit_message or ""
        assert message.startswith("hung: rank 0 made no first step 6"), message
        assert "after aicluster.train.init said it would step (limit 60s" in message
        assert "health.startup_grace_s" in message


def test_a_plain_script_that_never_steps_outlives_the_startup_grace_and_succeeds(
    store: Store, clock: ManualClock, tmp_path: Path
) -> None:
    """A 200 s script that neither says it steps nor steps (no torch, no aicluster.train):
    never watched for a hang, whatever the grace."""
    health = HealthConfig(startup_grace_s=60.0)
    with fake_loop(store, clock, tmp_path / "state", health=health) as (loop, runtime):
        job = submit(store, "plain", workers=2, max_restarts=3)
        runtime.scripts[job.id] = Script(steps=0, start_s=200, declares=False)
        took = run_until(loop, clock, lambda: state(store, job) is JobState.SUCCEEDED)
        assert 200 <= took <= 200 + 2 * TICK_S
        assert store.get_job(None, job.id).attempt == 1
        assert not [e for e in store.events(job.id) if e.kind == "job.hung"]


def test_a_plain_script_that_stepped_then_stopped_is_hung(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    """Its steps (the step-timing shim's) make it watched, without any start record."""
    loop, runtime = live
    job = submit(store, "plain-hangs")
    runtime.scripts[job.id] = Script(steps=None, hang_at=3, declares=False)
    run_until(loop, clock, lambda: state(store, job) is JobState.FAILED)
    message = store.get_job(None, job.id).exit_message or ""
    assert message.startswith("hung: rank 0 made no progress for 30s after its last step"), message


def test_hang_check_from_start_wants_a_first_step_within_the_grace(
    store: Store, clock: ManualClock, tmp_path: Path
) -> None:
    health = HealthConfig(startup_grace_s=60.0)
    with fake_loop(store, clock, tmp_path / "state", health=health) as (loop, runtime):
        job = submit(store, "strict", hang_check="from_start")
        runtime.scripts[job.id] = Script(steps=0, start_s=200, declares=False)
        run_until(loop, clock, lambda: state(store, job) is JobState.FAILED)
        message = store.get_job(None, job.id).exit_message or ""
        assert "after the attempt's start (hang_check: from_start)" in message, message


def test_hang_check_off_never_stops_a_job_as_hung(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    loop, runtime = live
    job = submit(store, "trusted", hang_check="off")
    runtime.scripts[job.id] = Script(steps=None, hang_at=3)
    run_until(loop, clock, lambda: state(store, job) is JobState.RUNNING)
    run_until(loop, clock, lambda: clock.now() - runtime.gangs[(job.id, 1)].launched_at > 150, 200)
    assert state(store, job) is JobState.RUNNING
    assert not [e for e in store.events(job.id) if e.kind == "job.hung"]


def test_a_lost_node_fails_the_attempt_and_the_job_runs_again(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    loop, runtime = live
    job = submit(store, "lost", max_restarts=1)
    runtime.scripts[job.id] = Script(steps=30)
    run_until(loop, clock, lambda: state(store, job) is JobState.RUNNING)
    clock.advance(5)
    runtime.lose_node(runtime.gangs[(job.id, 1)].nodes[0])
    run_until(loop, clock, lambda: state(store, job) is JobState.SUCCEEDED)
    assert store.get_job(None, job.id).attempt == 2
    assert "was lost" in _reasons(store, job, "RESTARTING")


def test_the_same_error_twice_in_a_row_ends_the_job_with_it(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    """restart_on: infrastructure (the default): the job's own error restarts once; its
    identical repeat (exit code, last line of stderr) ends it FAILED, restarts left or not."""
    loop, runtime = live
    job = submit(store, "raises", max_restarts=3)
    runtime.scripts[job.id] = Script(steps=5, exit_code=1, stderr="ValueError: bad batch")
    run_until(loop, clock, lambda: state(store, job) is JobState.FAILED)
    failed = store.get_job(None, job.id)
    assert (failed.attempt, failed.restarts, failed.exit_code) == (2, 1, 1)
    message = failed.exit_message or ""
    assert message.startswith("rank 0 on node-"), message
    assert "exited with code 1: ValueError: bad batch (the same failure twice in a row" in message
    assert "restart_on: any" in message


def test_a_different_error_of_the_job_restarts_it(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    loop, runtime = live
    job = submit(store, "flaky", max_restarts=3)
    runtime.scripts[job.id] = Script(steps=5, exit_code=1, stderr="OSError: fetch failed")
    run_until(loop, clock, lambda: transitions(store, job).count("RESTARTING") == 1)
    runtime.scripts[job.id] = Script(steps=5, exit_code=1, stderr="RuntimeError: NCCL error")
    run_until(loop, clock, lambda: transitions(store, job).count("RESTARTING") == 2)
    runtime.scripts[job.id] = Script(steps=5)
    run_until(loop, clock, lambda: state(store, job) is JobState.SUCCEEDED)
    assert store.get_job(None, job.id).restarts == 2


def test_a_node_lost_twice_restarts_the_job_twice(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    """The infrastructure's failures, identical or not, restart until max_restarts."""
    loop, runtime = live
    job = submit(store, "unlucky", max_restarts=2)
    runtime.scripts[job.id] = Script(steps=30)
    for attempt in (1, 2):

        def running(attempt: int = attempt) -> bool:
            record = store.get_job(None, job.id)
            return record.attempt == attempt and record.state is JobState.RUNNING

        run_until(loop, clock, running)
        clock.advance(5)
        runtime.lose_node(runtime.gangs[(job.id, attempt)].nodes[0])
    run_until(loop, clock, lambda: state(store, job) is JobState.SUCCEEDED)
    assert (store.get_job(None, job.id).attempt, store.get_job(None, job.id).restarts) == (3, 2)


def test_a_failed_launch_goes_back_to_the_queue_and_launches_again(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    loop, runtime = live
    job = submit(store, "unplaceable")
    runtime.scripts[job.id] = Script(launch_error="node-1 died meanwhile")
    run_until(loop, clock, lambda: "launch failed" in _reasons(store, job))
    assert state(store, job) in (JobState.PENDING, JobState.STARTING)
    runtime.scripts[job.id] = Script(steps=2)
    run_until(loop, clock, lambda: state(store, job) is JobState.SUCCEEDED)
    assert store.get_job(None, job.id).restarts == 0  # a launch that failed is not a restart


def test_cancelling_a_running_job_stops_its_gang_with_the_grace_period(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    loop, runtime = live
    job = submit(store, "cancelled")
    runtime.scripts[job.id] = Script(steps=None)
    run_until(loop, clock, lambda: state(store, job) is JobState.RUNNING)
    store.cancel_job("a", job.id, "tester")
    run_until(loop, clock, lambda: state(store, job) is JobState.CANCELLED)
    gang = runtime.gangs[(job.id, 1)]
    assert gang.stopped_at is not None and gang.stop_grace_s == 3
    assert loop.state is not None and not loop.state.running


def test_a_preempted_job_keeps_the_progress_it_saved_in_its_grace_period(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    """A low-priority job on every GPU is preempted for a high-priority one: it saves on
    SIGTERM, comes back to the queue with its progress and no lost work, and finishes after."""
    loop, runtime = live
    low = submit(store, "low", workers=2, priority="low")
    runtime.scripts[low.id] = Script(steps=40, checkpoint_every=10)
    run_until(loop, clock, lambda: state(store, low) is JobState.RUNNING)
    clock.advance(13)  # 13 steps: the last periodic checkpoint at step 10
    high = submit(store, "high", priority="high")
    runtime.scripts[high.id] = Script(steps=2)
    run_until(loop, clock, lambda: state(store, high) is JobState.SUCCEEDED)
    run_until(loop, clock, lambda: state(store, low) is JobState.SUCCEEDED)
    events = store.events(low.id)
    (requeued,) = [e for e in events if e.from_state == "PREEMPTING" and e.to_state == "PENDING"]
    assert requeued.details["checkpointed_in_grace"] is True
    assert requeued.details["lost_gpu_seconds"] == 0
    progress = requeued.details["progress"]
    assert progress["restarts"] == 1
    assert progress["attained_gpu_seconds"] == pytest.approx(16 * progress["last_run_seconds"])
    assert store.get_job(None, low.id).attempt == 2


def test_a_preempted_job_that_ignores_sigterm_loses_the_work_since_its_checkpoint(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    loop, runtime = live
    low = submit(store, "stubborn", workers=2, priority="low")
    runtime.scripts[low.id] = Script(steps=None, checkpoint_every=10, ignores_sigterm=True)
    run_until(loop, clock, lambda: state(store, low) is JobState.RUNNING)
    clock.advance(13)
    high = submit(store, "urgent", priority="high")
    runtime.scripts[high.id] = Script(steps=2)
    run_until(loop, clock, lambda: state(store, high) is JobState.RUNNING)
    events = store.events(low.id)
    (requeued,) = [e for e in events if e.from_state == "PREEMPTING" and e.to_state == "PENDING"]
    assert requeued.details["checkpointed_in_grace"] is False
    # 16 GPUs lost the seconds since the checkpoint at step 10 (3 s and the ticks between).
    assert 16 * 3 <= requeued.details["lost_gpu_seconds"] <= 16 * (3 + 2 * TICK_S)


def test_a_job_inside_its_minimum_run_time_is_not_preempted_by_another_tenant(
    store: Store, clock: ManualClock, tmp_path: Path
) -> None:
    """Live as simulated (scheduler/protection.py): tenant b's low-priority job on every GPU
    keeps them for its minimum run time against tenant a's high-priority job, which waits
    saying so and starts once the minimum has passed."""
    config = SchedulerConfig(queue="priority", min_runtime_s=20.0, cooldown_s=0.0)
    with fake_loop(store, clock, tmp_path / "state", config, stop_grace_s=3) as (loop, runtime):
        low = submit(store, "low", workers=2, priority="low", tenant="b")
        runtime.scripts[low.id] = Script(steps=None)
        run_until(loop, clock, lambda: state(store, low) is JobState.RUNNING)
        assert loop.state is not None
        started = loop.state.running[low.id].started_at  # its admission, as the scheduler saw it
        high = submit(store, "high", priority="high", tenant="a")
        runtime.scripts[high.id] = Script(steps=2)

        def reason() -> str:
            return store.get_job(None, high.id).pending_reason or ""

        run_until(loop, clock, lambda: "protected" in reason())
        assert "protected: job" in reason() and "of its 20 s minimum" in reason(), reason()
        run_until(loop, clock, lambda: state(store, low) is JobState.PREEMPTING)
        assert started + 20.0 <= clock.now() <= started + 20.0 + 2 * TICK_S
        run_until(loop, clock, lambda: state(store, high) is JobState.SUCCEEDED)
        requeued = store.get_job(None, low.id).progress or {}
        assert requeued.get("preempted_at") is not None  # its cool-down survives the store


def test_a_new_loop_adopts_running_gangs_and_releases_those_no_job_owns(
    store: Store, clock: ManualClock, tmp_path: Path
) -> None:
    """A leader's successor follows the gangs the store says run (never launching them again)
    and releases what no job owns."""
    with fake_loop(store, clock, tmp_path / "state") as (loop, runtime):
        job = submit(store, "adopted")
        runtime.scripts[job.id] = Script(steps=20)
        run_until(loop, clock, lambda: state(store, job) is JobState.RUNNING)
    orphan_spec = replace(runtime.launches[0], job_id="j-orphan", attempt=1)
    orphan = FakeGang(orphan_spec, Script(steps=None), clock, clock.now(), ("node-0",))
    runtime.gangs[("j-orphan", 1)] = orphan
    successor = ControlLoop(store, runtime, None, clock, LoopSettings(), executor=InlineExecutor())
    launches = len(runtime.launches)
    run_until(successor, clock, lambda: state(store, job) is JobState.SUCCEEDED)
    assert len(runtime.launches) == launches  # followed, not launched again
    assert orphan.stopped_at is not None
    (event,) = store.events_of_kind(("cluster.orphans_released",))
    assert event.details["count"] == 1 and event.details["gangs"] == ["j-orphan/1"]
    successor.launcher.shutdown()


def test_a_reconfigured_loop_still_shows_the_running_jobs_usage_while_it_rebuilds(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    """configure() drops the working state (rebuilt from the store at the next tick); the views,
    read from the API's thread, keep the last tick's until then: never a tenant using nothing."""
    loop, runtime = live
    job = submit(store, "held", gpus=4)
    runtime.scripts[job.id] = Script(steps=None)
    run_until(loop, clock, lambda: state(store, job) is JobState.RUNNING)
    shown = {"a": {"H100": 4}}
    assert loop.usage_by_tenant() == shown
    loop.configure(Configuration(policy=PolicySection(name="fifo")))
    assert loop.state is None  # rebuilt at the next tick
    assert loop.usage_by_tenant() == shown and sum(loop.gpus_used_by_node().values()) == 4
    loop.tick()
    assert loop.config.queue == "fifo" and loop.usage_by_tenant() == shown


def _reasons(store: Store, job: JobRecord, to_state: str | None = None) -> str:
    """The reasons of the job's transitions (to ``to_state`` only, when given)."""
    events = store.events(job.id)
    return " ".join(
        str(e.details.get("reason", "")) for e in events if to_state in (None, e.to_state)
    )


def test_cordoned_nodes_get_nothing_new_and_pending_jobs_say_why(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    loop, runtime = live
    loop.tick()
    store.set_node_health("node-0", NodeHealth.CORDONED, "tester", "maintenance")
    wide = submit(store, "wide", workers=2)
    run_until(loop, clock, lambda: bool(store.get_job(None, wide.id).pending_reason))
    record = store.get_job(None, wide.id)
    assert record.state is JobState.PENDING and not runtime.launches
    expected = "needs 2 workers × 8 GPUs (whole nodes) = 16 GPUs; the cluster has 16 GPUs, 8 free"
    assert expected in (record.pending_reason or ""), record.pending_reason
    assert [entry.job_id for entry in loop.queue] == [wide.id]
    store.set_node_health("node-0", NodeHealth.HEALTHY, "tester")
    run_until(loop, clock, lambda: state(store, wide) is JobState.SUCCEEDED)


def test_a_slow_rank_is_flagged_and_its_node_cordoned(
    store: Store, clock: ManualClock, tmp_path: Path
) -> None:
    with fake_loop(store, clock, tmp_path / "state", cordon_stragglers=True) as (loop, runtime):
        job = submit(store, "slow", workers=2, gpus=4)
        runtime.scripts[job.id] = Script(steps=40, compute_s={1: 1.5})
        run_until(loop, clock, lambda: state(store, job) is JobState.SUCCEEDED)
        flagged = [e for e in store.events(job.id) if e.kind == "job.straggler"]
        assert [e.details["rank"] for e in flagged] == [1]
        node = flagged[0].details["node"]
        assert node == runtime.gangs[(job.id, 1)].nodes[1]
        assert store.get_node(node).health is NodeHealth.CORDONED


def test_draining_a_node_moves_its_job_elsewhere(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    loop, runtime = live
    job = submit(store, "mover")
    runtime.scripts[job.id] = Script(steps=None, checkpoint_every=5)
    run_until(loop, clock, lambda: state(store, job) is JobState.RUNNING)
    (node,) = set(runtime.gangs[(job.id, 1)].nodes)
    store.set_node_health(node, NodeHealth.DRAINING, "tester", "maintenance")
    run_until(
        loop,
        clock,
        lambda: store.get_job(None, job.id).attempt == 2 and state(store, job) is JobState.RUNNING,
    )
    assert node not in runtime.gangs[(job.id, 2)].nodes
    assert "PREEMPTING" in transitions(store, job)
    assert runtime.gangs[(job.id, 1)].stop_grace_s == 3  # a drain gives the grace period


def test_an_elastic_job_shrinks_to_fit_and_grows_back(
    store: Store, clock: ManualClock, tmp_path: Path
) -> None:
    with fake_loop(store, clock, tmp_path / "state", grow_after_s=1.0) as (loop, runtime):
        blocker = submit(store, "blocker")
        runtime.scripts[blocker.id] = Script(steps=None)
        run_until(loop, clock, lambda: state(store, blocker) is JobState.RUNNING)
        spec = jobspec_from_mapping(
            {
                "name": "elastic",
                "entrypoint": "train.py",
                "code": "0" * 64,
                "workers": 4,
                "min_workers": 2,
                "resources": {"gpus": 4},
            }
        )
        elastic, _ = store.submit_job("a", spec, "tester")
        runtime.scripts[elastic.id] = Script(steps=None, checkpoint_every=5)
        run_until(loop, clock, lambda: state(store, elastic) is JobState.RUNNING)
        assert runtime.gangs[(elastic.id, 1)].spec.workers == 2  # half the cluster is taken
        store.cancel_job("a", blocker.id, "tester")
        run_until(
            loop,
            clock,
            lambda: (
                store.get_job(None, elastic.id).attempt == 2
                and state(store, elastic) is JobState.RUNNING
            ),
        )
        assert runtime.gangs[(elastic.id, 2)].spec.workers == 4
        env = runtime.gangs[(elastic.id, 1)].spec.env
        assert env["AICLUSTER_REQUESTED_WORKERS"] == "4"


# -- the cost of preemption (control.views.preemptioncost: shown by /metrics, status, the dashboard)


def runs(store: Store, job_id: str) -> list[tuple[float, float]]:
    """The job's runs as (admitted, GPUs taken back) from its transitions."""
    found, opened = [], None
    for event in store.events(job_id):
        if event.to_state == "STARTING":
            opened = event.at
        elif event.to_state in ("PREEMPTING", "SUCCEEDED") and opened is not None:
            found.append((opened, event.at))
            opened = None
    return found


def test_a_priority_preemption_is_counted_against_the_victims_tenant(
    store: Store, clock: ManualClock, tmp_path: Path
) -> None:
    # No minimum run time: another tenant's higher priority preempts at once.
    config = SchedulerConfig(queue="priority", min_runtime_s=0.0, cooldown_s=0.0)
    with fake_loop(store, clock, tmp_path / "state", config, stop_grace_s=3) as (loop, runtime):
        low = submit(store, "low", workers=2, priority="low", tenant="a")
        runtime.scripts[low.id] = Script(steps=30, checkpoint_every=10, ignores_sigterm=True)
        run_until(loop, clock, lambda: state(store, low) is JobState.RUNNING)
        clock.advance(13)  # 13 steps: the last checkpoint at step 10
        high = submit(store, "high", priority="high", tenant="b")
        runtime.scripts[high.id] = Script(steps=2)
        run_until(loop, clock, lambda: state(store, low) is JobState.SUCCEEDED)

    costs = PreemptionTally().read(store, clock.now())
    a, b = costs["a"], costs["b"]
    (requeued,) = [e for e in store.events(low.id) if e.to_state == "PENDING" and e.from_state]
    lost = requeued.details["lost_gpu_seconds"]
    assert lost >= 16 * 3  # the work since the checkpoint
    assert (a.preemptions, a.by_kind, a.lost_gpu_seconds) == (1, {"priority": 1}, lost)
    assert (b.preemptions, b.by_kind) == (0, {})
    admitted = {job.id: sum(end - at for at, end in runs(store, job.id)) for job in (low, high)}
    assert a.admitted_gpu_seconds == pytest.approx(16 * admitted[low.id])
    assert b.admitted_gpu_seconds == pytest.approx(8 * admitted[high.id])
    assert a.evictions_per_gpu_hour == pytest.approx(1 / (a.admitted_gpu_seconds / 3600))


def test_a_drain_is_a_preemption_of_its_own_kind_and_the_tally_reads_each_event_once(
    live: tuple[ControlLoop, FakeRuntime], store: Store, clock: ManualClock
) -> None:
    loop, runtime = live
    tally = PreemptionTally()
    job = submit(store, "mover", tenant="b")
    runtime.scripts[job.id] = Script(steps=None, checkpoint_every=5)
    run_until(loop, clock, lambda: state(store, job) is JobState.RUNNING)
    assert tally.read(store, clock.now())["b"].preemptions == 0
    (node,) = set(runtime.gangs[(job.id, 1)].nodes)
    store.set_node_health(node, NodeHealth.DRAINING, "tester", "maintenance")
    run_until(
        loop,
        clock,
        lambda: store.get_job(None, job.id).attempt == 2 and state(store, job) is JobState.RUNNING,
    )
    for _ in range(2):  # read again: nothing new, nothing counted twice
        cost = tally.read(store, clock.now())["b"]
        assert (cost.preemptions, cost.by_kind) == (1, {"drain": 1})
    assert cost.lost_gpu_seconds == 0  # it saved in its grace period
    (first, *_) = runs(store, job.id)
    assert cost.admitted_gpu_seconds > 8 * (first[1] - first[0])  # and the open run, up to now
