"""The lifecycle of a job's gangs: launch, watch, stop, and settle how each attempt ended.

Part of :class:`aicluster.control.loop.ControlLoop` (a base class, to keep modules small); every
Ray call goes through the :class:`~aicluster.control.launcher.Launcher` so a tick never blocks.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from aicluster.control.faults import JobFaults
from aicluster.control.goodput import job_goodput
from aicluster.control.health import GangMonitor, HealthConfig, Straggler
from aicluster.control.launcher import Launcher, Outcome
from aicluster.control.progress import progress_to_json
from aicluster.control.registry import register_on_success
from aicluster.core import Clock, JobState
from aicluster.runtime import GangPhase, GangSpec, GangStatus, Runtime, TelemetryCursor
from aicluster.scheduler import SchedulerState, effects
from aicluster.scheduler.effects import Interruption
from aicluster.store import (
    JobRecord,
    LeaseLost,
    NodeHealth,
    StaleState,
    Store,
    placement_from_json,
)

__all__ = ["ACTOR", "GangLifecycle"]

ACTOR = "control-loop"
log = logging.getLogger(__name__)


class GangLifecycle:
    """Launching, watching and settling gangs; the loop supplies the state below."""

    store: Store
    runtime: Runtime | None
    clock: Clock
    state: SchedulerState | None
    launcher: Launcher
    health: HealthConfig
    stop_grace_s: float
    backoff_s: tuple[float, float]
    cordon_stragglers: bool
    records: dict[str, JobRecord]
    launched: set[str]
    stopping: set[str]
    monitors: dict[str, tuple[GangMonitor, TelemetryCursor | None]]
    # Jobs stopped to be requeued (preempted, drained, grown), out of the state until their gang
    # has stopped: the interruption and how many checkpoints the job had reported by then.
    interrupted: dict[str, tuple[Interruption, int]]
    backoff: dict[str, float]
    crash_streak: dict[str, int]
    faults: JobFaults
    stats: Any
    lease: Callable[[], bool] | None

    def wake(self) -> None:
        """Run the next tick at once (the loop overrides it)."""

    def _check_lease(self) -> None:
        """Just before a Ray call (the launcher's guard): raise :class:`LeaseLost` unless this
        server still leads, by its own clock and by the lease's epoch in the store."""
        if self.lease is not None and not self.lease():
            raise LeaseLost("the leader lease is gone: no more Ray calls from this server")
        self.store.check_fence()  # a no-op unless the store is fenced (a leader's)

    def _guard(self, job_id: str, step: str) -> AbstractContextManager[None]:
        """A per-job step whose faults are the job's (the loop overrides it)."""
        return contextlib.nullcontext()

    def _watch(self, record: JobRecord, handle: Any, now: float) -> None:
        """Follow the gang's telemetry: flag stragglers, restart a hung gang."""
        monitor, cursor = self.monitors.get(record.id, (None, None))
        if monitor is None:
            monitor = GangMonitor(record.spec.workers, now, self.health)
            # Each rank's node as the launcher placed it (its root-only gang spec): a job's
            # telemetry may name any node, and a straggler's node may be cordoned.
            monitor.nodes.update(enumerate(handle.nodes))
        if cursor is None:
            cursor = handle.telemetry_cursor()
        self.monitors[record.id] = (monitor, cursor)
        for straggler in self._read_telemetry(record.id, monitor, cursor, now):
            details = {"rank": straggler.rank, "node": straggler.node, "ratio": straggler.ratio}
            details["step"] = straggler.step  # the step whose telemetry flagged it
            self.store.record_event(record.id, "job.straggler", ACTOR, details)
            if self.cordon_stragglers and straggler.node:
                self.store.set_node_health(
                    straggler.node, NodeHealth.CORDONED, ACTOR, straggler.describe()
                )
        hung = monitor.hung(now)
        if hung is not None:
            self.store.record_event(record.id, "job.hung", ACTOR, {"reason": hung})
            self._stop_gang(record.id, "hang", now, reason=hung)

    def _read_telemetry(
        self, job_id: str, monitor: GangMonitor, cursor: TelemetryCursor, now: float
    ) -> list[Straggler]:
        """Take in what the gang reported since the last read (through the safe reader); tell
        the state of the checkpoints it took. Returns the stragglers flagged now."""
        records = cursor.poll()
        self.faults.rejected(job_id, cursor.rejects.take())
        seen = len(monitor.checkpoints)
        stragglers = monitor.observe(records)
        if self.state is not None:
            for at, _ in monitor.checkpoints[seen:]:  # the job's clock: never past ours
                effects.checkpointed(self.state, job_id, min(at, now))
        return stragglers

    def _checkpoints_reported(self, job_id: str, now: float) -> int:
        """How many checkpoints the job's current attempt has reported, read up to now."""
        monitor, cursor = self.monitors.get(job_id, (None, None))
        if monitor is None:
            return 0
        if cursor is not None:
            self._read_telemetry(job_id, monitor, cursor, now)
        return len(monitor.checkpoints)

    def _preempt(self, job_id: str, now: float, reason: str | None) -> None:
        """Stop a running job to run it again later (preempted, drained, grown back): its GPUs
        return to the state at once (the plan's admissions count on them) and its progress is
        kept (``scheduler.effects``); it is queued again once its gang has stopped, which gives
        it the grace period to checkpoint."""
        state = self.state
        assert state is not None
        seen = self._checkpoints_reported(job_id, now)
        # Live, a job has saved what it reported saving (the declared interval is a promise).
        saved_at = state.running[job_id].last_checkpoint_at
        self.interrupted[job_id] = (effects.interrupt(state, job_id, now, saved_at=saved_at), seen)
        self._stop_gang(job_id, "preempt", now, reason=reason)

    def _requeue_preempted(self, job_id: str, now: float) -> None:
        """A preempted job's gang has stopped: back to the store's queue with its progress, all
        of it if the job checkpointed in its grace period (it reported one since the SIGTERM),
        else what its last checkpoint kept; the lost work is recorded on the transition."""
        held = self.interrupted.pop(job_id, None)
        progress, details = None, None
        if held is not None:
            stopped, seen = held
            saved_in_grace = self._checkpoints_reported(job_id, now) > seen
            if saved_in_grace:
                stopped = effects.account(
                    stopped.running, stopped.stopped_at, saved_at=stopped.stopped_at
                )
            progress = progress_to_json(stopped.progress, now)
            details = {
                "lost_gpu_seconds": round(stopped.lost_gpu_seconds, 3),
                "checkpointed_in_grace": saved_in_grace,
            }
        self.monitors.pop(job_id, None)  # the next attempt reports afresh
        self.store.transition(
            job_id,
            JobState.PENDING,
            ACTOR,
            reason="preempted: back in the queue",
            details=details,
            progress=progress,
        )

    def _finish(self, record: JobRecord, status: GangStatus | None, now: float) -> None:
        """Settle a gang that ended: success, a restart, or failure for good."""
        state = self.state
        assert state is not None
        self.launched.discard(record.id)
        self.stats.finished += 1
        self._release(record.id, record.attempt)
        _, cursor = self.monitors.get(record.id, (None, None))
        if cursor is not None:  # what was held back of the attempt's dropped records
            self.faults.rejected(record.id, cursor.rejects.take(), flush=True)
        if status is not None and status.phase is GangPhase.SUCCEEDED:
            effects.complete(state, record.id, now)
            self.records.pop(record.id, None)
            self.monitors.pop(record.id, None)
            self.crash_streak.pop(record.id, None)
            if self.runtime is not None:  # before the transition: a loop that dies in between
                # finds the gang succeeded again on restart, and registering is idempotent
                register_on_success(self.store, self.runtime.state_dir, record, ACTOR)
            self.store.transition(record.id, JobState.SUCCEEDED, ACTOR, reason="all ranks exited 0")
            self._record_goodput(record)
            return
        message = status.message if status is not None else "its gang vanished from Ray"
        codes = [r.exit_code for r in status.failed_ranks] if status is not None else []
        exit_code = next((code for code in codes if code is not None), None)
        self._restart_or_fail(record, message, exit_code, now)

    def _restart_or_fail(
        self, record: JobRecord, message: str, exit_code: int | None, now: float
    ) -> None:
        """A failed attempt: back to the queue after a backoff, or FAILED after max_restarts.
        Either way its GPUs (and its tenant's quota) are released at once."""
        state = self.state
        assert state is not None
        progress = None
        if record.id in state.running:
            self._checkpoints_reported(record.id, now)  # the last one it took, read up to now
            saved_at = state.running[record.id].last_checkpoint_at
            stopped = effects.interrupt(state, record.id, now, saved_at=saved_at)
            progress = progress_to_json(stopped.progress, now)
        self.records.pop(record.id, None)
        monitor, _ = self.monitors.pop(record.id, (None, None))
        if record.restarts < record.spec.max_restarts:
            # Back off exponentially only while attempts crash before their first step (a crash
            # loop); an attempt that trained restarts at once, whatever came before.
            progressed = monitor is not None and monitor.last_step > 0
            streak = 0 if progressed else self.crash_streak.get(record.id, 0) + 1
            self.crash_streak[record.id] = streak
            base, cap = self.backoff_s
            delay = 0.0 if streak == 0 else min(cap, base * 2 ** (streak - 1))
            self.store.transition(
                record.id,
                JobState.RESTARTING,
                ACTOR,
                reason=f"{message}; restarting in {delay:.0f}s",
                exit_code=exit_code,
                progress=progress,
            )
            self.backoff[record.id] = now + delay
            if delay == 0:
                self.wake()  # requeue and place it in the next tick, not an interval later
            return
        self.store.transition(
            record.id,
            JobState.FAILED,
            ACTOR,
            reason=f"{message} (after {record.restarts} restarts)",
            exit_code=exit_code,
        )

    def _record_goodput(self, record: JobRecord) -> None:
        if self.runtime is not None:
            result = job_goodput(self.runtime, record.id, record.attempt)
            self.store.record_event(record.id, "job.goodput", ACTOR, result.to_dict())

    def _end_backoffs(self, now: float) -> None:
        for job_id, when in list(self.backoff.items()):
            if when <= now:
                del self.backoff[job_id]
                with self._guard(job_id, "ending its backoff"), contextlib.suppress(StaleState):
                    self.store.transition(
                        job_id,
                        JobState.PENDING,
                        ACTOR,
                        expected_from=JobState.RESTARTING,
                        reason="restart: back in the queue",
                    )

    def _release(self, job_id: str, attempt: int) -> None:
        """Stop an ended or abandoned attempt's gang and free its Ray resources, in the
        background. Idempotent. Keyed apart from the job's own calls: the next attempt's launch
        never waits for it (Ray reserves the new gang once the old one is gone)."""
        call = self._stopper(job_id, attempt, 0)
        self.launcher.submit(f"{job_id}/{attempt}/release", "release", attempt, call)

    def _launch(self, record: JobRecord, now: float) -> None:
        if record.is_service and record.placement is not None:
            self._start_service(record)
            return
        if self.runtime is None or record.placement is None:
            return
        runtime = self.runtime
        spec = record.spec
        running = self.state.running.get(record.id) if self.state is not None else None
        job = running.job if running is not None else record.to_job()  # elastic: its size now
        env = {**spec.env, "AICLUSTER_JOB_ID": record.id, "AICLUSTER_TENANT": record.tenant}
        if job.workers != spec.workers:
            env["AICLUSTER_REQUESTED_WORKERS"] = str(spec.workers)
        user, disk_gb = None, None
        if runtime.sandbox is not None:
            uid = self.store.tenant_uid(
                record.tenant, runtime.sandbox.uid_first, runtime.sandbox.uid_last
            )
            user, disk_gb = (uid, uid), runtime.sandbox.job_disk_gb
        gang = GangSpec.for_job(
            job,
            placement_from_json(record.placement),
            spec.entrypoint,
            args=spec.args,
            env=env,
            attempt=record.attempt,
            module=spec.module,
            code=spec.code,
            user=user,
            disk_gb=disk_gb,
            secrets=spec.secret_values(),  # sealed: the rank's actor opens them
        )
        self.launched.add(record.id)
        self.stats.launched += 1
        self.launcher.submit(record.id, "launch", record.attempt, lambda: runtime.launch(gang))

    def _start_service(self, record: JobRecord) -> None:
        """A service job (a model deployment's replica) has no gang: once admitted it is
        RUNNING, and the serving leader runs one Serve replica on its node for it (see
        ``aicluster.serve.deployer``). Stopping it (preemption, cancel, a drain) goes the usual
        way, and its stop call finds no gang: the deployer drops the replica once the job is no
        longer RUNNING, and Ray frees its GPUs for whatever the scheduler placed there."""
        self.launched.add(record.id)
        self.stats.launched += 1
        if record.state is JobState.STARTING:
            self.records[record.id] = self.store.transition(
                record.id,
                JobState.RUNNING,
                ACTOR,
                expected_from=JobState.STARTING,
                reason="service replica admitted: the serving leader runs it",
            )

    def _stop_gang(self, job_id: str, why: str, now: float, reason: str | None = None) -> None:
        if job_id in self.stopping:
            return
        record = self.records[job_id]
        self.stopping.add(job_id)
        if why == "preempt" and record.state is not JobState.PREEMPTING:  # not yet (or adopted)
            self.records[job_id] = self.store.transition(
                job_id, JobState.PREEMPTING, ACTOR, reason=reason
            )
        grace = 2.0 if why == "hang" else self.stop_grace_s  # a hung gang will not checkpoint
        call = self._stopper(job_id, record.attempt, grace)
        self.launcher.submit(job_id, "stop", record.attempt, call, why=why, reason=reason)

    def _stopper(self, job_id: str, attempt: int, grace_s: float) -> Callable[[], Any]:
        """A call that stops the attempt's gang; looks it up when it runs, after any launch
        queued before it has landed."""
        runtime = self.runtime

        def stop() -> Any:
            handle = runtime.gang(job_id, attempt) if runtime is not None else None
            return handle.stop(grace_s) if handle is not None else None

        return stop

    def _on_outcome(self, outcome: Outcome, now: float) -> None:
        state = self.state
        assert state is not None
        record = self.records.get(outcome.job_id)
        if record is None or record.attempt != outcome.attempt:
            return
        if outcome.kind == "launch" and outcome.error is not None:
            log.warning("launch of %s failed: %s", outcome.job_id, outcome.error)
            progress = None
            if outcome.job_id in state.running:  # back in the queue at once, nothing trained
                running = state.running[outcome.job_id]
                stopped = effects.interrupt(
                    state, outcome.job_id, now, saved_at=running.last_checkpoint_at
                )
                effects.requeue_at_once(state, stopped, now)
                progress = progress_to_json(stopped.progress, now)
            self.launched.discard(outcome.job_id)
            self.records[outcome.job_id] = self.store.transition(
                outcome.job_id,
                JobState.PENDING,
                ACTOR,
                reason=f"launch failed: {outcome.error}",
                progress=progress,
            )
        elif outcome.kind == "stop":
            self.stopping.discard(outcome.job_id)
            self.launched.discard(outcome.job_id)
            self.records.pop(outcome.job_id, None)
            why = outcome.context.get("why")
            if why == "hang":  # a failed attempt: interrupted in the state, restarted or failed
                reason = str(outcome.context.get("reason") or "hung")
                self._restart_or_fail(record, f"hung: {reason}", None, now)
                return
            if outcome.job_id in state.running:
                effects.complete(state, outcome.job_id, now)
            if why == "cancel":
                self.store.transition(outcome.job_id, JobState.CANCELLED, ACTOR, reason="cancelled")
            else:  # preempted: back in the store's queue; the next tick takes it in again
                self._requeue_preempted(outcome.job_id, now)
