"""The control loop: store + scheduler + runtime, one tick at a time.

Each tick: sync nodes and tenants, take in new and cancelled jobs, collect finished gang calls,
poll running gangs, run one scheduling cycle and apply its plan, publish the queue. The store is
the source of truth: every decision is written there (one transaction each) before the runtime is
asked to act, so a restarted loop can rebuild its state and reconcile with what Ray runs.

Every per-job step runs under :meth:`ControlLoop._guard` (:mod:`aicluster.control.faults`): a
job whose handling raises is recorded and, after a few faults, failed; the tick goes on for every
other job. A watchdog thread (:mod:`aicluster.control.watchdog`) reports a tick over its budget.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from aicluster.configuration import (
    Configuration,
    loop_options,
    parse_configuration,
    scheduler_config,
)
from aicluster.control.faults import JobFaults
from aicluster.control.health import GangMonitor, HealthConfig
from aicluster.control.launcher import Launcher
from aicluster.control.lifecycle import ACTOR, GangLifecycle
from aicluster.control.metrics import observe_cycle
from aicluster.control.progress import progress_from_json
from aicluster.control.queueview import QueueEntry, queue_entries
from aicluster.control.watchdog import TickWatchdog
from aicluster.core import (
    Clock,
    ConfigError,
    IllegalTransition,
    JobState,
    Placement,
    Plan,
    make_cluster,
)
from aicluster.runtime import ClusterView, GangPhase, Runtime, TelemetryCursor
from aicluster.scheduler import SchedulerConfig, SchedulerState, effects, find_placement, schedule
from aicluster.scheduler.effects import Interruption
from aicluster.scheduler.policies import make_state
from aicluster.store import (
    JobRecord,
    LeaseLost,
    NodeHealth,
    NodeRecord,
    NotFound,
    StaleState,
    Store,
    placement_from_json,
)

__all__ = ["ControlLoop", "LoopStats"]

log = logging.getLogger(__name__)
#: Seconds between full re-reads of the queue (ticks in between read only what changed).
FULL_TAKE_IN_S = 15.0
#: Events re-read below the mark on PostgreSQL, whose ids may commit out of order.
EVENT_MARGIN = 256


@dataclass(slots=True)
class LoopStats:
    ticks: int = 0
    cycles: int = 0
    last_cycle_seconds: float = 0.0
    launched: int = 0
    finished: int = 0


class ControlLoop(GangLifecycle):
    """Owns the SchedulerState of a live cluster. Not thread-safe: one thread calls :meth:`tick`
    (see :meth:`start`); others read :attr:`queue` and :attr:`usage` snapshots."""

    def __init__(
        self,
        store: Store,
        runtime: Runtime | None,
        discover: Callable[[], ClusterView] | None,
        clock: Clock,
        config: SchedulerConfig | None = None,
        *,
        interval_s: float = 1.0,
        stop_grace_s: float = 10.0,
        health: HealthConfig | None = None,
        backoff_s: tuple[float, float] = (2.0, 60.0),
        cordon_stragglers: bool = False,
        grow_after_s: float = 30.0,
        lease: Callable[[], bool] | None = None,
        tick_budget_s: float = 10.0,
        follow_config: bool = False,
    ) -> None:
        self.store, self.runtime, self.discover, self.clock = store, runtime, discover, clock
        # Asked before every tick: a leader whose lease is gone must stop acting at once.
        self.lease = lease
        self.config = config or SchedulerConfig()
        # The server's loop runs the configuration applied in the store (`config apply`,
        # `up --config`), taken up at the tick after it changes; tests give settings directly.
        self.follow_config = follow_config
        self.config_id: int | None = None  # the applied configuration running (0: defaults)
        self.interval_s, self.stop_grace_s = interval_s, stop_grace_s
        self.health = health or HealthConfig()
        self.backoff_s, self.cordon_stragglers = backoff_s, cordon_stragglers
        self.grow_after_s = grow_after_s
        self.monitors: dict[str, tuple[GangMonitor, TelemetryCursor | None]] = {}
        self.interrupted: dict[str, tuple[Interruption, int]] = {}  # see GangLifecycle
        self.backoff: dict[str, float] = {}  # RESTARTING jobs: when they may queue again
        self.crash_streak: dict[str, int] = {}  # attempts in a row that failed before a step
        self.launcher = Launcher(guard=self._check_lease)  # no Ray call once deposed
        self.faults = JobFaults(store, ACTOR, time.monotonic)
        self.watchdog = TickWatchdog(tick_budget_s)
        self.state: SchedulerState | None = None
        self.records: dict[str, JobRecord] = {}  # jobs the state knows (pending or holding GPUs)
        self.launched: set[str] = set()  # jobs whose gang runs (or is being launched)
        self.stopping: set[str] = set()
        self.queue: list[QueueEntry] = []
        self.stats = LoopStats()
        self._node_key: tuple[tuple[str, int, str, str, str], ...] = ()
        self._node_records: list[NodeRecord] = []
        self._event_mark = 0  # the newest event taken in (see _take_in_jobs)
        self._full_take_in_at = -math.inf
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    # -- thread -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="aicluster-control", daemon=True)
        self._thread.start()
        self.watchdog.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._halt.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.watchdog.stop()
        self.launcher.shutdown()

    def _run(self) -> None:
        while not self._halt.is_set():
            self.watchdog.begin()
            try:
                self.tick()
            except LeaseLost as error:  # fenced: the next tick finds the lease gone
                log.warning("control loop: a write was refused, no longer leading (%s)", error)
            except Exception:  # a bad tick must not kill the loop; the next one retries
                log.exception("control loop tick failed")
            finally:
                self.watchdog.end()
            self._wake.wait(self.interval_s)
            self._wake.clear()

    # -- one tick ---------------------------------------------------------------------------

    def tick(self) -> Plan | None:
        """One cycle; None (and nothing done) when this process no longer holds the lease."""
        if self.lease is not None and not self.lease():
            log.warning("the leader lease is gone: this tick does nothing")
            return None
        now = self.clock.now()
        self.stats.ticks += 1
        if self.follow_config:
            self._follow_configuration()
        if self._sync_nodes() or self.state is None:
            self._rebuild(now)
        state = self.state
        assert state is not None
        state.tenants = {tenant.name: tenant for tenant in self.store.list_tenants()}
        for outcome in self.launcher.collect():
            with self._guard(outcome.job_id, "settling a Ray call"):
                self._on_outcome(outcome, now)
        self._end_backoffs(now)
        self._take_in_jobs(now)
        self._poll_gangs(now)
        self._drain(now)
        self._grow_elastic(now)
        state.refresh(now)
        started = time.perf_counter()
        plan = schedule(state.snapshot(now))
        self.stats.last_cycle_seconds = time.perf_counter() - started
        self.stats.cycles += 1
        observe_cycle(self.stats.last_cycle_seconds)
        self._apply(plan, now)
        self._publish(plan, now)
        return plan

    # -- configuration ----------------------------------------------------------------------

    def configure(self, configuration: Configuration) -> None:
        """Run with ``configuration`` from the next tick on: the scheduler's settings and the
        loop's own (grace period, health, backoff). The state is rebuilt from the store, as
        after a restart, so no job is dropped; gangs running keep their health monitors."""
        self.config = scheduler_config(configuration)
        for name, value in loop_options(configuration).items():  # the constructor's keywords
            setattr(self, name, value)
        self.state = None

    def _follow_configuration(self) -> None:
        """Take up the configuration applied in the store, when it changed (one small read)."""
        newest = self.store.current_config_id()
        if newest == self.config_id:
            return
        record = self.store.current_config()
        configuration = Configuration()
        if record is not None:
            try:
                configuration = parse_configuration(record.text, record.source)[0]
            except ConfigError as error:  # validated when applied: a newer release may differ
                log.error("cannot run configuration %d (%s): keeping the last", record.id, error)
                self.config_id = newest
                return
        self.configure(configuration)
        self.config_id = newest
        log.info("running configuration %d (policy %s)", newest, self.config.queue)

    # -- nodes ------------------------------------------------------------------------------

    def _sync_nodes(self) -> bool:
        """Record what Ray reports; True when the set of nodes changed (the state is rebuilt)."""
        if self.discover is not None:
            view = self.discover()
            if self.runtime is not None:
                self.runtime.warm_up(view)  # each node's warm process, before its first gang
            found = view.cluster.nodes
            self.store.upsert_nodes(found, seen_at=self.clock.now())
            alive = view.health()
            for record in self.store.list_nodes():
                name = record.node.name
                if not alive.get(name, False) and record.health is NodeHealth.HEALTHY:
                    self.store.set_node_health(
                        name, NodeHealth.UNHEALTHY, ACTOR, "Ray node is down"
                    )
                elif alive.get(name) and record.health is NodeHealth.UNHEALTHY:
                    self.store.set_node_health(name, NodeHealth.HEALTHY, ACTOR, None)
        records = self._node_records = self.store.list_nodes()
        key = tuple(
            sorted(
                (r.node.name, r.node.gpus, r.node.gpu_type, r.node.rack, r.node.pod)
                for r in records
            )
        )
        changed = key != self._node_key
        self._node_key = key
        if self.state is not None and not changed:
            for record in records:
                self.state.set_node_schedulable(record.node.name, record.schedulable)
        return changed

    def _rebuild(self, now: float) -> None:
        """A fresh SchedulerState from the store: at start, after a restart, when nodes change."""
        from aicluster.core import Cluster

        records = self.store.list_nodes()
        nodes = tuple(record.node for record in records)
        cluster = Cluster("live", nodes) if nodes else make_cluster(nodes=1, gpus_per_node=0)
        tenants = {tenant.name: tenant for tenant in self.store.list_tenants()}
        state = make_state(cluster, tenants, self.config)
        for record in records:
            state.set_node_schedulable(record.node.name, record.schedulable)
        self.state, self.records = state, {}
        self._full_take_in_at = -math.inf
        active = self.store.active_jobs()
        for job in active:
            with self._guard(job.id, "adopting it after a restart"):
                self._adopt(job, now)
        self._release_leftovers({job.id: job for job in active})
        self._take_in_jobs(now)

    def _release_leftovers(self, active: dict[str, JobRecord]) -> None:
        """Release the gangs Ray holds that the store does not say run: attempts that are over
        (a crash came between an attempt's end and its release), and gangs a deposed leader
        launched after its last write (of a job the store has PENDING or ended). The current
        attempt of a job holding resources is left alone, and so is a job with a Ray call of
        this loop in flight (a launch may be starting it)."""
        if self.runtime is None:
            return
        orphans: list[str] = []
        for handle in self.runtime.live_gangs():
            with self._guard(handle.job_id, "releasing a leftover gang"):
                record = active.get(handle.job_id)
                if record is None:
                    try:
                        record = self.store.get_job(None, handle.job_id)
                    except NotFound:  # a gang of this state directory that no job owns
                        orphans.append(f"{handle.job_id}/{handle.attempt}")
                        self._release(handle.job_id, handle.attempt)
                        continue
                current = record.state.holds_resources and handle.attempt == record.attempt
                if not current and not self.launcher.busy(handle.job_id):
                    self._release(handle.job_id, handle.attempt)
        if orphans:
            log.warning("released %d gang(s) that no job owns: %s", len(orphans), orphans)
            details = {"count": len(orphans), "gangs": orphans[:50]}
            self.store.record_cluster_event("cluster.orphans_released", ACTOR, details)

    # -- jobs -------------------------------------------------------------------------------

    def _take_in_jobs(self, now: float) -> None:
        """Bring the store's changes to jobs into the state: new and requeued PENDING jobs,
        cancellations. Reads only the jobs that changed since the last tick (the event log is
        the change feed), and the whole queue every ``FULL_TAKE_IN_S`` as a safety net; at
        5,000 queued jobs re-reading everything every tick took seconds."""
        if now - self._full_take_in_at >= FULL_TAKE_IN_S:
            mark = self.store.newest_event_id()  # before the reads: nothing falls in between
            self._take_in_everything(now)
            self._event_mark, self._full_take_in_at = mark, now
            return
        # PostgreSQL may commit an event after one with a higher id: re-read a margin.
        margin = EVENT_MARGIN if self.store.dialect == "postgresql" else 0
        newest, changed = self.store.jobs_changed_since(max(0, self._event_mark - margin))
        self._event_mark = max(self._event_mark, newest)
        self._take_in(changed, now)

    def _take_in_everything(self, now: float) -> None:
        state = self.state
        assert state is not None
        pending = self.store.pending_jobs()
        queued = {record.id for record in pending}
        for job_id in [j for j in state.pending if j not in queued]:
            state.cancel_pending(job_id)  # cancelled (or moved) in the store
            self.records.pop(job_id, None)
        cancels = [r for r in self.store.active_jobs() if r.cancel_requested_at is not None]
        self._take_in([*pending, *cancels], now)

    def _take_in(self, records: list[JobRecord], now: float) -> None:
        state = self.state
        assert state is not None
        for record in records:
            with self._guard(record.id, "taking it in"):
                self._take_in_one(record, now)

    def _take_in_one(self, record: JobRecord, now: float) -> None:
        state = self.state
        assert state is not None
        job_id = record.id
        if record.state is JobState.PENDING:
            if job_id in state.pending or job_id in state.running:
                return
            try:
                self._queue(record)
                self.records[job_id] = record
            except ValueError as error:
                self._fail(record, f"cannot be scheduled: {error}")
        elif job_id in state.pending:
            state.cancel_pending(job_id)  # cancelled (or moved) in the store
            self.records.pop(job_id, None)
        elif record.cancel_requested_at is not None and job_id in state.running:
            self._stop_gang(job_id, "cancel", now)

    def _queue(self, record: JobRecord) -> None:
        """Put a PENDING job (or one being adopted) in the state: with the progress its earlier
        runs left it when it has some (``scheduler.effects.requeue``), else as a new job."""
        state = self.state
        assert state is not None
        kept = progress_from_json(record.progress)
        if kept is None:
            state.submit(record.to_job(), record.submitted_at)
        else:
            progress, requeued_at = kept
            effects.requeue(state, record.to_job(), progress, requeued_at)

    def _adopt(self, record: JobRecord, now: float) -> None:
        """Take a job the store says holds GPUs back into the state: reconcile, never relaunch
        a gang Ray still runs, and finish what a crash cut short (a launch, a stop, a requeue)."""
        state = self.state
        assert state is not None and record.placement
        if record.state is JobState.PREEMPTING:
            # Its GPUs went to the preemptor when the preemption was applied (see _apply), so it
            # stays out of the state; only its stop is left to finish (stop is idempotent).
            self.records[record.id] = record
            self._stop_gang(record.id, "preempt", now)
            return
        if record.state is JobState.RESTARTING:
            # Its attempt ended and the restart is counted: release the old gang, queue it again.
            self._release(record.id, record.attempt)
            self.backoff[record.id] = now
            return
        placement = placement_from_json(record.placement)
        try:
            self._queue(record)
            effects.admit(state, record.id, placement, record.started_at or now)
        except (ValueError, KeyError) as error:
            self._release(record.id, record.attempt)
            self._requeue(record, f"its placement no longer fits the cluster ({error})", now)
            return
        self.records[record.id] = record
        if record.state is JobState.STARTING and not self._attempt_ended(record):
            # A launch cut short: launch is idempotent per (job, attempt): what exists is
            # reused and running ranks are not started again, so finish it.
            self._launch(record, now)
        else:
            self.launched.add(record.id)  # _poll_gangs follows the gang and settles its end

    def _attempt_ended(self, record: JobRecord) -> bool:
        """Whether the job's current attempt was stopped or one of its rank processes exited
        (then there is nothing left to launch, only an end to settle)."""
        handle = self.runtime.gang(record.id, record.attempt) if self.runtime else None
        if handle is None:
            return False
        run = handle.run
        return run.stop_requested() or any(
            run.exit_record(rank) is not None for rank in range(handle.workers)
        )

    def _poll_gangs(self, now: float) -> None:
        if self.runtime is None:
            return
        state = self.state
        assert state is not None
        for job_id in list(self.launched):
            if job_id not in state.running or self.launcher.busy(job_id) or job_id in self.stopping:
                continue
            if self.records[job_id].is_service:  # no gang: the serving leader runs its replica
                continue
            with self._guard(job_id, "following its gang"):
                self._poll_gang(self.records[job_id], now)

    def _poll_gang(self, record: JobRecord, now: float) -> None:
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
        if status.phase is GangPhase.RUNNING:
            self._watch(record, handle, now)
        elif status.phase.terminal:
            self._finish(record, status, now)

    def _grow_elastic(self, now: float) -> None:
        """Restart elastic jobs running short of workers at full size once it fits (checkpoint,
        requeue, place): at most once per ``grow_after_s`` of a run."""
        state = self.state
        assert state is not None
        for job_id, running in list(state.running.items()):
            short = running.job.workers < running.requested.workers
            if not short or job_id in self.stopping or job_id not in self.launched:
                continue
            if now - running.started_at < self.grow_after_s:
                continue
            with state.index.tentative():
                state.index.release(running.placement.slots)
                fits = isinstance(find_placement(state.index, running.requested), Placement)
            if fits:
                with self._guard(job_id, "growing it back"):
                    why = f"elastic: growing back to {running.requested.workers} workers"
                    self._preempt(job_id, now, why)

    def _drain(self, now: float) -> None:
        """Move jobs off draining nodes: preempt them (they checkpoint in the grace period)
        and let the scheduler place them elsewhere."""
        state = self.state
        assert state is not None
        for record in self._node_records:  # as read by this tick's _sync_nodes
            if record.health is not NodeHealth.DRAINING:
                continue
            for job_id in state.jobs_on(record.node.name):
                if job_id in self.launched and job_id not in self.stopping:
                    with self._guard(job_id, "moving it off a draining node"):
                        self._preempt(job_id, now, f"node {record.node.name} is draining")

    def _requeue(self, record: JobRecord, why: str, now: float) -> None:
        with contextlib.suppress(StaleState):
            self.store.transition(record.id, JobState.PENDING, ACTOR, reason=why)

    def _fail(self, record: JobRecord, why: str) -> None:
        self.store.transition(record.id, JobState.FAILED, ACTOR, reason=why)

    # -- faults -----------------------------------------------------------------------------

    def _guard(self, job_id: str, step: str) -> AbstractContextManager[None]:
        """Run one per-job step: a fault in it is the job's, never the tick's."""
        return self.faults.guard(job_id, step, self._give_up)

    def _give_up(self, job_id: str, reason: str) -> None:
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
        self.monitors.pop(job_id, None)
        self.interrupted.pop(job_id, None)
        self.backoff.pop(job_id, None)
        self.faults.forget(job_id)
        if record.attempt:
            self._release(job_id, record.attempt)
        if not record.state.terminal:
            with contextlib.suppress(StaleState, IllegalTransition):
                self.store.transition(job_id, JobState.FAILED, ACTOR, reason=reason)

    # -- applying a plan --------------------------------------------------------------------

    def _apply(self, plan: Plan, now: float) -> None:
        state = self.state
        assert state is not None
        for preempt in plan.preemptions:
            # The plan's admissions count on the victims' GPUs: release them in the state now;
            # Ray frees them when the gang has stopped, and the new gang's launch waits for it.
            with self._guard(preempt.job_id, "preempting it"):
                self._preempt(preempt.job_id, now, preempt.reason)
        for admit in plan.admissions:
            effects.admit(state, admit.job_id, admit.placement, now)
        starts = [(a.job_id, a.placement, a.reason) for a in plan.admissions]
        for job_id, started in self.store.start_jobs(starts, ACTOR).items():
            if started is None:  # it left PENDING meanwhile (cancelled): give its GPUs back
                effects.complete(state, job_id, now)
                self.records.pop(job_id, None)
                continue
            self.records[job_id] = started
            with self._guard(job_id, "launching it"):
                self._launch(started, now)
        changed = {
            job_id: reason
            for job_id, reason in plan.pending.items()
            if job_id in self.records and self.records[job_id].pending_reason != reason.message
        }
        if changed:
            self.store.set_pending_reasons(changed)
            for job_id, reason in changed.items():
                self.records[job_id] = _with_reason(self.records[job_id], reason)

    # -- views for the API ------------------------------------------------------------------

    def _publish(self, plan: Plan, now: float) -> None:
        state = self.state
        assert state is not None
        names = {job_id: record.name for job_id, record in self.records.items()}
        self.queue = queue_entries(state, plan, names, now)

    def usage_by_tenant(self) -> dict[str, dict[str, int]]:
        state = self.state
        if state is None:
            return {}
        return {
            t: {g: n for g, n in u.items() if n} for t, u in state.usage.items() if any(u.values())
        }

    def gpus_used_by_node(self) -> dict[str, int]:
        state = self.state
        if state is None:
            return {}
        index = state.index
        return {node.name: node.gpus - index.free[i] for i, node in enumerate(index.nodes)}


def _with_reason(record: JobRecord, reason: Any) -> JobRecord:
    from dataclasses import replace

    return replace(record, pending_code=reason.code.value, pending_reason=reason.message)
