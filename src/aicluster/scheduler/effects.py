"""A plan's effects on the scheduler's state: the one place both control loops change it.

The live control loop (Ray) and the simulator (an event clock) each apply a
:class:`~aicluster.core.Plan` and report what happens to jobs and nodes through these functions,
so that a preempted or failed job comes back into the queue the same way on both sides: with the
attained service, the executed time and the restarts of its earlier runs (Tiresias demotes and
promotes it, SRTF remembers its progress). What each loop does *outside* the state (launch a gang
on Ray, push a completion event on the simulated clock) stays its own.

The lost-work rule (:func:`kept_seconds`): a stopped run keeps the progress its last save holds.
A run saves at its checkpoints; a job that checkpoints when asked to stop (SIGTERM, then the
preemption's grace period: ``aicluster.train.should_stop``) saves at the moment it was stopped
and loses nothing. Everything executed after the last save is lost and done again.

Work and wall time: a run's ``speed`` (:class:`RunningEntry`; 1.0 live) is the job's own seconds
of work per wall second. Executed and kept time are work (what is left of the job, what SRTF
ranks by), so a slowed run keeps its wall progress × speed; attained service and lost
GPU-seconds are wall time, what the job held the GPUs for.
"""

from __future__ import annotations

from dataclasses import dataclass

from aicluster.core import Job, Placement
from aicluster.core.power import Transition
from aicluster.scheduler.entries import PendingEntry, Progress, RunningEntry
from aicluster.scheduler.state import SchedulerState

__all__ = [
    "Interruption",
    "Progress",
    "account",
    "admit",
    "checkpointed",
    "complete",
    "interrupt",
    "kept_seconds",
    "node_down",
    "node_up",
    "power_step",
    "requeue",
    "requeue_at_once",
    "resume_failed",
]


@dataclass(frozen=True, slots=True)
class Interruption:
    """A run stopped before its end: what it was, what the job keeps, what was lost."""

    running: RunningEntry
    stopped_at: float
    progress: Progress
    lost_gpu_seconds: float  # work since the last save (the restore time of the run excluded)
    restoring_seconds: float  # of the run's wall time, spent restoring its checkpoint


def kept_seconds(running: RunningEntry, saved_at: float, restore_s: float = 0.0) -> float:
    """The executed time a run stopped after saving at ``saved_at`` keeps: what it had before,
    plus its own progress up to the save (the first ``restore_s`` of a run restore, not train),
    at the run's speed."""
    return running.executed_before + _trained(running, saved_at, restore_s) * running.speed


def _trained(running: RunningEntry, until: float, restore_s: float) -> float:
    """Wall seconds the run spent training up to ``until`` (its first ``restore_s`` restore)."""
    return max(0.0, until - (running.started_at + restore_s))


def admit(
    state: SchedulerState,
    job_id: str,
    placement: Placement,
    now: float,
    speed: float = 1.0,
    *,
    allocated: bool = False,
) -> RunningEntry:
    """An admission of the plan: the job leaves the queue and takes its GPUs (``speed``: work
    per wall second on this placement, 1.0 live; ``allocated``: the index holds them already,
    a plan's ``held``)."""
    return state.start(job_id, placement, now, speed, allocated=allocated)


def complete(state: SchedulerState, job_id: str, now: float) -> RunningEntry:
    """A run that ended for good (success, failure for good, cancellation): its GPUs return."""
    return state.stop(job_id, now, requeue=False)


def interrupt(
    state: SchedulerState,
    job_id: str,
    now: float,
    *,
    saved_at: float,
    restore_s: float = 0.0,
    preempted: bool = False,
) -> Interruption:
    """A run stopped before its end (preempted, its node failed, its gang crashed): its GPUs
    return at once, and the job's :class:`Progress` is worked out by the lost-work rule from
    its last save at ``saved_at`` (clamped to the run). The job is out of the state until
    :func:`requeue` puts it back: the simulator does so at once, the live loop once its gang has
    stopped and the store has it PENDING again. ``preempted``: a preemption (not a failure),
    from which the job's cool-down counts (:mod:`.protection`)."""
    running = state.stop(job_id, now, requeue=False)
    return account(running, now, saved_at=saved_at, restore_s=restore_s, preempted=preempted)


