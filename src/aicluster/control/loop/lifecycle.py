"""The lifecycle of a job's gangs: launch, follow, stop, and settle how each attempt ended.

:class:`GangLifecycle` is the control loop's (:mod:`aicluster.control.loop.loop`) one object for
everything a gang goes through; the loop hands it its collaborators and calls a few methods each
tick. Every Ray call goes through the :class:`~aicluster.control.loop.launcher.Launcher` (whose
guard refuses it once this server no longer leads), so a tick never blocks on Ray.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from aicluster.control.learning.registry import register_on_success
from aicluster.control.loop.attempts import (
    attempt_ended,
    failed_attempt,
    gang_spec,
    record_data,
    record_run,
    start_service,
    stopper,
)
from aicluster.control.loop.faults import JobFaults
from aicluster.control.loop.gangwatch import GangWatch
from aicluster.control.loop.launcher import Launcher, Outcome
from aicluster.control.loop.launchtimes import LaunchTimes
from aicluster.control.loop.ports import GangRuntime
from aicluster.control.loop.progress import progress_to_json
from aicluster.control.settings import ACTOR, LoopSettings
from aicluster.control.views.goodput import job_goodput
from aicluster.core import Clock, IllegalTransition, JobState
from aicluster.core.failure import Failure
from aicluster.core.preemption_cost import UNKNOWN
from aicluster.runtime import GangPhase, GangStatus
from aicluster.runtime.gang.datacache import CORRUPT_DATA
from aicluster.scheduler import SchedulerState, effects
from aicluster.scheduler.effects import Interruption
from aicluster.scheduler.restarts import FailedAttempt, backoff_s, refusal
from aicluster.store import JobRecord, StaleState, Store

__all__ = ["ACTOR", "GangLifecycle"]

log = logging.getLogger(__name__)


class GangLifecycle:
    """The gangs of the jobs the scheduler state holds: launching them, following them,
    stopping them (a preemption gives the gang its grace period to checkpoint), and settling
    each attempt's end (success, a restart after a backoff, failure for good).

    It holds the scheduler state it acts on (the loop hands it a new one with :meth:`reset`)
    and the records of the jobs that state knows, which the loop reads and updates too. Not
    thread-safe: the loop's thread calls it."""

    def __init__(
        self,
        store: Store,
        runtime: GangRuntime | None,
        launcher: Launcher,
        clock: Clock,
        settings: LoopSettings,
        wake: Callable[[], None],
    ) -> None:
        self.store, self.runtime, self.launcher, self.clock = store, runtime, launcher, clock
        self.settings = settings  # the loop replaces it when its configuration changes
        self.wake = wake  # runs the loop's next tick at once
        self.state: SchedulerState | None = None
        self.records: dict[str, JobRecord] = {}  # jobs the state knows (pending or holding GPUs)
        self.launched: set[str] = set()  # jobs whose gang runs (or is being launched)
        self.stopping: set[str] = set()
        # Jobs stopped to be requeued (preempted, drained, grown), out of the state until their
        # gang has stopped: the interruption and how many checkpoints the job had reported then.
        self.interrupted: dict[str, tuple[Interruption, int]] = {}
        self.backoff: dict[str, float] = {}  # RESTARTING jobs: when they may queue again
        self.crash_streak: dict[str, int] = {}  # attempts in a row that failed before a step
        # How each restarted job's last attempt failed (restart_on: a repeat of its own error
        # ends it). Kept in memory, as crash_streak: a new leader forgets it (one more attempt).
        self.last_failure: dict[str, FailedAttempt] = {}
        self.faults = JobFaults(store, ACTOR, time.monotonic)
        self.watch = GangWatch(store, self.faults, self._checkpointed)
        self.launches = self.ends = 0  # gangs launched, attempts settled
        self.launch_times = LaunchTimes()  # admission to running, for estimated starts

    def reset(self, state: SchedulerState | None) -> None:
        """Act on ``state`` from now on (rebuilt from the store): the records start afresh.
        Gangs followed keep their monitors and calls in flight."""
        self.state, self.records = state, {}

    # -- per-job fault isolation --------------------------------------------------------------

    def guard(self, job_id: str, step: str) -> AbstractContextManager[None]:
        """Run one per-job step: a fault in it is the job's, never the tick's."""
        return self.faults.guard(job_id, step, self.give_up)

    def give_up(self, job_id: str, reason: str) -> None:
        """Fail a job the loop cannot handle: out of the state, its gang released."""
        now = self.clock.now()
        record = self.records.pop(job_id, None) or self.store.get_job(None, job_id)
        state = self.state
        if state is not None and job_id in state.running:
            effects.complete(state, job_id, now)
        elif state is not None and job_id in state.pending:
            state.cancel_pending(job_id)
        for followed in (self.launched, self.stopping):
            followed.discard(job_id)
        self.watch.forget(job_id)
        self.interrupted.pop(job_id, None)
        self.backoff.pop(job_id, None)
        self.last_failure.pop(job_id, None)
        self.faults.forget(job_id)
        if record.attempt:
            self.release(job_id, record.attempt)
        if not record.state.terminal:
            with contextlib.suppress(StaleState, IllegalTransition):
                self.store.transition(job_id, JobState.FAILED, ACTOR, reason=reason)

    # -- launching --------------------------------------------------------------------------

    def launch(self, record: JobRecord, now: float) -> None:
        """Launch the gang of a job just admitted (STARTING), in the background."""
        if record.is_service and record.placement is not None:  # no gang: see start_service
            self.launched.add(record.id)
            self.launches += 1
            self.records[record.id] = start_service(self.store, record)
            return
        if self.runtime is None or record.placement is None:
            return
        runtime = self.runtime
        running = self.state.running.get(record.id) if self.state is not None else None
        job = running.job if running is not None else record.to_job()  # elastic: its size now
        gang = gang_spec(record, job, self.store, runtime)
        self.launched.add(record.id)
        self.launches += 1
        self.launcher.submit(record.id, "launch", record.attempt, lambda: runtime.launch(gang))

    # -- adopting after a restart -----------------------------------------------------------

    def take_over(self, record: JobRecord, now: float) -> bool:
        """Finish what a crash cut short for a job out of the state: the stop of a PREEMPTING
        job (its GPUs went to the preemptor when the preemption was applied; stop is
        idempotent), the restart of a RESTARTING one (its attempt ended and the restart is
        counted: release the old gang, queue it again). False for a job in another state."""
        if record.state is JobState.PREEMPTING:
            self.records[record.id] = record
            self.stop(record.id, "preempt", now)
            return True
        if record.state is JobState.RESTARTING:
            self.release(record.id, record.attempt)
            self.backoff[record.id] = now
            return True
        return False

    def resume(self, record: JobRecord, now: float) -> None:
        """Follow the gang of a job admitted again after a restart; never relaunch a gang Ray
        still runs. A launch cut short is finished: launch is idempotent per (job, attempt):
        what exists is reused and running ranks are not started again."""
        self.records[record.id] = record
        if record.state is JobState.STARTING and not attempt_ended(self.runtime, record):
            self.launch(record, now)
        else:
            self.launched.add(record.id)  # follow() settles its end

    # -- following --------------------------------------------------------------------------

    def follow(self, now: float) -> None:
        """Poll the gangs running with no call in flight: mark them RUNNING, read their
        telemetry (stragglers, hangs, checkpoints), settle those that ended."""
        if self.runtime is None:
            return
        state = self.state
        assert state is not None
        for job_id in list(self.launched):
            if job_id not in state.running or self.launcher.busy(job_id) or job_id in self.stopping:
                continue
            if self.records[job_id].is_service:  # no gang: the serving leader runs its replica
                continue
            with self.guard(job_id, "following its gang"):
                self._poll(self.records[job_id], now)

    def _poll(self, record: JobRecord, now: float) -> None:
        assert self.runtime is not None
        job_id = record.id
        handle = self.runtime.gang(job_id, record.attempt)
        if handle is None:
            self._finish(record, None, now)
            return
        status = handle.status()
        ran = status.phase in (GangPhase.RUNNING, GangPhase.SUCCEEDED)
        if ran and record.state is JobState.STARTING:
            # A gang that succeeded between two ticks (warm starts make short jobs that
            # fast) still ran: its timeline and started_at say so.
            record = self.records[job_id] = self.store.transition(
                job_id, JobState.RUNNING, ACTOR, expected_from=JobState.STARTING
            )
            if status.phase is GangPhase.RUNNING:  # (not ended yet) the launch's time
                self._observe_launch(job_id, now)
        if status.phase is GangPhase.RUNNING:
            hung = self.watch.observe(record, handle, now, self.settings)
            if hung is not None:
                self.store.record_event(record.id, "job.hung", ACTOR, {"reason": hung})
                self.stop(record.id, "hang", now, reason=hung)
        elif status.phase.terminal:
            self._finish(record, status, now)

    def _observe_launch(self, job_id: str, now: float) -> None:
        """Admission to running, for estimated starts. Advisory: a job the state no longer
        holds (a rebuild in between) is skipped, never a fault of the job."""
        running = self.state.running.get(job_id) if self.state is not None else None
        if running is not None:
            self.launch_times.observe(now - running.started_at)

    def _checkpointed(self, job_id: str, at: float) -> None:
        if self.state is not None:
            effects.checkpointed(self.state, job_id, at)

    # -- stopping ---------------------------------------------------------------------------

    def preempt(self, job_id: str, now: float, reason: str | None, kind: str = UNKNOWN) -> None:
        """Stop a running job to run it again later (preempted, drained, grown back): its GPUs
        return to the state at once (the plan's admissions count on them) and its progress is
        kept (``scheduler.effects``); it is queued again once its gang has stopped, which gives
        it the grace period to checkpoint. ``kind`` (the plan's right, or ``drain``,
        ``elastic``) goes on its move to PREEMPTING, for the cost of preemption."""
        state = self.state
        assert state is not None
        seen = self.watch.checkpoints(job_id, now)
        # Live, a job has saved what it reported saving (the declared interval is a promise).
        saved_at = state.running[job_id].last_checkpoint_at
        stopped = effects.interrupt(state, job_id, now, saved_at=saved_at, preempted=True)
        self.interrupted[job_id] = (stopped, seen)
        self.stop(job_id, "preempt", now, reason=reason, kind=kind)

    def stop(
        self, job_id: str, why: str, now: float, reason: str | None = None, kind: str = UNKNOWN
    ) -> None:
        """Stop the job's gang in the background, ``why`` being "preempt" (PREEMPTING first),
        "cancel" or "hang" (no grace period: a hung gang will not checkpoint). Once."""
        if job_id in self.stopping:
            return
        record = self.records[job_id]
        self.stopping.add(job_id)
        if why == "preempt" and record.state is not JobState.PREEMPTING:  # not yet (or adopted)
            self.records[job_id] = self.store.transition(
                job_id, JobState.PREEMPTING, ACTOR, reason=reason, details={"kind": kind}
            )
        grace = 2.0 if why == "hang" else self.settings.stop_grace_s
        call = stopper(self.runtime, job_id, record.attempt, grace)
        self.launcher.submit(job_id, "stop", record.attempt, call, why=why, reason=reason)

    def release(self, job_id: str, attempt: int) -> None:
        """Stop an ended or abandoned attempt's gang and free its Ray resources, in the
        background. Idempotent. Keyed apart from the job's own calls: the next attempt's launch
        never waits for it (Ray reserves the new gang once the old one is gone)."""
        call = stopper(self.runtime, job_id, attempt, 0)
        self.launcher.submit(f"{job_id}/{attempt}/release", "release", attempt, call)

    # -- settling ---------------------------------------------------------------------------

    def settle(self, now: float) -> None:
        """Settle the Ray calls that finished since the last tick: a failed launch back to the
        queue, a stopped gang cancelled, requeued or restarted."""
        for outcome in self.launcher.collect():
            with self.guard(outcome.job_id, "settling a Ray call"):
                self._on_outcome(outcome, now)

    def end_backoffs(self, now: float) -> None:
        """Queue again the RESTARTING jobs whose backoff is over."""
        for job_id, when in list(self.backoff.items()):
            if when <= now:
                del self.backoff[job_id]
                with self.guard(job_id, "ending its backoff"), contextlib.suppress(StaleState):
                    self.store.transition(
                        job_id,
                        JobState.PENDING,
                        ACTOR,
                        expected_from=JobState.RESTARTING,
                        reason="restart: back in the queue",
                    )

    def _on_outcome(self, outcome: Outcome, now: float) -> None:
        record = self.records.get(outcome.job_id)
        if record is None or record.attempt != outcome.attempt:
            return
        if outcome.kind == "launch" and outcome.error is not None:
            self._launch_failed(outcome.job_id, outcome.error, now)
        elif outcome.kind == "stop":
            self.stopping.discard(outcome.job_id)
            self.launched.discard(outcome.job_id)
            self.records.pop(outcome.job_id, None)
            record_run(self.store, self.runtime, record)  # its ranks have exited
            why = outcome.context.get("why")
            if why == "hang":  # a failed attempt: interrupted in the state, restarted or failed
                reason = str(outcome.context.get("reason") or "hung")
                self._restart_or_fail(record, f"hung: {reason}", FailedAttempt(True), now)
                return
            state = self.state
            assert state is not None
            if outcome.job_id in state.running:
                effects.complete(state, outcome.job_id, now)
            if why == "cancel":
                self.store.transition(outcome.job_id, JobState.CANCELLED, ACTOR, reason="cancelled")
            else:  # preempted: back in the store's queue; the next tick takes it in again
                self._requeue_preempted(outcome.job_id, now)

    def _launch_failed(self, job_id: str, error: BaseException, now: float) -> None:
        """Back in the queue at once, nothing trained."""
        log.warning("launch of %s failed: %s", job_id, error)
        state = self.state
        assert state is not None
        progress = None
        if job_id in state.running:
            running = state.running[job_id]
            stopped = effects.interrupt(state, job_id, now, saved_at=running.last_checkpoint_at)
            effects.requeue_at_once(state, stopped, now)
            progress = progress_to_json(stopped.progress, now)
        self.launched.discard(job_id)
        self.records[job_id] = self.store.transition(
            job_id, JobState.PENDING, ACTOR, reason=f"launch failed: {error}", progress=progress
        )

    def _requeue_preempted(self, job_id: str, now: float) -> None:
        """A preempted job's gang has stopped: back to the store's queue with its progress, all
        of it if the job checkpointed in its grace period (it reported one since the SIGTERM),
        else what its last checkpoint kept; the lost work is recorded on the transition."""
        held = self.interrupted.pop(job_id, None)
        progress, details = None, None
        if held is not None:
            stopped, seen = held
            saved_in_grace = self.watch.checkpoints(job_id, now) > seen
            if saved_in_grace:
                stopped = effects.account(
                    stopped.running,
                    stopped.stopped_at,
                    saved_at=stopped.stopped_at,
                    preempted=True,
                )
            progress = progress_to_json(stopped.progress, now)
            details = {
                "lost_gpu_seconds": round(stopped.lost_gpu_seconds, 3),
                "checkpointed_in_grace": saved_in_grace,
            }
        self.watch.forget(job_id)  # the next attempt reports afresh
        self.last_failure.pop(job_id, None)  # its failures are no longer in a row
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
        self.ends += 1
        self.release(record.id, record.attempt)
        self.watch.flush(record.id)
        record_data(self.store, self.runtime, record)
        record_run(self.store, self.runtime, record)
        if status is not None and status.phase is GangPhase.SUCCEEDED:
            effects.complete(state, record.id, now)
            self.records.pop(record.id, None)
            self.watch.forget(record.id)
            self.crash_streak.pop(record.id, None)
            self.last_failure.pop(record.id, None)
            if self.runtime is not None:  # before the transition: a loop that dies in between
                # finds the gang succeeded again on restart, and registering is idempotent
                register_on_success(self.store, self.runtime.state_dir, record, ACTOR)
            self.store.transition(record.id, JobState.SUCCEEDED, ACTOR, reason="all ranks exited 0")
            if self.runtime is not None:
                result = job_goodput(self.runtime, record.id, record.attempt)
                self.store.record_event(record.id, "job.goodput", ACTOR, result.to_dict())
            return
        message = status.message if status is not None else "its gang vanished from Ray"
        ranks = status.failed_ranks if status is not None else ()
        corrupt = any(rank.reason.startswith(CORRUPT_DATA) for rank in ranks)
        failure = status.failure if status is not None else None
        self._restart_or_fail(
            record, message, failed_attempt(status), now, retry=not corrupt, failure=failure
        )

    def _restart_or_fail(
        self,
        record: JobRecord,
        message: str,
        attempt_end: FailedAttempt,
        now: float,
        retry: bool = True,
        failure: Failure | None = None,
    ) -> None:
        """A failed attempt: back to the queue after a backoff, or FAILED when the restart rule
        (:mod:`aicluster.scheduler.restarts`: max_restarts, restart_on) refuses it (at once
        without ``retry``: corrupt data stays corrupt). Either way its GPUs (and its tenant's
        quota) are released at once. ``failure`` (its first failed rank, as the user reads it)
        goes with the transition."""
        exit_code = attempt_end.exit_code
        state = self.state
        assert state is not None
        progress = None
        if record.id in state.running:
            self.watch.checkpoints(record.id, now)  # the last one it took, read up to now
            saved_at = state.running[record.id].last_checkpoint_at
            stopped = effects.interrupt(state, record.id, now, saved_at=saved_at)
            progress = progress_to_json(stopped.progress, now)
        self.records.pop(record.id, None)
        monitor = self.watch.forget(record.id)
        spec, previous = record.spec, self.last_failure.pop(record.id, None)
        refused = refusal(
            attempt_end, previous, record.restarts, spec.max_restarts, spec.restart_on
        )
        told = failure.to_json() if failure is not None else None
        if not retry or refused is not None:
            reason = f"{message} ({refused})" if retry else message
            self.crash_streak.pop(record.id, None)
            self.store.transition(
                record.id, JobState.FAILED, ACTOR, reason=reason, exit_code=exit_code, failure=told
            )
            return
        self.last_failure[record.id] = attempt_end
        # An attempt that trained restarts at once, whatever came before: the streak is 0.
        progressed = monitor is not None and monitor.last_step > 0
        streak = 0 if progressed else self.crash_streak.get(record.id, 0) + 1
        self.crash_streak[record.id] = streak
        delay = backoff_s(streak, *self.settings.backoff_s)
        self.store.transition(
            record.id,
            JobState.RESTARTING,
            ACTOR,
            reason=f"{message}; restarting in {delay:.0f}s",
            exit_code=exit_code,
            progress=progress,
            failure=told,
        )
        self.backoff[record.id] = now + delay
        if delay == 0:
            self.wake()  # requeue and place it in the next tick, not an interval later
