"""The discrete-event engine: the real ``schedule()`` driven by a simulated clock.

Events sit in a heap of ``(time, kind, seq, name, token)`` (at one time, completions come before
failures, so a job finishing as its node fails counts as finished); arrivals stream from the trace
iterator instead (one look-ahead job), so the heap holds only what is in flight. Every event at
one timestamp is applied before a single scheduling cycle runs (coalescing); with
``cycle_interval > 0`` a cycle runs at most once per interval, on a fixed grid.

Checkpoints need no events: a running job's last checkpoint is a function of time
(:meth:`RunningEntry.last_checkpoint`, every ``checkpoint_interval`` since its run began), so when a
job is preempted or its node fails the engine computes, in O(1), the progress that checkpoint
kept; everything after it is lost. A resumed job first spends ``restart_overhead`` restoring.

A gang spread over slow links runs slower (:mod:`aicluster.sim.comm`): its completion is planned
at its remaining work over its speed, which the state keeps for ``effects``' lost-work rule. A job
that reads a dataset first waits for the bytes its nodes do not cache (:mod:`aicluster.sim.data`),
time without progress like a restart's restore.
"""

from __future__ import annotations

import gc
import heapq
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, replace

from aicluster.core import Cluster, Job, ManualClock, Placement, Tenant
from aicluster.core.power import PowerState, Transition
from aicluster.scheduler import (
    PendingEntry,
    RunningEntry,
    SchedulerConfig,
    effects,
    make_state,
    schedule,
)
from aicluster.sim.comm import CommModel
from aicluster.sim.config import GC_THRESHOLD, SimConfig
from aicluster.sim.data import DataModel
from aicluster.sim.failures import failure_model
from aicluster.sim.metrics import SERIES_COLUMNS, JobTable, RunTotals, Series, SimResult
from aicluster.sim.predict import OnlinePredictor
from aicluster.sim.shares import TenantShares
from aicluster.sim.traces import TraceJob, gang_shape

__all__ = ["Simulator", "simulate"]

_COMPLETE, _FAIL, _REPAIR, _WAKE, _CYCLE, _POWER = range(6)
_INJECTED = 1  # token of a failure given by inject_failure (the model draws no successor)
_PROGRESS_EVERY = 2048  # loop iterations between progress callbacks

Progress = Callable[[float, int, int], None]  # (simulated time, jobs arrived, jobs completed)