def account(
    running: RunningEntry,
    stopped_at: float,
    *,
    saved_at: float,
    restore_s: float = 0.0,
    preempted: bool = False,
) -> Interruption:
    """What a run stopped at ``stopped_at`` leaves its job by the lost-work rule, its last save
    at ``saved_at`` (clamped to the run). The live loop asks again, with ``saved_at`` the moment
    of the stop, when the job reports a checkpoint taken in its grace period. ``preempted``:
    the job keeps ``stopped_at`` as the time it was last preempted."""
    wall = max(0.0, stopped_at - running.started_at)
    restoring = min(wall, restore_s)
    saved = min(max(saved_at, running.started_at), stopped_at)
    kept = kept_seconds(running, saved, restore_s)
    progress = Progress(
        attained_gpu_seconds=running.attained(stopped_at),
        executed_seconds=kept,
        last_run_seconds=wall,
        restarts=running.restarts + 1,
        preempted_at=stopped_at if preempted else running.preempted_at,
    )
    # Wall time the save keeps, from the work kept (not _trained() again: at speed 1.0 this is
    # the arithmetic replays were always decided with, to the last bit).
    saved_wall = (kept - running.executed_before) / running.speed
    lost = max(0.0, wall - restoring - saved_wall) * running.job.total_gpus
    return Interruption(running, stopped_at, progress, lost, restoring)


def requeue(
    state: SchedulerState, job: Job, progress: Progress, now: float, *, seq: int | None = None
) -> PendingEntry:
    """Put an interrupted job back in the queue, keeping its progress (``seq``: its place among
    equals, kept when the same state requeues it)."""
    return state.submit(job, now, progress=progress, seq=seq)


def requeue_at_once(state: SchedulerState, stopped: Interruption, now: float) -> PendingEntry:
    """Put a job :func:`interrupt` just stopped straight back in the queue, in its old place
    among equals (the simulator always; the live loop after a launch that failed)."""
    running = stopped.running
    return requeue(state, running.requested, stopped.progress, now, seq=running.seq)


def checkpointed(state: SchedulerState, job_id: str, at: float) -> None:
    """A running job saved its progress at ``at`` (a checkpoint it reported)."""
    running = state.running.get(job_id)
    if running is not None and at > running.last_checkpoint_at:
        state.checkpointed(job_id, at)


def node_down(state: SchedulerState, node: str, now: float = 0.0) -> list[str]:
    """A node failed or was cordoned: nothing new goes there. Returns the jobs it holds (the
    caller interrupts those that die with it)."""
    state.set_node_schedulable(node, False, now)
    return state.jobs_on(node)


def node_up(state: SchedulerState, node: str, now: float = 0.0) -> None:
    """A node is back (repaired, uncordoned): schedulable again (once it is also on, under
    power saving)."""
    state.set_node_schedulable(node, True, now)


def power_step(state: SchedulerState, now: float) -> list[Transition]:
    """Power saving's step (:mod:`.power`): suspends and resumes that end by ``now``, resumes
    the queue needs, suspends of nodes idle long enough. The caller carries them out (powers
    the node down or up) and steps again at ``state.power.next_due``. None without a policy."""
    return [] if state.power is None else state.power.step(now)


def resume_failed(state: SchedulerState, node: str, now: float) -> Transition:
    """A node did not come back from a resume: it stays out of placement; the queue's demand
    resumes another at the next step, so the job waiting for it goes elsewhere."""
    if state.power is None:
        raise ValueError("no power policy: nothing is resumed")
    return state.power.resume_failed(state.index.node_id[node], now)
