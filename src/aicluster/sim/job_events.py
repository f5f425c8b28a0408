"""A job's events in a replay: its arrival from the trace, each start on the plan's placement, its
completion, a stop (preempted, or its node failed) and what each run adds to the totals. The
engine (:mod:`aicluster.sim.engine`) calls these with itself, as the live loop calls
``scheduler.effects`` with its state; what they change in the scheduler's state goes through
``effects``, so a stopped job comes back into the queue as it would live.

Checkpoints need no events: a running job's last checkpoint is a function of time
(:meth:`RunningEntry.last_checkpoint`), so a stop computes, in O(1), the progress that checkpoint
kept; everything after it is lost. A resumed job first spends ``restart_overhead`` restoring. A
gang spread over slow links runs slower (:mod:`aicluster.sim.comm`): its completion is planned at
its remaining work over its speed. A job that reads a dataset first waits for the bytes its nodes
do not cache (:mod:`aicluster.sim.data`), time without progress like a restart's restore.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from aicluster.core import Job, Placement
from aicluster.core.preemption_cost import UNKNOWN
from aicluster.scheduler import RunningEntry, effects
from aicluster.sim.config import SimConfig
from aicluster.sim.events import COMPLETE
from aicluster.sim.traces import TraceJob, gang_shape

if TYPE_CHECKING:
    from aicluster.sim.engine import Simulator

__all__ = [
    "LiveJob",
    "arrive",
    "complete",
    "end_run",
    "restore_seconds",
    "start",
    "stop",
    "tenant_index",
]


class LiveJob:
    """A job that has arrived and not finished (dropped on completion to keep memory flat)."""

    __slots__ = ("data_wait", "duration", "job", "row", "run", "sensitivity", "tenant")

    def __init__(self, row: int, job: Job, tenant: int, duration: float) -> None:
        self.row, self.job, self.tenant, self.duration = row, job, tenant, duration
        self.run = 0  # bumped at every start: completion events of older runs are stale
        self.sensitivity = 0.0  # of its communication (sim.comm): 0 runs at full speed anywhere
        self.data_wait = 0.0  # seconds this run waits for its data (sim.data)


def arrive(sim: Simulator, trace: TraceJob, now: float) -> None:
    tenant = tenant_index(sim, trace.tenant)
    workers, per_worker = gang_shape(trace.num_gpus, sim.gpus_per_node)
    if trace.workers is not None:  # the shape the trace gives (a live export)
        workers, per_worker = trace.workers, trace.num_gpus // trace.workers
    estimate: float | None = trace.duration_estimate
    oracle: float | None = trace.duration
    if sim.predictor is not None:  # the policies read the prediction, not the truth
        oracle, estimate = None, sim.predictor.submitted(trace, now)
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
        checkpoint_interval=sim.config.checkpoint_interval,
        true_duration=oracle,
        duration_estimate=estimate,
        data=((trace.dataset, int(trace.data_gb * 1e9)),) if trace.dataset else (),
    )
    row = sim.table.add(trace.id, tenant, trace.num_gpus, trace.submit_time, trace.duration)
    live = sim.live[trace.id] = LiveJob(row, job, tenant, trace.duration)
    given = trace.comm_sensitivity
    live.sensitivity = sim.comm.by_size(trace.num_gpus) if given is None else given
    sim.shares.demand[tenant] += trace.num_gpus
    if trace.dataset:
        sim.totals.data_jobs += 1
    sim.state.submit(job, now)
    sim.dirty = True


def tenant_index(sim: Simulator, name: str) -> int:
    """The tenant's index in the run's shares, added at its first job."""
    found = sim.shares.ids.get(name)
    if found is None:
        found = sim.shares.add(name, sim.state.tenant(name).weight)
    return found


def start(
    sim: Simulator, job_id: str, placement: Placement, now: float, *, allocated: bool
) -> None:
    live = sim.live[job_id]
    speed = 1.0
    if live.sensitivity > 0.0:  # (else no cost: the model is off for this job)
        speed = 1.0 / sim.comm.slowdown(placement, live.sensitivity)
    running = effects.admit(sim.state, job_id, placement, now, speed, allocated=allocated)
    if running.job.data:  # each node lacking the dataset fetches it first
        live.data_wait = sim.data.start(placement, *running.job.data[0])
    if math.isnan(sim.table.start[live.row]):
        sim.table.start[live.row] = now
    live.run += 1
    gpus = running.job.total_gpus
    sim.busy += gpus
    sim.shares.running[live.tenant] += gpus
    end = now + restore_seconds(sim.config, running) + live.data_wait
    end += (live.duration - running.executed_before) / speed
    sim.events.push(end, COMPLETE, job_id, live.run)


def restore_seconds(config: SimConfig, running: RunningEntry) -> float:
    """What a run spends restoring before it makes progress: only a restarted one restores."""
    return config.restart_overhead if running.restarts else 0.0


def complete(sim: Simulator, job_id: str, token: int, now: float) -> None:
    live = sim.live.get(job_id)
    if live is None or live.run != token or job_id not in sim.state.running:
        return  # a completion planned for a run that was since stopped
    running = effects.complete(sim.state, job_id, now)
    end_run(sim, running, live, now)
    sim.table.end[live.row] = now
    sim.table.restarts[live.row] = running.restarts
    sim.shares.demand[live.tenant] -= running.job.total_gpus
    del sim.live[job_id]
    if sim.predictor is not None:
        sim.predictor.ended(job_id, live.duration)
    sim.completed += 1
    sim.dirty = True


def stop(sim: Simulator, job_id: str, now: float, *, preempted: bool, kind: str = UNKNOWN) -> float:
    """Stop a running job and requeue it with the progress the lost-work rule keeps
    (``effects.kept_seconds``: its last checkpoint, or the moment it was preempted when jobs
    checkpoint in their grace period); returns the GPU-seconds of work lost. A preemption
    counts against its tenant's cost (``core.preemption_cost``) by ``kind``, the plan's right."""
    running = sim.state.running[job_id]
    saves_now = preempted and sim.config.checkpoint_on_preemption
    saved_at = now if saves_now else running.last_checkpoint(now)
    restore = restore_seconds(sim.config, running) + sim.live[job_id].data_wait
    stopped = effects.interrupt(
        sim.state, job_id, now, saved_at=saved_at, restore_s=restore, preempted=preempted
    )
    effects.requeue_at_once(sim.state, stopped, now)
    end_run(sim, running, sim.live[job_id], now)
    lost = stopped.lost_gpu_seconds
    if preempted:
        sim.totals.preemptions += 1
        sim.totals.lost_to_preemptions += lost
        sim.totals.preemption_cost(running.job.tenant).evicted(kind, lost)
    else:
        sim.totals.failure_interruptions += 1
        sim.totals.lost_to_failures += lost
    sim.dirty = True
    return lost


def end_run(sim: Simulator, running: RunningEntry, live: LiveJob, now: float) -> None:
    """Account a finished run: allocation, restore overhead, checkpoints."""
    gpus = running.job.total_gpus
    wall = now - running.started_at
    restoring = min(wall, restore_seconds(sim.config, running))
    sim.busy -= gpus
    sim.shares.running[live.tenant] -= gpus
    sim.shares.alloc[live.tenant] += wall * gpus
    sim.totals.restart_overhead += restoring * gpus
    interval = sim.config.checkpoint_interval
    if interval:
        sim.totals.checkpoints += int(wall // interval)
