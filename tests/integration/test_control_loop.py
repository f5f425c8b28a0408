"""The control loop on a real 4-node Ray cluster and real stores (SQLite and PostgreSQL): one
end-to-end test per path that needs real processes (success with goodput, CPU placement,
preemption with a real grace checkpoint, a hang of a stopped process, gangs no job owns). A new
user's plain scripts on the same loop: ``test_plain_scripts.py``.

The loop's rules themselves (restart and back-off, cancellation, cordoned and draining nodes,
stragglers, elastic jobs, adoption) run over the fake runtime in
``tests/unit/test_control_loop_rules.py``."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from looprun import STEPS, live_loop, one_backend, run_until, state_of, submit, two_tenant_loop
from shipping import JOBS

from aicluster.api.schemas import JobOut
from aicluster.control.loop.health import HealthConfig
from aicluster.control.loop.loop import ControlLoop
from aicluster.core import DomainLevel, JobState, Placement, Slot, Tenant
from aicluster.runtime import GangSpec, Runtime
from aicluster.scheduler import SchedulerConfig
from aicluster.store import Store

pytestmark = pytest.mark.integration


#: A node's CPUs (the session's cluster: 8 GPUs and 8 CPUs a node). A worker of one GPU that asks
#: them all takes a node as a worker of 8 GPUs would, with one rank (a rank per GPU) not 8.
NODE_CPUS = 8.0
RESUMABLE = "resumable.py"  # checkpoints, and saves when asked to stop
MINIMUM_S = 20.0  # the live minimum run time test's: long enough to see the job wait


@pytest.fixture
def loop(store_url: str, runtime: Runtime) -> Iterator[ControlLoop]:
    with two_tenant_loop(store_url, runtime) as control:
        yield control


def test_a_job_runs_to_success_on_the_nodes_it_was_given(loop: ControlLoop) -> None:
    job = submit(loop, "ok", workers=2, cpus=NODE_CPUS)
    run_until(loop, lambda: state_of(loop, job.id) is JobState.SUCCEEDED)
    done = loop.store.get_job(None, job.id)
    assert done.attempt == 1 and done.placement is not None
    nodes = {slot[0] for slot in done.placement["slots"]}
    assert len(nodes) == 2  # 2 workers of a node's CPUs each: two whole nodes
    events = loop.store.events(job.id)
    assert [e.to_state for e in events if e.to_state][-3:] == ["STARTING", "RUNNING", "SUCCEEDED"]
    (report,) = [e.details for e in events if e.kind == "job.goodput"]
    assert report["attempts"] == 1 and 0 < report["ettr"] <= 1
    assert loop.state is not None and not loop.state.running


@one_backend("sqlite")
def test_jobs_without_gpus_run_to_success_under_their_tenants_cpu_cap(loop: ControlLoop) -> None:
    """A gang of two CPU-only workers is placed by CPUs and memory, runs and SUCCEEDS; with
    tenant a capped at 2 CPUs a second such job waits, its reason naming CPUs, and starts once
    the first ends."""
    loop.store.put_tenant(Tenant("a", cpu_quota=2.0), "test")
    first = submit(loop, "cpu-first", workers=2, gpus=0, steps=8, cpus=1.0)
    second = submit(loop, "cpu-second", workers=2, gpus=0, steps=3, cpus=1.0)
    run_until(loop, lambda: state_of(loop, first.id) is JobState.RUNNING)
    waiting = {entry.job_id: entry for entry in loop.queue}
    assert state_of(loop, second.id) is JobState.PENDING
    assert "uses 2 of 2 CPUs" in waiting[second.id].reason, waiting[second.id].reason
    run_until(loop, lambda: state_of(loop, second.id) is JobState.SUCCEEDED)
    for job in (first, second):
        done = loop.store.get_job(None, job.id)
        assert done.state is JobState.SUCCEEDED
        assert done.placement is not None
        assert [slot[1:] for slot in done.placement["slots"]] == [[0, 0, 1.0, 0.1]] * 2


@one_backend("postgresql")  # the progress kept in a JSONB column
def test_a_preempted_job_resumes_from_its_grace_checkpoint_with_its_progress(
    loop: ControlLoop,
) -> None:
    """Preemption with checkpoints, live: the victim saves in its grace period, comes back to
    the queue keeping its progress (in the store, so a failover keeps it too), resumes at the
    step after the one it saved, and loses no work; the simulator says the same of that event."""
    low = submit(
        loop, "low", workers=4, steps=60, priority="low", entrypoint=RESUMABLE,
        extra=("--every", "10", "--step-seconds", "0.2"), cpus=NODE_CPUS,
    )  # fmt: skip
    run_until(loop, lambda: last_step(loop, low.id) >= 13, timeout_s=180)
    high = submit(loop, "high", workers=2, steps=2, priority="high", cpus=NODE_CPUS)
    run_until(loop, lambda: state_of(loop, high.id) is JobState.SUCCEEDED, timeout_s=180)
    run_until(loop, lambda: state_of(loop, low.id) is JobState.SUCCEEDED, timeout_s=180)
    done = loop.store.get_job(None, low.id)
    assert done.attempt == 2
    events = loop.store.events(low.id)
    (requeued,) = [e for e in events if e.from_state == "PREEMPTING" and e.to_state == "PENDING"]
    assert requeued.details["checkpointed_in_grace"] is True
    assert requeued.details["lost_gpu_seconds"] == 0
    progress = requeued.details["progress"]
    ran = progress["last_run_seconds"]
    assert progress["restarts"] == 1
    assert progress["executed_seconds"] == pytest.approx(ran, abs=0.01)
    assert progress["attained_gpu_seconds"] == pytest.approx(4 * ran, rel=0.01)
    assert done.progress == progress  # kept in the job's row until another interruption
    assert JobOut.of(done).progress == progress  # and shown with the job
    assert loop.runtime is not None
    saved = max(r.step for r in loop.runtime.telemetry(low.id, 1)[0] if r.kind == "checkpoint")
    assert saved >= 13  # the grace checkpoint, after the periodic one at step 10
    first = min(r.step for r in loop.runtime.telemetry(low.id, 2)[0] if r.kind == "step")
    assert first == saved + 1
    # The same event in a replay: the same jobs, the preemption at the same point of the run;
    # the same lost work within one checkpoint interval.
    lost = _simulated_preemption_loss(preempted_at=ran, checkpoint_every_s=10 * 0.2)
    assert abs(lost - requeued.details["lost_gpu_seconds"]) <= 4 * 10 * 0.2


@one_backend("sqlite")
def test_a_job_inside_its_minimum_run_time_keeps_its_gpus_until_the_minimum_passes(
    store_url: str, runtime: Runtime
) -> None:
    """The minimum run time, live (scheduler/protection.py; the rule itself over the fake
    runtime: test_control_loop_rules.py): tenant b's low-priority job on every node keeps them
    against tenant a's high-priority job, which waits saying so, then starts once b's job has
    run its minimum (and b's job is preempted then, not before)."""
    store = Store.open(store_url)
    for name in ("a", "b"):
        store.create_tenant(Tenant(name), "test")
    config = SchedulerConfig(queue="priority", min_runtime_s=MINIMUM_S, cooldown_s=0.0)
    with live_loop(store, runtime, config, stop_grace_s=3) as loop:
        low = submit(
            loop, "low", tenant="b", workers=4, steps=100_000, priority="low", cpus=NODE_CPUS,
            extra=("--step-seconds", "0.2"),
        )  # fmt: skip
        run_until(loop, lambda: state_of(loop, low.id) is JobState.RUNNING, timeout_s=180)
        assert loop.state is not None
        started = loop.state.running[low.id].started_at
        high = submit(loop, "high", tenant="a", workers=2, priority="high", cpus=NODE_CPUS)

        def reason() -> str:
            return loop.store.get_job(None, high.id).pending_reason or ""

        run_until(loop, lambda: "protected" in reason(), timeout_s=60)
        assert f"of its {MINIMUM_S:g} s minimum" in reason(), reason()
        run_until(loop, lambda: state_of(loop, low.id) is not JobState.RUNNING, timeout_s=120)
        preempted = loop.clock.now()
        assert preempted >= started + MINIMUM_S, (preempted - started, reason())
        run_until(loop, lambda: state_of(loop, high.id) is JobState.SUCCEEDED, timeout_s=180)
        (stop,) = [e for e in loop.store.events(low.id) if e.to_state == "PREEMPTING"]
        assert stop.at >= started + MINIMUM_S


def _simulated_preemption_loss(*, preempted_at: float, checkpoint_every_s: float) -> float:
    """GPU-seconds the simulator loses when the low job (a GPU on each of the 4 nodes) is
    preempted by the high one (2 nodes) ``preempted_at`` seconds into its run, its jobs
    checkpointing as the live job does (periodically, and in the grace period). The live jobs
    take whole nodes by their CPUs; the simulator counts GPUs: nodes of one GPU here."""
    from aicluster.core import make_cluster
    from aicluster.sim import Simulator
    from aicluster.sim.config import SimConfig
    from aicluster.sim.traces import TraceJob

    jobs = [
        TraceJob("low", 0.0, preempted_at + 10.0, 4, priority=100),
        TraceJob("high", preempted_at, 0.4, 2, priority=300),
    ]
    config = SimConfig(
        checkpoint_interval=checkpoint_every_s,
        checkpoint_on_preemption=True,
        restart_overhead=0.0,
        failures=False,
    )
    result = Simulator(
        make_cluster(nodes=4, gpus_per_node=1), jobs, scheduler=SchedulerConfig(queue="priority"),
        config=config,
    ).run()  # fmt: skip
    assert result.totals.preemptions == 1
    return result.totals.lost_to_preemptions


def last_step(loop: ControlLoop, job_id: str) -> int:
    monitor = loop.gangs.watch.monitors.get(job_id, (None,))[0]
    return monitor.last_step if monitor is not None else 0


def start_pid(loop: ControlLoop, job_id: str, rank: int) -> int:
    assert loop.runtime is not None
    records = loop.runtime.telemetry(job_id)[rank]
    return int(next(r for r in records if r.kind == "start").metrics["pid"])


@one_backend("sqlite")
def test_a_stopped_worker_is_detected_as_a_hang_and_the_gang_restarted(loop: ControlLoop) -> None:
    loop.settings = replace(loop.settings, health=HealthConfig(hang_floor_s=10, startup_grace_s=60))
    job = submit(loop, "hang", workers=2, steps=2000, max_restarts=1)
    run_until(
        loop,
        lambda: (
            loop.gangs.watch.monitors.get(job.id, (None,))[0] is not None
            and loop.gangs.watch.monitors[job.id][0].last_step >= 3
        ),
    )
    os.kill(start_pid(loop, job.id, 1), signal.SIGSTOP)
    stopped_at = time.monotonic()
    run_until(
        loop,
        lambda: (
            loop.store.get_job(None, job.id).attempt == 2
            and state_of(loop, job.id) is JobState.RUNNING
        ),
        timeout_s=120,
    )
    detected = time.monotonic() - stopped_at
    print(f"hang detected and gang restarted {detected:.1f}s after SIGSTOP")
    assert detected < 60
    kinds = [e.kind for e in loop.store.events(job.id)]
    assert "job.hung" in kinds
    assert loop.store.get_job(None, job.id).restarts == 1
    loop.store.cancel_job("a", job.id, "tester")
    run_until(loop, lambda: state_of(loop, job.id) is JobState.CANCELLED)


def test_at_start_the_loop_releases_gangs_no_job_owns(loop: ControlLoop) -> None:
    """A gang of this state directory that the store knows nothing of (its launcher died before
    anything was written, or the store was restored from an older backup) is removed from Ray
    at the loop's first tick, and counted in an event."""
    assert loop.runtime is not None
    job_id = f"orphan-{os.urandom(4).hex()}"
    orphan = GangSpec(
        job_id=job_id,
        entrypoint=STEPS,
        args=("--steps", "1000"),
        placement=Placement((Slot("node-3", 1),), DomainLevel.NODE, "node-3"),
        workers=1,
        gpus_per_worker=1,
        working_dir=str(JOBS),
    )
    loop.runtime.launch(orphan)
    assert any(g.job_id == job_id for g in loop.runtime.live_gangs())
    loop.tick()
    run_until(loop, lambda: not any(g.job_id == job_id for g in loop.runtime.live_gangs()))
    (event,) = loop.store.events_of_kind(("cluster.orphans_released",))
    assert event.details["count"] == 1 and event.details["gangs"] == [f"{job_id}/0"]
