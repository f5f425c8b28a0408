"""The discrete-event engine: the real ``schedule()`` driven by a simulated clock.

Events wait in a heap (:mod:`aicluster.sim.events`); arrivals stream from the trace iterator
instead (one look-ahead job). Every event at one timestamp is applied before a single scheduling
cycle runs (coalescing); with ``cycle_interval > 0`` a cycle runs at most once per interval, on a
fixed grid. What each event does lives with its subject: a job's arrival, starts, completion and
stops in :mod:`aicluster.sim.job_events`, a node's failure and repair in
:mod:`aicluster.sim.node_events`; here are the loop, the cycles, wakeups, power steps, a start
from a live cluster's jobs and the result.
"""

from __future__ import annotations

import gc
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, replace

from aicluster.core import Cluster, Job, ManualClock, Tenant
from aicluster.core.power import PowerState, Transition
from aicluster.scheduler import (
    PendingEntry,
    RunningEntry,
    SchedulerConfig,
    effects,
    make_state,
    schedule,
)
from aicluster.sim import job_events, node_events
from aicluster.sim.comm import CommModel
from aicluster.sim.config import GC_THRESHOLD, SimConfig
from aicluster.sim.data import DataModel
from aicluster.sim.events import COMPLETE, CYCLE, FAIL, INJECTED, POWER, REPAIR, WAKE, EventHeap
from aicluster.sim.failures import failure_model
from aicluster.sim.job_events import LiveJob
from aicluster.sim.metrics import SERIES_COLUMNS, JobTable, RunTotals, Series, SimResult
from aicluster.sim.predict import OnlinePredictor
from aicluster.sim.shares import TenantShares
from aicluster.sim.traces import TraceJob

__all__ = ["Simulator", "simulate"]

_PROGRESS_EVERY = 2048  # loop iterations between progress callbacks

Progress = Callable[[float, int, int], None]  # (simulated time, jobs arrived, jobs completed)


