"""The control loop: store + scheduler + runtime, one tick at a time.

Each tick: sync nodes and tenants, take in new and cancelled jobs, collect finished gang calls,
poll running gangs, run one scheduling cycle and apply its plan, publish the queue (with the
queued jobs' estimated starts: :mod:`aicluster.sim.forecast`, every ``estimates.interval_s``).
The store is the source of truth: every decision is written there (one transaction each) before
the runtime is asked to act, so a restarted loop can rebuild its state and reconcile with what
Ray runs.

The loop holds a :class:`~aicluster.control.loop.lifecycle.GangLifecycle` (``gangs``: launching,
following, stopping and settling gangs), a :class:`~aicluster.control.loop.intake.JobIntake`
(``intake``: the store's jobs into the state), its nodes as Ray reports them
(:class:`~aicluster.control.loop.nodes.LiveNodes`, ``nodes``) and its queue's estimated starts
(:class:`~aicluster.control.loop.estimates.StartEstimates`, ``estimates``). Every per-job step
runs under ``gangs.guard`` (:mod:`aicluster.control.loop.faults`): a job whose handling raises is
recorded and, after a few faults, failed; the tick goes on for every other job. A watchdog thread
(:mod:`aicluster.control.loop.watchdog`) reports a tick over its budget.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from pathlib import Path

from aicluster.configuration import (
    Configuration,
    loop_options,
    parse_configuration,
    scheduler_config,
)
from aicluster.control.loop.alarms import record_alarms
from aicluster.control.loop.diskreturn import DiskGiveBack
from aicluster.control.loop.estimates import StartEstimates
from aicluster.control.loop.intake import JobIntake
from aicluster.control.loop.launcher import Launcher
from aicluster.control.loop.lifecycle import GangLifecycle
from aicluster.control.loop.locality import CacheReports
from aicluster.control.loop.nodes import LiveNodes, live_cluster
from aicluster.control.loop.ports import GangRuntime
from aicluster.control.loop.power import LivePower
from aicluster.control.loop.predictions import LivePredictions
from aicluster.control.loop.watchdog import TickWatchdog
from aicluster.control.settings import ACTOR, LoopSettings
from aicluster.control.views.metrics import observe_cycle
from aicluster.control.views.powerview import NodePower, node_power
from aicluster.control.views.queueview import QueueEntry, queue_entries, queue_order
from aicluster.core import Clock, ConfigError, Placement, Plan
from aicluster.core.preemption_cost import DRAIN, ELASTIC
from aicluster.runtime import ClusterView
from aicluster.runtime.cluster.providers import NodeProvider
from aicluster.scheduler import SchedulerConfig, SchedulerState, effects, find_placement, schedule
from aicluster.scheduler.policies import make_state
from aicluster.store import JobRecord, LeaseLost, NodeHealth, NotFound, Store

__all__ = ["ControlLoop", "LoopStats"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LoopStats:
    ticks: int = 0
    cycles: int = 0
    last_cycle_seconds: float = 0.0
    forecasts: int = 0
    last_forecast_seconds: float = 0.0


class ControlLoop:
    """Owns the SchedulerState of a live cluster. Not thread-safe: one thread calls :meth:`tick`
    (see :meth:`start`); others read :attr:`queue` and :attr:`usage` snapshots."""

    def __init__(
        self,
        store: Store,
        runtime: GangRuntime | None,
        discover: Callable[[], ClusterView] | None,
        clock: Clock,
        settings: LoopSettings | None = None,
        *,
        lease: Callable[[], bool] | None = None,
        provider: NodeProvider | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.store, self.runtime, self.clock = store, runtime, clock
        # Asked before every tick: a leader whose lease is gone must stop acting at once.
        self.lease = lease
        settings = settings or LoopSettings()
        self.config_id: int | None = None  # the applied configuration running (0: defaults)
        # No Ray call once deposed; ``executor``: see Launcher (the logic tests run calls inline).
        self.launcher = Launcher(guard=self._check_lease, executor=executor)
        self.gangs = GangLifecycle(store, runtime, self.launcher, clock, settings, self.wake)
        self.intake = JobIntake(store, self.gangs)
        self.caches = CacheReports()  # the nodes' data caches, for the locality term
        self.power = LivePower(store, provider)  # power saving's suspends and resumes
        self.nodes = LiveNodes(store, runtime, discover, clock)  # as Ray reports them
        self._settings = settings
        self._predict(settings)
        self.watchdog = TickWatchdog(settings.tick_budget_s)
        self.queue: list[QueueEntry] = []
        # What the views read: the state as the last whole tick left it. After configure() or a
        # rebuild the working state is None, then starts empty and takes the jobs in; a reader
        # of it meanwhile (the API's thread) saw a tenant with a running job using nothing.
        self.shown: SchedulerState | None = None
        self._reasons_written: dict[str, str | None] = {}  # by job id: see _write_reasons
        self.stats = LoopStats()
        self.estimates = StartEstimates(self.stats)
        self.disks = DiskGiveBack()  # ended jobs' disk images, off the tick
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def settings(self) -> LoopSettings:
        """What the loop runs with; set a new one to run with it from the next tick."""
        return self._settings

    @settings.setter
    def settings(self, settings: LoopSettings) -> None:
        self._settings = self.gangs.settings = settings
        self._predict(settings)

    def _predict(self, settings: LoopSettings) -> None:
        options = settings.prediction
        self.intake.predictions = None if options is None else LivePredictions(self.store, options)

    @property
    def config(self) -> SchedulerConfig:
        return self._settings.scheduler

    @property
    def state(self) -> SchedulerState | None:
        """The scheduler state (None until the first tick, and after :meth:`configure`)."""
        return self.gangs.state

    @property
    def records(self) -> dict[str, JobRecord]:
        """The records of the jobs the state knows (pending or holding GPUs)."""
        return self.gangs.records

    def give_back_disks(self) -> None:
        """The disks of the jobs that ended (at start-up: what a crashed server left), while
        this server leads (runtime/sandbox/jobdisk.py)."""
        if self.runtime is not None and (self.lease is None or self.lease()):
            self.runtime.release_disks(self._job_active)

    def _job_active(self, job_id: str) -> bool:
        """Whether the job exists and has not ended (its disk is still its own)."""
        if job_id in self.records:  # pending or holding GPUs: no query
            return True
        try:
            return not self.store.get_job(None, job_id).state.terminal
        except NotFound:
            return False

    def _check_lease(self) -> None:
        """Just before a Ray call (the launcher's guard): raise :class:`LeaseLost` unless this
        server still leads, by its own clock and by the lease's epoch in the store."""
        if self.lease is not None and not self.lease():
            raise LeaseLost("the leader lease is gone: no more Ray calls from this server")
        self.store.check_fence()  # a no-op unless the store is fenced (a leader's)

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
        self.power.shutdown()
        self.estimates.shutdown()
        self.disks.shutdown()

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
            self._wake.wait(self._settings.interval_s)
            self._wake.clear()

    # -- one tick ---------------------------------------------------------------------------

    def tick(self) -> Plan | None:
        """One cycle; None (and nothing done) when this process no longer holds the lease."""
        if self.lease is not None and not self.lease():
            log.warning("the leader lease is gone: this tick does nothing")
            return None
        now = self.clock.now()
        self.stats.ticks += 1
        if self._settings.follow_config:
            self._follow_configuration()
        if self.nodes.sync(self.state) or self.state is None:
            self._rebuild(now)
        state = self.state
        assert state is not None
        state.tenants = {tenant.name: tenant for tenant in self.store.list_tenants()}
        self.gangs.settle(now)
        self.gangs.end_backoffs(now)
        self.intake.take_in(now)
        if self.runtime is not None:
            nodes = (record.node.name for record in self.nodes.records)
            self.caches.sync(state, self.runtime.state_dir, nodes)
            record_alarms(self.store, self.runtime.state_dir)
            self.disks.kick(now, self.give_back_disks)
        self.gangs.follow(now)
        self._drain(now)
        self._grow_elastic(now)
        state.refresh(now)
        started = time.perf_counter()
        plan = schedule(state.snapshot(now))
        self.stats.last_cycle_seconds = time.perf_counter() - started
        self.stats.cycles += 1
        observe_cycle(self.stats.last_cycle_seconds)
        self._apply(plan, now)
        self.power.step(state, self.nodes.alive, now)
        self._publish(plan, now)
        return plan

    # -- configuration ----------------------------------------------------------------------

    def configure(self, configuration: Configuration) -> None:
        """Run with ``configuration`` from the next tick on: the scheduler's settings and the
        loop's own (grace period, health, backoff). The state is rebuilt from the store, as
        after a restart, so no job is dropped; gangs running keep their health monitors."""
        options = loop_options(configuration)  # LoopSettings' fields
        self.settings = replace(self.settings, scheduler=scheduler_config(configuration), **options)
        self.gangs.reset(None)

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

    def _rebuild(self, now: float) -> None:
        """A fresh SchedulerState from the store: at start, after a restart, when nodes change."""
        records = self.store.list_nodes()
        nodes = tuple(record.node for record in records)
        cluster = live_cluster(nodes, self._settings)
        tenants = {tenant.name: tenant for tenant in self.store.list_tenants()}
        state = make_state(cluster, tenants, self._settings.scheduler)
        for record in records:
            state.set_node_schedulable(record.node.name, record.schedulable)
        self.power.adopt(state, records, now)
        self.gangs.reset(state)
        self.caches.reset()
        self.intake.adopt(now)

    def _grow_elastic(self, now: float) -> None:
        """Restart elastic jobs running short of workers at full size once it fits (checkpoint,
        requeue, place): at most once per ``grow_after_s`` of a run."""
        state = self.state
        assert state is not None
        for job_id, running in list(state.running.items()):
            short = running.job.workers < running.requested.workers
            if not short or job_id in self.gangs.stopping or job_id not in self.gangs.launched:
                continue
            if now - running.started_at < self._settings.grow_after_s:
                continue
            with state.index.tentative():
                state.index.release(running.placement.slots)
                fits = isinstance(find_placement(state.index, running.requested), Placement)
            if fits:
                with self.gangs.guard(job_id, "growing it back"):
                    why = f"elastic: growing back to {running.requested.workers} workers"
                    self.gangs.preempt(job_id, now, why, ELASTIC)

    def _drain(self, now: float) -> None:
        """Move jobs off draining nodes: preempt them (they checkpoint in the grace period)
        and let the scheduler place them elsewhere."""
        state = self.state
        assert state is not None
        for record in self.nodes.records:  # as read by this tick's sync
            if record.health is not NodeHealth.DRAINING:
                continue
            for job_id in state.jobs_on(record.node.name):
                if job_id in self.gangs.launched and job_id not in self.gangs.stopping:
                    with self.gangs.guard(job_id, "moving it off a draining node"):
                        why = f"node {record.node.name} is draining"
                        self.gangs.preempt(job_id, now, why, DRAIN)

    # -- applying a plan --------------------------------------------------------------------

    def _apply(self, plan: Plan, now: float) -> None:
        state = self.state
        assert state is not None
        for preempt in plan.preemptions:
            # The plan's admissions count on the victims' GPUs: release them in the state now;
            # Ray frees them when the gang has stopped, and the new gang's launch waits for it.
            with self.gangs.guard(preempt.job_id, "preempting it"):
                self.gangs.preempt(preempt.job_id, now, preempt.reason, preempt.kind.value)
        for admit in plan.admissions:
            effects.admit(state, admit.job_id, admit.placement, now)
            self._reasons_written.pop(admit.job_id, None)  # leaving PENDING clears it in the store
        records = self.records  # read once: a property, and the loops below visit every job
        starts = [(a.job_id, a.placement, a.reason) for a in plan.admissions]
        for job_id, started in self.store.start_jobs(starts, ACTOR).items():
            if started is None:  # it left PENDING meanwhile (cancelled): give its GPUs back
                effects.complete(state, job_id, now)
                records.pop(job_id, None)
                continue
            records[job_id] = started
            with self.gangs.guard(job_id, "launching it"):
                self.gangs.launch(started, now)
        self._write_reasons(plan)

    def _write_reasons(self, plan: Plan) -> None:
        """Store the reasons that changed since the store last had them: the record's as read,
        else the one this loop last wrote (kept apart from the records: a copy of the record per
        changed reason cost about a tenth of a steady tick at 5,000 queued jobs, in
        bench/control_tick.py)."""
        records, written = self.records, self._reasons_written
        changed = {}
        for job_id, reason in plan.pending.items():
            record = records.get(job_id)
            if record is None:
                continue
            stored = written.get(job_id, record.pending_reason)
            if stored != reason.message:
                changed[job_id] = reason
        if changed:
            self.store.set_pending_reasons(changed)
            written.update((job_id, reason.message) for job_id, reason in changed.items())
        if len(written) > 2 * len(records):  # forget jobs that left, now and then (amortized O(1))
            self._reasons_written = {k: v for k, v in written.items() if k in records}

    # -- views for the API ------------------------------------------------------------------

    def _publish(self, plan: Plan, now: float) -> None:
        state = self.state
        assert state is not None
        order = queue_order(state, now)
        options, launch_times = self._settings.estimates, self.gangs.launch_times
        self.estimates.update(state, order, now, options, launch_times)
        names = {job_id: record.name for job_id, record in self.records.items()}
        self.queue = queue_entries(state, plan, names, now, order, self.estimates.by_job)
        self.shown = state

    def usage_by_tenant(self) -> dict[str, dict[str, int]]:
        state = self.shown
        if state is None:
            return {}
        return {
            t: {g: n for g, n in u.items() if n} for t, u in state.usage.items() if any(u.values())
        }

    def node_power(self, state_dir: str | Path) -> list[NodePower]:
        """Each node's draw, measured where its meters report, else modelled (powerview.py)."""
        state = self.shown
        return [] if state is None else node_power(state, state_dir, self.clock.now())

    def gpus_used_by_node(self) -> dict[str, int]:
        state = self.shown
        if state is None:
            return {}
        index = state.index
        return {node.name: node.gpus - index.free[i] for i, node in enumerate(index.nodes)}
