"""The scheduler's entries for jobs: one waiting in the queue (:class:`PendingEntry`), one running
(:class:`RunningEntry`), what a job keeps from its earlier runs (:class:`Progress`), and the
shape and lane that group jobs which fit alike. The state makes and keeps them (:mod:`.state`);
the policies rank them.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

from aicluster.core import Job, Placement
from aicluster.core.init_args import rebuilt_by_init

__all__ = ["Lane", "PendingEntry", "Progress", "RunningEntry", "job_shape"]

Lane = tuple[Hashable, ...]


def job_shape(job: Job) -> tuple[object, ...]:
    """Jobs of equal shape fit or fail to fit in exactly the same free capacity."""
    shape = (job.gpu_type, job.unit_gpus, job.units, job.needs_nvlink, job.max_domain)
    if job.needs_host:  # (only then: a shorter key hashes faster, and shapes are memo keys)
        return (*shape, job.unit_millicpus, job.unit_memory_mib)
    return shape


@dataclass(frozen=True, slots=True)
class Progress:
    """What a job keeps from its earlier runs when it comes back to the queue (preempted, failed
    over): the policy ranks it by these (Tiresias' attained service, SRTF's remaining time).
    ``preempted_at``: when it was last preempted (-inf: never), for the cool-down after a
    preemption (:mod:`.protection`)."""

    attained_gpu_seconds: float = 0.0
    executed_seconds: float = 0.0
    last_run_seconds: float = 0.0
    restarts: int = 0
    preempted_at: float = -math.inf

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return rebuilt_by_init(self)  # (see core/init_args.py)


@dataclass(slots=True, init=False)
class PendingEntry:
    """A job waiting to run, with what it has received in earlier runs (if preempted)."""

    job: Job
    seq: int
    enqueued_at: float
    attained_gpu_seconds: float
    executed_seconds: float
    last_run_seconds: float
    restarts: int
    key: tuple[float, ...]
    lane: Lane
    preempted_at: float

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return rebuilt_by_init(self)  # (see core/init_args.py)

    # Written out rather than generated (init=False): mypyc compiles a class's own __init__ but
    # leaves the one dataclasses generates interpreted, and one entry is made per job and run.
    def __init__(
        self,
        job: Job,
        seq: int,
        enqueued_at: float,
        attained_gpu_seconds: float = 0.0,
        executed_seconds: float = 0.0,
        last_run_seconds: float = 0.0,
        restarts: int = 0,
        key: tuple[float, ...] = (),
        lane: Lane = (),
        preempted_at: float = -math.inf,
    ) -> None:
        self.job, self.seq, self.enqueued_at = job, seq, enqueued_at
        self.attained_gpu_seconds = attained_gpu_seconds
        self.executed_seconds = executed_seconds
        self.last_run_seconds = last_run_seconds
        self.restarts = restarts
        self.key, self.lane = key, lane
        self.preempted_at = preempted_at


@dataclass(slots=True, init=False)
class RunningEntry:
    """A job holding GPUs since ``started_at``. ``job`` is what runs (an elastic job may run
    smaller than ``requested``, the job as submitted). ``speed``: the job's own seconds of work
    per second of wall time on this placement (1.0 live, where real time is real; below 1 in the
    simulator when the gang's spread slows its communication, :mod:`aicluster.sim.comm`).
    ``preempted_at``: when the job was last preempted (-inf: never); with ``started_at`` it
    decides the run's protections (:mod:`.protection`), live and simulated alike."""

    job: Job
    requested: Job
    seq: int
    placement: Placement
    gpu_type: str
    started_at: float
    attained_before: float
    executed_before: float
    last_checkpoint_at: float
    restarts: int
    first_enqueued_at: float
    speed: float
    preempted_at: float

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return rebuilt_by_init(self)  # (see core/init_args.py)

    # Written out (init=False), as PendingEntry's: one is made per run.
    def __init__(
        self,
        job: Job,
        requested: Job,
        seq: int,
        placement: Placement,
        gpu_type: str,
        started_at: float,
        attained_before: float = 0.0,
        executed_before: float = 0.0,
        last_checkpoint_at: float = 0.0,
        restarts: int = 0,
        first_enqueued_at: float = 0.0,
        speed: float = 1.0,
        preempted_at: float = -math.inf,
    ) -> None:
        self.job, self.requested, self.seq = job, requested, seq
        self.placement, self.gpu_type, self.started_at = placement, gpu_type, started_at
        self.attained_before, self.executed_before = attained_before, executed_before
        self.last_checkpoint_at, self.restarts = last_checkpoint_at, restarts
        self.first_enqueued_at, self.speed = first_enqueued_at, speed
        self.preempted_at = preempted_at

    def attained(self, now: float) -> float:
        """GPU-seconds of wall time held: what the job consumed, however fast it ran."""
        return self.attained_before + self.job.total_gpus * max(0.0, now - self.started_at)

    def executed(self, now: float) -> float:
        """Work done, in the job's own (unslowed) seconds."""
        return self.executed_before + max(0.0, now - self.started_at) * self.speed

    def last_checkpoint(self, now: float) -> float:
        """When the job last saved its progress: the later of a reported checkpoint and, for a
        job with a ``checkpoint_interval``, the last whole interval since this run started."""
        latest = max(self.last_checkpoint_at, self.started_at)
        interval = self.job.checkpoint_interval
        if interval:
            periodic = self.started_at + ((now - self.started_at) // interval) * interval
            latest = max(latest, periodic)
        return min(latest, now)

    def lost_work(self, now: float) -> float:
        """Seconds of work lost if stopped now (since the last checkpoint)."""
        return max(0.0, now - self.last_checkpoint(now))