class Simulator:
    """One simulation run of ``jobs`` (sorted by submit time) on ``cluster`` with ``scheduler``'s
    settings (default: ``SchedulerConfig()``, the documented defaults; :func:`simulate` names the
    queue policy) and ``config``'s, on ``clock`` (default: a new one at 0)."""

    def __init__(
        self,
        cluster: Cluster,
        jobs: Iterable[TraceJob],
        *,
        tenants: dict[str, Tenant] | None = None,
        scheduler: SchedulerConfig | None = None,
        config: SimConfig | None = None,
        clock: ManualClock | None = None,
        predictor: OnlinePredictor | None = None,
    ) -> None:
        self.config = config or SimConfig()
        #: Predicted run times (sim.predict) replace the trace's truth and fill missing estimates.
        self.predictor = predictor
        # Per-job reasons for every pending job cost O(queue) a cycle; the simulator needs none.
        sched = replace(scheduler or SchedulerConfig(), explain=False)
        self.state = make_state(cluster, dict(tenants or {}), sched)
        self.cluster = cluster
        self.clock = clock or ManualClock()
        self.failures = failure_model(cluster, self.config)
        self.comm = CommModel(cluster, self.config.comm_sensitivity)
        self.data = DataModel(cluster, self.state, self.config.data_cache_bytes)
        self.gpus_per_node = max((node.gpus for node in cluster.nodes), default=1)
        self.node_gpus = {node.name: node.gpus for node in cluster.nodes}
        self.total_gpus = cluster.total_gpus  # a sum over nodes: read at every sample
        self.arrivals = iter(jobs)
        self.next_arrival = next(self.arrivals, None)
        self.events = EventHeap()
        self.last_cycle = -math.inf
        self.live: dict[str, LiveJob] = {}
        self.down: set[str] = set()
        self.down_gpus = 0
        self.wakes: set[float] = set()
        # Times a protection that held a victim back lapses (plan.protected_until): a cycle then.
        self.lapses: set[float] = set()
        self.power_times: set[float] = set()  # power steps due (scheduler/power.py)
        #: Every power transition, in order (power saving on; else stays empty).
        self.transitions: list[Transition] = []
        #: The most each rack, and each power budget's racks, drew after any batch of events,
        #: by rack name and budget name (only with power budgets: Budgets.draws).
        self.peak_watts: dict[str, float] = {}
        self.cycle_at: float | None = None
        self.dirty = False
        self.busy = 0
        self.last_time = self.clock.now()
        self.table = JobTable()
        self.shares = TenantShares()
        self.completed = 0
        self.series = Series(self.config.sample_step, self.config.max_samples, SERIES_COLUMNS)
        self.totals = RunTotals(start_time=self.last_time)

    # -- the loop ---------------------------------------------------------------------------

    def run(self, progress: Progress | None = None) -> SimResult:
        """Run to the end of the trace (or ``config.until``) and return the result; ``progress``
        is called every few thousand events and at the end."""
        if not self.config.fewer_collections:
            return self._run(progress)
        _collect_less()
        try:
            return self._run(progress)
        finally:
            _collect_as_before()

    def _run(self, progress: Progress | None) -> SimResult:
        wall = time.perf_counter()
        until = self.config.until
        node_events.schedule_failure(self, self.last_time)
        iterations = 0
        while not self._done():
            now = self._next_time()
            if until is not None and now > until:
                break
            self._advance(now)
            self._apply_events(now)
            if self.dirty:
                self._maybe_cycle(now)
            if self.state.power is not None:
                self._power(now)
            if self.state.budgets is not None:
                self._rack_peaks()
            iterations += 1
            if progress is not None and iterations % _PROGRESS_EVERY == 0:
                progress(now, len(self.table), self.completed)
        self._finish(self.last_time if until is None else max(until, self.last_time))
        self.totals.wall_seconds = time.perf_counter() - wall
        if progress is not None:
            progress(self.last_time, len(self.table), self.completed)
        return self._result()

    def _done(self) -> bool:
        """No arrivals left, nothing running, and no queued job that a repair, a cycle or a
        wakeup could still start (jobs left queued then can never be placed)."""
        if self.next_arrival is not None or self.state.running:
            return False
        if not self.state.pending:
            return True
        return not self.down and self.cycle_at is None and not self.wakes and not self.power_times

    def _next_time(self) -> float:
        arrival = self.next_arrival.submit_time if self.next_arrival is not None else math.inf
        return max(min(arrival, self.events.next_time()), self.last_time)

    def _advance(self, now: float) -> None:
        """Integrate energy and busy GPU-time up to ``now`` and take the samples before it."""
        series = self.series
        while series.next_time < now:
            series.add(self._sample())
        dt = now - self.last_time
        if dt > 0:
            self.totals.energy_joules += self.state.index.watts * dt
            self.totals.allocated += self.busy * dt
            self.last_time = now
            self.clock.advance_to(now)

    def _apply_events(self, now: float) -> None:
        events = self.events
        while (event := events.pop_due(now)) is not None:
            _, kind, _, name, token = event
            self.totals.events += 1
            if kind == COMPLETE:
                job_events.complete(self, name, token, now)
            elif kind == FAIL:
                node_events.fail(self, name, now, token)
            elif kind == REPAIR:
                node_events.repair(self, name, now)
            elif kind == WAKE:
                self._wake(now)
            elif kind == POWER:
                self.power_times.discard(now)
            else:
                self.cycle_at = None  # the cycle itself runs once all events at `now` are in
        while self.next_arrival is not None and self.next_arrival.submit_time <= now:
            self.totals.events += 1
            job_events.arrive(self, self.next_arrival, now)
            self.next_arrival = next(self.arrivals, None)

    # -- scheduling cycles --------------------------------------------------------------------

    def _maybe_cycle(self, now: float) -> None:
        interval = self.config.cycle_interval
        if interval <= 0:
            self._cycle(now)
            return
        due = math.ceil(now / interval) * interval
        if due <= now and self.last_cycle < now:
            self._cycle(now)
        elif self.cycle_at is None:
            self.cycle_at = due if due > now else due + interval
            self.events.push(self.cycle_at, CYCLE)

    def _cycle(self, now: float) -> None:
        self.dirty = False
        self.last_cycle = now
        state = self.state
        if not state.pending:
            return
        state.refresh(now)
        plan = schedule(state.snapshot(now), hold=True)
        self.totals.cycles += 1
        for preempt in plan.preemptions:  # first: admissions may use the GPUs they free
            job_events.stop(self, preempt.job_id, now, preempted=True, kind=preempt.kind.value)
        for admit in plan.admissions:
            job_events.start(self, admit.job_id, admit.placement, now, allocated=plan.held)
        # Not plan.next_wakeup: the jobs just started add their own wakeups (Tiresias demotions).
        self._schedule_wake(state.next_wakeup(now))
        if plan.protected_until is not None:
            self.lapses.add(plan.protected_until)
            self._schedule_wake(plan.protected_until)

    def _schedule_wake(self, when: float | None) -> None:
        if when is not None and when not in self.wakes:
            self.wakes.add(when)
            self.events.push(when, WAKE)

    def _wake(self, now: float) -> None:
        """A job's standing may change now; entries of jobs since stopped are stale, skip them."""
        self.wakes.discard(now)
        due = self.state.next_wakeup(now)  # drops stale entries up to now
        if now in self.lapses:
            self.lapses.discard(now)
            self.dirty = True
        if due is not None and due <= now:
            self.dirty = True
        elif due is not None:
            self._schedule_wake(due)

    def _power(self, now: float) -> None:
        """Step power saving (the shared state machine); a node back on may start jobs now."""
        changes = effects.power_step(self.state, now)
        if changes:
            self.transitions.extend(changes)
            if any(change.after is PowerState.ON for change in changes):
                self.dirty = True
                self._maybe_cycle(now)
                self.transitions.extend(effects.power_step(self.state, now))
        power = self.state.power
        due = power.next_due(now) if power is not None else None
        if due is not None and due not in self.power_times:
            self.power_times.add(due)
            self.events.push(due, POWER)

    def _rack_peaks(self) -> None:
        """Each rack's and budget's draw after this batch of events, kept where it is the most
        yet (between batches nothing changes: this is its draw at every event)."""
        budgets, peaks = self.state.budgets, self.peak_watts
        if budgets is not None:
            for name, watts in budgets.draws().items():
                if watts > peaks.get(name, -1.0):
                    peaks[name] = watts

    # -- starting from a live cluster ------------------------------------------------------

    def resume(
        self,
        running: Iterable[tuple[RunningEntry, float | None]],
        pending: Iterable[PendingEntry],
        launch_s: float = 0.0,
    ) -> None:
        """Start from a live cluster's jobs instead of an empty one (``aicluster.sim.forecast``):
        each of ``running`` holds its placement since it started and is expected to end at the
        time given with it (None: not in this run); ``pending`` waits with its place and
        progress, and a cycle runs at the clock's time. A job started in the run holds its GPUs
        for ``launch_s`` and its ``duration_estimate`` (none: to the end of the run). Call
        before :meth:`run`."""
        now = self.clock.now()
        for entry, ends_at in running:
            self._resume_running(entry, ends_at, now)
        for waiting in pending:
            estimate = waiting.job.duration_estimate
            work = math.inf if estimate is None else launch_s + estimate
            self._resumed(waiting.job, waiting.enqueued_at, work)
            progress = effects.Progress(
                waiting.attained_gpu_seconds,
                waiting.executed_seconds,
                waiting.last_run_seconds,
                waiting.restarts,
                waiting.preempted_at,
            )
            self.state.submit(waiting.job, waiting.enqueued_at, progress=progress, seq=waiting.seq)
        self.dirty = True
        self.cycle_at = now  # (so the run does not end before it)
        self.events.push(now, CYCLE)

    def _resume_running(self, entry: RunningEntry, ends_at: float | None, now: float) -> None:
        job, queued_at = entry.requested, entry.first_enqueued_at
        work = math.inf if ends_at is None else entry.executed_before + ends_at - entry.started_at
        live = self._resumed(job, queued_at, work)
        kept = effects.Progress(
            entry.attained_before, entry.executed_before, 0.0, entry.restarts, entry.preempted_at
        )
        self.state.submit(job, queued_at, progress=kept, seq=entry.seq)
        started = effects.admit(self.state, job.id, entry.placement, entry.started_at)
        started.last_checkpoint_at = entry.last_checkpoint_at
        self.table.start[live.row] = entry.started_at
        live.run = 1
        self.busy += started.job.total_gpus
        self.shares.running[live.tenant] += started.job.total_gpus
        if ends_at is not None:
            self.events.push(max(ends_at, now), COMPLETE, job.id, live.run)

    def _resumed(self, job: Job, submitted_at: float, work: float) -> LiveJob:
        """A job the run takes over (:meth:`resume`), with ``work`` seconds to run in all."""
        tenant = job_events.tenant_index(self, job.tenant)
        row = self.table.add(job.id, tenant, job.total_gpus, submitted_at, work)
        self.shares.demand[tenant] += job.total_gpus
        live = self.live[job.id] = LiveJob(row, job, tenant, work)
        return live

    # -- failures -----------------------------------------------------------------------------

    def inject_failure(self, when: float, node: str) -> None:
        """Fail ``node`` at simulated time ``when``, besides any drawn by the failure model
        (tests, what-if studies). Call before :meth:`run`."""
        if node not in self.node_gpus:
            raise ValueError(f"unknown node {node!r}")
        self.events.push(when, FAIL, node, INJECTED)

    # -- results ------------------------------------------------------------------------------

    def _sample(self) -> tuple[float, ...]:
        state = self.state
        return (
            float(self.busy),
            float(len(state.pending)),
            float(len(state.running)),
            float(len(self.down)),
            state.index.watts,
            self.shares.fairness(self.total_gpus - self.down_gpus),
        )

    def _finish(self, end: float) -> None:
        self._advance(end)
        if self.series.next_time <= end:
            self.series.add(self._sample())
        for running in self.state.running.values():  # runs cut off by the horizon
            live, gpus = self.live[running.job.id], running.job.total_gpus
            wall = end - running.started_at
            self.shares.alloc[live.tenant] += wall * gpus
            restoring = job_events.restore_seconds(self.config, running)
            self.totals.restart_overhead += min(wall, restoring) * gpus
        self.totals.end_time = end
        self.totals.data_bytes_moved = self.data.bytes_moved
        self.totals.data_wait_seconds = self.data.wait_seconds

    def _result(self) -> SimResult:
        return SimResult(
            policy=self.state.config.queue,
            cluster=self.cluster.name,
            total_gpus=self.cluster.total_gpus,
            tenants=list(self.shares.ids),
            tenant_gpu_seconds=list(self.shares.alloc),
            jobs=self.table,
            series=self.series,
            totals=self.totals,
            settings={"sim": asdict(self.config), "backfill": self.state.config.backfill},
            peak_watts=dict(self.peak_watts),
        )


