"""Taking the store's jobs into the control loop's scheduler state: each tick the jobs that
changed (new and requeued PENDING jobs, cancellations), and after a restart every active job,
reconciled with what Ray runs. Part of :class:`aicluster.control.loop.loop.ControlLoop`."""

from __future__ import annotations

import contextlib
import logging
import math

from aicluster.control.loop.lifecycle import GangLifecycle
from aicluster.control.loop.locality import with_input_shards
from aicluster.control.loop.predictions import LivePredictions
from aicluster.control.loop.progress import progress_from_json
from aicluster.control.settings import ACTOR
from aicluster.core import JobState
from aicluster.scheduler import SchedulerState, effects
from aicluster.store import JobRecord, NotFound, StaleState, Store, placement_from_json

__all__ = ["EVENT_MARGIN", "FULL_TAKE_IN_S", "JobIntake"]

log = logging.getLogger(__name__)
#: Seconds between full re-reads of the queue (ticks in between read only what changed).
FULL_TAKE_IN_S = 15.0
#: Events re-read below the mark on PostgreSQL, whose ids may commit out of order.
EVENT_MARGIN = 256


class JobIntake:
    """Reads the store's jobs into ``gangs``' state and records; stops the gangs of jobs
    cancelled while running."""

    def __init__(self, store: Store, gangs: GangLifecycle) -> None:
        self.store, self.gangs = store, gangs
        self.event_mark = 0  # the newest event taken in (see take_in)
        #: Predicted run times for jobs without an estimate (None: predictions are off).
        self.predictions: LivePredictions | None = None
        self.full_at = -math.inf  # when the whole queue was last read

    @property
    def state(self) -> SchedulerState:
        state = self.gangs.state
        assert state is not None
        return state

    def take_in(self, now: float) -> None:
        """Bring the store's changes to jobs into the state: new and requeued PENDING jobs,
        cancellations. Reads only the jobs that changed since the last tick (the event log is
        the change feed), and the whole queue every ``FULL_TAKE_IN_S`` as a safety net; at
        5,000 queued jobs re-reading everything every tick took seconds."""
        if now - self.full_at >= FULL_TAKE_IN_S:
            mark = self.store.newest_event_id()  # before the reads: nothing falls in between
            self._take_in_everything(now)
            self.event_mark, self.full_at = mark, now
            return
        # PostgreSQL may commit an event after one with a higher id: re-read a margin.
        margin = EVENT_MARGIN if self.store.dialect == "postgresql" else 0
        newest, changed = self.store.jobs_changed_since(max(0, self.event_mark - margin))
        self.event_mark = max(self.event_mark, newest)
        self._take_in(changed, now)

    def adopt(self, now: float) -> None:
        """A fresh state (at start, after a restart, when nodes change): take in every job the
        store has active, release the gangs Ray holds for no job, then the queue."""
        self.full_at = -math.inf
        active = self.store.active_jobs()
        for job in active:
            with self.gangs.guard(job.id, "adopting it after a restart"):
                self._adopt(job, now)
        self._release_leftovers({job.id: job for job in active})
        self.take_in(now)

    def _take_in_everything(self, now: float) -> None:
        state, records = self.state, self.gangs.records
        pending = self.store.pending_jobs()
        queued = {record.id for record in pending}
        for job_id in [j for j in state.pending if j not in queued]:
            state.cancel_pending(job_id)  # cancelled (or moved) in the store
            records.pop(job_id, None)
        cancels = [r for r in self.store.active_jobs() if r.cancel_requested_at is not None]
        self._take_in([*pending, *cancels], now)

    def _take_in(self, records: list[JobRecord], now: float) -> None:
        state = self.state  # read once: a property
        for record in records:
            with self.gangs.guard(record.id, "taking it in"):
                self._take_in_one(state, record, now)

    def _take_in_one(self, state: SchedulerState, record: JobRecord, now: float) -> None:
        job_id = record.id
        if record.state is JobState.PENDING:
            if job_id in state.pending or job_id in state.running:
                return
            try:
                self._queue(record, now)
                self.gangs.records[job_id] = record
            except ValueError as error:
                reason = f"cannot be scheduled: {error}"
                self.store.transition(record.id, JobState.FAILED, ACTOR, reason=reason)
        elif job_id in state.pending:
            state.cancel_pending(job_id)  # cancelled (or moved) in the store
            self.gangs.records.pop(job_id, None)
        elif record.cancel_requested_at is not None and job_id in state.running:
            self.gangs.stop(job_id, "cancel", now)

    def _queue(self, record: JobRecord, now: float) -> None:
        """Put a PENDING job (or one being adopted) in the state: with the progress its earlier
        runs left it when it has some (``scheduler.effects.requeue``), else as a new job."""
        predictions = self.predictions
        job = record.to_job() if predictions is None else predictions.job(record, now)
        kept = progress_from_json(record.progress)
        if self.state.index.locality:  # its input shards, for the data-locality term
            job = with_input_shards(self.store, record, job)
        if kept is None:
            self.state.submit(job, record.submitted_at)
        else:
            progress, requeued_at = kept
            effects.requeue(self.state, job, progress, requeued_at)

    def _adopt(self, record: JobRecord, now: float) -> None:
        """Take a job the store says holds GPUs back into the state: reconcile, never relaunch
        a gang Ray still runs, and finish what a crash cut short (a launch, a stop, a requeue)."""
        assert record.placement
        if self.gangs.take_over(record, now):  # PREEMPTING or RESTARTING: out of the state
            return
        placement = placement_from_json(record.placement)
        try:
            self._queue(record, now)
            effects.admit(self.state, record.id, placement, record.started_at or now)
        except (ValueError, KeyError) as error:
            self.gangs.release(record.id, record.attempt)
            why = f"its placement no longer fits the cluster ({error})"
            with contextlib.suppress(StaleState):
                self.store.transition(record.id, JobState.PENDING, ACTOR, reason=why)
            return
        self.gangs.resume(record, now)

    def _release_leftovers(self, active: dict[str, JobRecord]) -> None:
        """Release the gangs Ray holds that the store does not say run: attempts that are over
        (a crash came between an attempt's end and its release), and gangs a deposed leader
        launched after its last write (of a job the store has PENDING or ended). The current
        attempt of a job holding resources is left alone, and so is a job with a Ray call of
        this loop in flight (a launch may be starting it)."""
        gangs = self.gangs
        if gangs.runtime is None:
            return
        orphans: list[str] = []
        for handle in gangs.runtime.live_gangs():
            with gangs.guard(handle.job_id, "releasing a leftover gang"):
                record = active.get(handle.job_id)
                if record is None:
                    try:
                        record = self.store.get_job(None, handle.job_id)
                    except NotFound:  # a gang of this state directory that no job owns
                        orphans.append(f"{handle.job_id}/{handle.attempt}")
                        gangs.release(handle.job_id, handle.attempt)
                        continue
                current = record.state.holds_resources and handle.attempt == record.attempt
                if not current and not gangs.launcher.busy(handle.job_id):
                    gangs.release(handle.job_id, handle.attempt)
        if orphans:
            log.warning("released %d gang(s) that no job owns: %s", len(orphans), orphans)
            details = {"count": len(orphans), "gangs": orphans[:50]}
            self.store.record_cluster_event("cluster.orphans_released", ACTOR, details)