class _Live:
    """A job that has arrived and not finished (dropped on completion to keep memory flat)."""

    __slots__ = ("data_wait", "duration", "job", "row", "run", "sensitivity", "tenant")

    def __init__(self, row: int, job: Job, tenant: int, duration: float) -> None:
        self.row, self.job, self.tenant, self.duration = row, job, tenant, duration
        self.run = 0  # bumped at every start: completion events of older runs are stale
        self.sensitivity = 0.0  # of its communication (sim.comm): 0 runs at full speed anywhere
        self.data_wait = 0.0  # seconds this run waits for its data (sim.data)


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
        self.heap: list[tuple[float, int, int, str, int]] = []
        self.last_cycle = -math.inf
        self.seq = 0
        self.live: dict[str, _Live] = {}
        self.down: set[str] = set()
        self.down_gpus = 0
        self.wakes: set[float] = set()
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
        self._schedule_failure(self.last_time)
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
        event = self.heap[0][0] if self.heap else math.inf
        return max(min(arrival, event), self.last_time)

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
        heap = self.heap
        while heap and heap[0][0] <= now:
            _, kind, _, name, token = heapq.heappop(heap)
            self.totals.events += 1
            if kind == _COMPLETE:
                self._complete(name, token, now)
            elif kind == _FAIL:
                self._fail(name, now, token)
            elif kind == _REPAIR:
                self._repair(name, now)
            elif kind == _WAKE:
                self._wake(now)
            elif kind == _POWER:
                self.power_times.discard(now)
            else:
                self.cycle_at = None  # the cycle itself runs once all events at `now` are in
        while self.next_arrival is not None and self.next_arrival.submit_time <= now:
            self.totals.events += 1
            self._arrive(self.next_arrival, now)
            self.next_arrival = next(self.arrivals, None)

    def _push(self, when: float, kind: int, name: str = "", token: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (when, kind, self.seq, name, token))

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
            self._push(self.cycle_at, _CYCLE)

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
            self._stop(preempt.job_id, now, preempted=True)
        for admit in plan.admissions:
            self._start(admit.job_id, admit.placement, now, allocated=plan.held)
        # Not plan.next_wakeup: the jobs just started add their own wakeups (Tiresias demotions).
        self._schedule_wake(state.next_wakeup(now))

    def _schedule_wake(self, when: float | None) -> None:
        if when is not None and when not in self.wakes:
            self.wakes.add(when)
            self._push(when, _WAKE)

    def _wake(self, now: float) -> None:
        """A job's standing may change now; entries of jobs since stopped are stale, skip them."""
        self.wakes.discard(now)
        due = self.state.next_wakeup(now)  # drops stale entries up to now
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
            self._push(due, _POWER)

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
            )
            self.state.submit(waiting.job, waiting.enqueued_at, progress=progress, seq=waiting.seq)
        self.dirty = True
        self.cycle_at = now  # (so the run does not end before it)
        self._push(now, _CYCLE)

    def _resume_running(self, entry: RunningEntry, ends_at: float | None, now: float) -> None:
        job, queued_at = entry.requested, entry.first_enqueued_at
        work = math.inf if ends_at is None else entry.executed_before + ends_at - entry.started_at
        live = self._resumed(job, queued_at, work)
        kept = effects.Progress(entry.attained_before, entry.executed_before, 0.0, entry.restarts)
        self.state.submit(job, queued_at, progress=kept, seq=entry.seq)
        started = effects.admit(self.state, job.id, entry.placement, entry.started_at)
        started.last_checkpoint_at = entry.last_checkpoint_at
        self.table.start[live.row] = entry.started_at
        live.run = 1
        self.busy += started.job.total_gpus
        self.shares.running[live.tenant] += started.job.total_gpus
        if ends_at is not None:
            self._push(max(ends_at, now), _COMPLETE, job.id, live.run)

    def _resumed(self, job: Job, submitted_at: float, work: float) -> _Live:
        """A job the run takes over (:meth:`resume`), with ``work`` seconds to run in all."""
        tenant = self._tenant(job.tenant)
        row = self.table.add(job.id, tenant, job.total_gpus, submitted_at, work)
        self.shares.demand[tenant] += job.total_gpus
        live = self.live[job.id] = _Live(row, job, tenant, work)
        return live

    # -- job events ---------------------------------------------------------------------------

    def _arrive(self, trace: TraceJob, now: float) -> None:
        tenant = self._tenant(trace.tenant)
        workers, per_worker = gang_shape(trace.num_gpus, self.gpus_per_node)
        if trace.workers is not None:  # the shape the trace gives (a live export)
            workers, per_worker = trace.workers, trace.num_gpus // trace.workers
        estimate: float | None = trace.duration_estimate
        oracle: float | None = trace.duration
        if self.predictor is not None:  # the policies read the prediction, not the truth
            oracle, estimate = None, self.predictor.submitted(trace, now)
        job = Job(
            id=trace.id,
            tenant=trace.tenant,
            workers=workers,
            gpus_per_worker=per_worker,
            gpu_type=trace.gpu_type,
            cpus_per_worker=trace.cpus / workers,
            memory_gb_per_worker=trace.memory_gb / workers,
            priority=trace.priority,
            submit_time=trace.submit_time,
            checkpoint_interval=self.config.checkpoint_interval,
            true_duration=oracle,
            duration_estimate=estimate,
            data=((trace.dataset, int(trace.data_gb * 1e9)),) if trace.dataset else (),
        )
        row = self.table.add(trace.id, tenant, trace.num_gpus, trace.submit_time, trace.duration)
        live = self.live[trace.id] = _Live(row, job, tenant, trace.duration)
        given = trace.comm_sensitivity
        live.sensitivity = self.comm.by_size(trace.num_gpus) if given is None else given
        self.shares.demand[tenant] += trace.num_gpus
        if trace.dataset:
            self.totals.data_jobs += 1
        self.state.submit(job, now)
        self.dirty = True

    def _tenant(self, name: str) -> int:
        found = self.shares.ids.get(name)
        if found is None:
            found = self.shares.add(name, self.state.tenant(name).weight)
        return found

    def _start(self, job_id: str, placement: Placement, now: float, *, allocated: bool) -> None:
        live = self.live[job_id]
        speed = 1.0
        if live.sensitivity > 0.0:  # (else no cost: the model is off for this job)
            speed = 1.0 / self.comm.slowdown(placement, live.sensitivity)
        running = effects.admit(self.state, job_id, placement, now, speed, allocated=allocated)
        if running.job.data:  # each node lacking the dataset fetches it first
            live.data_wait = self.data.start(placement, *running.job.data[0])
        if math.isnan(self.table.start[live.row]):
            self.table.start[live.row] = now
        live.run += 1
        gpus = running.job.total_gpus
        self.busy += gpus
        self.shares.running[live.tenant] += gpus
        end = now + self._overhead(running) + live.data_wait
        end += (live.duration - running.executed_before) / speed
        self._push(end, _COMPLETE, job_id, live.run)

    def _overhead(self, running: RunningEntry) -> float:
        return self.config.restart_overhead if running.restarts else 0.0

    def _complete(self, job_id: str, token: int, now: float) -> None:
        live = self.live.get(job_id)
        if live is None or live.run != token or job_id not in self.state.running:
            return  # a completion planned for a run that was since stopped
        running = effects.complete(self.state, job_id, now)
        self._end_run(running, live, now)
        self.table.end[live.row] = now
        self.table.restarts[live.row] = running.restarts
        self.shares.demand[live.tenant] -= running.job.total_gpus
        del self.live[job_id]
        if self.predictor is not None:
            self.predictor.ended(job_id, live.duration)
        self.completed += 1
        self.dirty = True

    def _stop(self, job_id: str, now: float, *, preempted: bool) -> float:
        """Stop a running job and requeue it with the progress the lost-work rule keeps
        (``effects.kept_seconds``: its last checkpoint, or the moment it was preempted when jobs
        checkpoint in their grace period); returns the GPU-seconds of work lost."""
        running = self.state.running[job_id]
        saves_now = preempted and self.config.checkpoint_on_preemption
        saved_at = now if saves_now else running.last_checkpoint(now)
        restore = self._overhead(running) + self.live[job_id].data_wait
        stopped = effects.interrupt(self.state, job_id, now, saved_at=saved_at, restore_s=restore)
        effects.requeue_at_once(self.state, stopped, now)
        self._end_run(running, self.live[job_id], now)
        lost = stopped.lost_gpu_seconds
        if preempted:
            self.totals.preemptions += 1
            self.totals.lost_to_preemptions += lost
        else:
            self.totals.failure_interruptions += 1
            self.totals.lost_to_failures += lost
        self.dirty = True
        return lost

    def _end_run(self, running: RunningEntry, live: _Live, now: float) -> None:
        """Account a finished run: allocation, restore overhead, checkpoints."""
        gpus = running.job.total_gpus
        wall = now - running.started_at
        restoring = min(wall, self._overhead(running))
        self.busy -= gpus
        self.shares.running[live.tenant] -= gpus
        self.shares.alloc[live.tenant] += wall * gpus
        self.totals.restart_overhead += restoring * gpus
        interval = self.config.checkpoint_interval
        if interval:
            self.totals.checkpoints += int(wall // interval)

    # -- failures -----------------------------------------------------------------------------

    def inject_failure(self, when: float, node: str) -> None:
        """Fail ``node`` at simulated time ``when``, besides any drawn by the failure model
        (tests, what-if studies). Call before :meth:`run`."""
        if node not in self.node_gpus:
            raise ValueError(f"unknown node {node!r}")
        self._push(when, _FAIL, node, _INJECTED)

    def _schedule_failure(self, now: float) -> None:
        if self.failures is not None:
            drawn = self.failures.next_failure(now)
            if drawn is not None:
                self._push(drawn[0], _FAIL, drawn[1])

    def _fail(self, node: str, now: float, token: int) -> None:
        if token != _INJECTED:
            self._schedule_failure(now)
        if node in self.down:
            return  # already down: thinning keeps each up node's own failure rate
        self.totals.failures += 1
        self.down.add(node)
        self.down_gpus += self.node_gpus[node]
        for job_id in effects.node_down(self.state, node, now):
            self._stop(job_id, now, preempted=False)
        self._push(now + self.config.repair_seconds, _REPAIR, node)

    def _repair(self, node: str, now: float) -> None:
        self.down.discard(node)
        self.down_gpus -= self.node_gpus[node]
        effects.node_up(self.state, node, now)
        self.dirty = True

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
            self.totals.restart_overhead += min(wall, self._overhead(running)) * gpus
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