# Speed-up (SimConfig.fewer_collections): the collector's thresholds are the process's, and runs
# may overlap (the control plane forecasts on a thread), so the first run to start raises them
# and the last to end puts back what it found.
_gc_lock = threading.Lock()
_gc_runs: list[int] = [0]  # runs under way
_gc_saved: list[tuple[int, int, int]] = []


def _collect_less() -> None:
    with _gc_lock:
        if _gc_runs[0] == 0:
            saved = gc.get_threshold()
            _gc_saved[:] = [saved]
            gc.set_threshold(max(saved[0], GC_THRESHOLD), saved[1], saved[2])
        _gc_runs[0] += 1


def _collect_as_before() -> None:
    with _gc_lock:
        _gc_runs[0] -= 1
        if _gc_runs[0] == 0 and _gc_saved:
            gc.set_threshold(*_gc_saved.pop())


def simulate(
    cluster: Cluster,
    jobs: Iterable[TraceJob],
    policy: str | None = None,
    *,
    tenants: dict[str, Tenant] | None = None,
    scheduler: SchedulerConfig | None = None,
    config: SimConfig | None = None,
) -> SimResult:
    """Run ``Simulator(cluster, jobs, ...)`` with ``scheduler``'s queue policy replaced by
    ``policy`` when one is named."""
    if policy is not None:
        scheduler = replace(scheduler or SchedulerConfig(), queue=policy)
    return Simulator(cluster, jobs, tenants=tenants, scheduler=scheduler, config=config).run()
