"""The control loop: store + scheduler + runtime, one tick at a time.

Each tick: sync nodes and tenants, take in new and cancelled jobs, collect finished gang calls,
poll running gangs, run one scheduling cycle and apply its plan, publish the queue. The store is
the source of truth: every decision is written there (one transaction each) before the runtime is
asked to act, so a restarted loop can rebuild its state and reconcile with what Ray runs.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aicluster.control.goodput import job_goodput
from aicluster.control.health import GangMonitor, HealthConfig
from aicluster.control.launcher import Launcher, Outcome
from aicluster.control.metrics import observe_cycle
from aicluster.control.queueview import QueueEntry, queue_entries
from aicluster.core import Clock, JobState, Plan, make_cluster
from aicluster.runtime import ClusterView, GangPhase, GangSpec, GangStatus, Runtime, TelemetryCursor
from aicluster.scheduler import SchedulerConfig, SchedulerState, schedule
from aicluster.store import JobRecord, NodeHealth, StaleState, Store, placement_from_json

__all__ = ["ControlLoop", "LoopStats"]

log = logging.getLogger(__name__)
ACTOR = "control-loop"


@dataclass(slots=True)
class LoopStats:
    ticks: int = 0
    cycles: int = 0
    last_cycle_seconds: float = 0.0
    launched: int = 0
    finished: int = 0


class ControlLoop:
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
    ) -> None:
        self.store, self.runtime, self.discover, self.clock = store, runtime, discover, clock
        self.config = config or SchedulerConfig(queue="fair")
        self.interval_s, self.stop_grace_s = interval_s, stop_grace_s
        self.health = health or HealthConfig()
        self.backoff_s, self.cordon_stragglers = backoff_s, cordon_stragglers
        self.monitors: dict[str, tuple[GangMonitor, TelemetryCursor | None]] = {}
        self.backoff: dict[str, float] = {}  # RESTARTING jobs: when they may queue again
        self.launcher = Launcher()
        self.state: SchedulerState | None = None
        self.records: dict[str, JobRecord] = {}  # jobs the state knows (pending or holding GPUs)
        self.launched: set[str] = set()  # jobs whose gang runs (or is being launched)
        self.stopping: set[str] = set()
        self.queue: list[QueueEntry] = []
        self.stats = LoopStats()
        self._node_key: tuple[tuple[str, int, str, str, str], ...] = ()
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    # -- thread -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="aicluster-control", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._halt.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.launcher.shutdown()

    def _run(self) -> None:
        while not self._halt.is_set():
            try:
                self.tick()
            except Exception:  # a bad tick must not kill the loop; the next one retries
                log.exception("control loop tick failed")
            self._wake.wait(self.interval_s)
            self._wake.clear()

    # -- one tick ---------------------------------------------------------------------------

    def tick(self) -> Plan | None:
        now = self.clock.now()
        self.stats.ticks += 1
        if self._sync_nodes() or self.state is None:
            self._rebuild(now)
        state = self.state
        assert state is not None
        state.tenants = {tenant.name: tenant for tenant in self.store.list_tenants()}
        for outcome in self.launcher.collect():
            self._on_outcome(outcome, now)
        self._end_backoffs(now)
        self._take_in_jobs(now)
        self._poll_gangs(now)
        self._drain(now)
        state.refresh(now)
        started = time.perf_counter()
        plan = schedule(state.snapshot(now))
        self.stats.last_cycle_seconds = time.perf_counter() - started
        self.stats.cycles += 1
        observe_cycle(self.stats.last_cycle_seconds)
        self._apply(plan, now)
        self._publish(plan, now)
        return plan

    # -- nodes ------------------------------------------------------------------------------

    def _sync_nodes(self) -> bool:
        """Record what Ray reports; True when the set of nodes changed (the state is rebuilt)."""
        if self.discover is not None:
            view = self.discover()
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
        records = self.store.list_nodes()
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
        state = SchedulerState(cluster, tenants, self.config)
        for record in records:
            state.set_node_schedulable(record.node.name, record.schedulable)
        self.state, self.records = state, {}
        for job in self.store.active_jobs():
            if job.state is JobState.RESTARTING:
                self.backoff[job.id] = now  # its gang ended before the restart: queue it again
            else:
                self._adopt(job, now)
        self._take_in_jobs(now)

    # -- jobs -------------------------------------------------------------------------------

    def _take_in_jobs(self, now: float) -> None:
        state = self.state
        assert state is not None
        pending = {job.id: job for job in self.store.pending_jobs()}
        for job_id in [j for j in state.pending if j not in pending]:
            state.cancel_pending(job_id)  # cancelled (or moved) in the store
            self.records.pop(job_id, None)
        for job_id, record in pending.items():
            if job_id not in state.pending and job_id not in state.running:
                try:
                    state.submit(record.to_job(), record.submitted_at)
                    self.records[job_id] = record
                except ValueError as error:
                    self._fail(record, f"cannot be scheduled: {error}")
        for record in self.store.active_jobs():
            if record.cancel_requested_at is not None and record.id in state.running:
                self._stop_gang(record.id, "cancel", now)

    def _adopt(self, record: JobRecord, now: float) -> None:
        """Take a job the store says holds GPUs back into the state: reconcile, never relaunch
        a gang Ray still runs."""
        state = self.state
        assert state is not None and record.placement
        placement = placement_from_json(record.placement)
        try:
            state.submit(record.to_job(), record.submitted_at)
            state.start(record.id, placement, record.started_at or now)
        except (ValueError, KeyError) as error:
            self._requeue(record, f"its placement no longer fits the cluster ({error})", now)
            return
        self.records[record.id] = record
        handle = self.runtime.gang(record.id, record.attempt) if self.runtime else None
        phase = handle.status().phase if handle is not None else None
        if record.state is JobState.STARTING and phase in (None, GangPhase.PENDING):
            self._launch(record, now)  # launch is idempotent per (job, attempt): finish it
        elif phase in (GangPhase.RUNNING, GangPhase.PENDING):
            self.launched.add(record.id)
        else:
            self.launched.add(record.id)  # _poll_gangs settles a finished or vanished gang

    def _poll_gangs(self, now: float) -> None:
        if self.runtime is None:
            return
        state = self.state
        assert state is not None
        for job_id in list(self.launched):
            if job_id not in state.running or self.launcher.busy(job_id) or job_id in self.stopping:
                continue
            record = self.records[job_id]
            handle = self.runtime.gang(job_id, record.attempt)
            if handle is None:
                self._finish(record, None, now)
                continue
            status = handle.status()
            if status.phase is GangPhase.RUNNING and record.state is JobState.STARTING:
                self.records[job_id] = self.store.transition(
                    job_id, JobState.RUNNING, ACTOR, expected_from=JobState.STARTING
                )
            if status.phase is GangPhase.RUNNING:
                self._watch(record, handle, now)
            elif status.phase.terminal:
                self._finish(record, status, now)

    def _watch(self, record: JobRecord, handle: Any, now: float) -> None:
        """Follow the gang's telemetry: flag stragglers, restart a hung gang."""
        monitor, cursor = self.monitors.get(record.id, (None, None))
        if monitor is None:
            monitor = GangMonitor(record.spec.workers, now, self.health)
        if cursor is None:
            cursor = handle.telemetry_cursor()
        self.monitors[record.id] = (monitor, cursor)
        for straggler in monitor.observe(cursor.poll()):
            details = {"rank": straggler.rank, "node": straggler.node, "ratio": straggler.ratio}
            self.store.record_event(record.id, "job.straggler", ACTOR, details)
            if self.cordon_stragglers and straggler.node:
                self.store.set_node_health(
                    straggler.node, NodeHealth.CORDONED, ACTOR, straggler.describe()
                )
        hung = monitor.hung(now)
        if hung is not None:
            self.store.record_event(record.id, "job.hung", ACTOR, {"reason": hung})
            self._stop_gang(record.id, "hang", now, reason=hung)

    def _finish(self, record: JobRecord, status: GangStatus | None, now: float) -> None:
        """Settle a gang that ended: success, a restart, or failure for good."""
        state = self.state
        assert state is not None
        self.launched.discard(record.id)
        self.monitors.pop(record.id, None)
        self.stats.finished += 1
        self._release(record)
        if status is not None and status.phase is GangPhase.SUCCEEDED:
            state.stop(record.id, now, requeue=False)
            self.records.pop(record.id, None)
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
        if record.id in state.running:
            state.stop(record.id, now, requeue=False)
        self.records.pop(record.id, None)
        self.monitors.pop(record.id, None)
        if record.restarts < record.spec.max_restarts:
            base, cap = self.backoff_s
            delay = min(cap, base * 2**record.restarts)
            self.store.transition(
                record.id,
                JobState.RESTARTING,
                ACTOR,
                reason=f"{message}; restarting in {delay:.0f}s",
                exit_code=exit_code,
            )
            self.backoff[record.id] = now + delay
            return
        self.store.transition(
            record.id,
            JobState.FAILED,
            ACTOR,
            reason=f"{message} (after {record.restarts} restarts)",
            exit_code=exit_code,
        )

    def _drain(self, now: float) -> None:
        """Move jobs off draining nodes: preempt them (they checkpoint in the grace period)
        and let the scheduler place them elsewhere."""
        state = self.state
        assert state is not None
        for record in self.store.list_nodes():
            if record.health is not NodeHealth.DRAINING:
                continue
            for job_id in state.jobs_on(record.node.name):
                if job_id in self.launched and job_id not in self.stopping:
                    state.stop(job_id, now, requeue=False)
                    why = f"node {record.node.name} is draining"
                    self._stop_gang(job_id, "preempt", now, reason=why)

    def _record_goodput(self, record: JobRecord) -> None:
        if self.runtime is not None:
            result = job_goodput(self.runtime, record.id, record.attempt)
            self.store.record_event(record.id, "job.goodput", ACTOR, result.to_dict())

    def _end_backoffs(self, now: float) -> None:
        for job_id, when in list(self.backoff.items()):
            if when <= now:
                del self.backoff[job_id]
                with contextlib.suppress(StaleState):
                    self.store.transition(
                        job_id,
                        JobState.PENDING,
                        ACTOR,
                        expected_from=JobState.RESTARTING,
                        reason="restart: back in the queue",
                    )

    def _release(self, record: JobRecord) -> None:
        """Free what Ray still holds for an ended gang (its placement group and actors)."""
        call = self._stopper(record.id, record.attempt, 0)
        self.launcher.submit(record.id, "release", record.attempt, call)

    def _requeue(self, record: JobRecord, why: str, now: float) -> None:
        with contextlib.suppress(StaleState):
            self.store.transition(record.id, JobState.PENDING, ACTOR, reason=why)

    def _fail(self, record: JobRecord, why: str) -> None:
        self.store.transition(record.id, JobState.FAILED, ACTOR, reason=why)

    # -- applying a plan --------------------------------------------------------------------

    def _apply(self, plan: Plan, now: float) -> None:
        state = self.state
        assert state is not None
        for preempt in plan.preemptions:
            # The plan's admissions count on the victims' GPUs: release them in the state now;
            # Ray frees them when the gang has stopped, and the new gang's launch waits for it.
            state.stop(preempt.job_id, now, requeue=False)
            self._stop_gang(preempt.job_id, "preempt", now, reason=preempt.reason)
        for admit in plan.admissions:
            state.start(admit.job_id, admit.placement, now)
            started = self.store.transition(
                admit.job_id,
                JobState.STARTING,
                ACTOR,
                expected_from=JobState.PENDING,
                reason=admit.reason,
                placement=admit.placement,
            )
            self.records[admit.job_id] = started
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

    def _launch(self, record: JobRecord, now: float) -> None:
        if self.runtime is None or record.placement is None:
            return
        runtime = self.runtime
        spec = record.spec
        gang = GangSpec.for_job(
            record.to_job(),
            placement_from_json(record.placement),
            spec.entrypoint,
            args=spec.args,
            env={**spec.env, "AICLUSTER_JOB_ID": record.id, "AICLUSTER_TENANT": record.tenant},
            attempt=record.attempt,
        )
        self.launched.add(record.id)
        self.stats.launched += 1
        self.launcher.submit(record.id, "launch", record.attempt, lambda: runtime.launch(gang))

    def _stop_gang(self, job_id: str, why: str, now: float, reason: str | None = None) -> None:
        if job_id in self.stopping:
            return
        record = self.records[job_id]
        self.stopping.add(job_id)
        if why == "preempt":
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
            if outcome.job_id in state.running:
                state.stop(outcome.job_id, now, requeue=True)
            self.launched.discard(outcome.job_id)
            self.records[outcome.job_id] = self.store.transition(
                outcome.job_id, JobState.PENDING, ACTOR, reason=f"launch failed: {outcome.error}"
            )
        elif outcome.kind == "stop":
            self.stopping.discard(outcome.job_id)
            self.launched.discard(outcome.job_id)
            self.records.pop(outcome.job_id, None)
            if outcome.job_id in state.running:
                state.stop(outcome.job_id, now, requeue=False)
            why = outcome.context.get("why")
            if why == "cancel":
                self.store.transition(outcome.job_id, JobState.CANCELLED, ACTOR, reason="cancelled")
            elif why == "hang" and record is not None:
                reason = str(outcome.context.get("reason") or "hung")
                self._restart_or_fail(record, f"hung: {reason}", None, now)
            else:  # preempted: back in the store's queue; the next tick takes it in again
                self.store.transition(
                    outcome.job_id, JobState.PENDING, ACTOR, reason="preempted: back in the queue"
                )

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
