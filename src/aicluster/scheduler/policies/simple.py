"""Queue orders with static keys: FIFO, strict priority, and the SJF/SRTF oracles."""

from __future__ import annotations

import math

from aicluster.core import Job
from aicluster.scheduler.entries import PendingEntry, RunningEntry
from aicluster.scheduler.policies.base import QueuePolicy, register

__all__ = ["FifoPolicy", "PriorityPolicy", "SjfPolicy", "SrtfPolicy", "job_length"]


class FifoPolicy(QueuePolicy):
    """First come, first served by submission time."""

    name = "fifo"

    def key(self, entry: PendingEntry, now: float) -> tuple[float, ...]:
        return (entry.job.submit_time,)


class PriorityPolicy(QueuePolicy):
    """Highest priority first, FIFO within a priority."""

    name = "priority"

    def key(self, entry: PendingEntry, now: float) -> tuple[float, ...]:
        return (-entry.job.priority, entry.job.submit_time)


def job_length(job: Job) -> float:
    """The true duration where the simulator knows it, else the user's estimate, else unknown."""
    if job.true_duration is not None:
        return job.true_duration
    return job.duration_estimate if job.duration_estimate is not None else math.inf


class SjfPolicy(QueuePolicy):
    """Shortest job first (oracle: reads true durations in simulation)."""

    name = "sjf"

    def key(self, entry: PendingEntry, now: float) -> tuple[float, ...]:
        return (job_length(entry.job), entry.job.submit_time)


class SrtfPolicy(QueuePolicy):
    """Shortest remaining time first, preemptive (oracle)."""

    name = "srtf"
    preemptive = True

    def key(self, entry: PendingEntry, now: float) -> tuple[float, ...]:
        return (max(0.0, job_length(entry.job) - entry.executed_seconds), entry.job.submit_time)

    def may_preempt(self, entry: PendingEntry, victim: RunningEntry, now: float) -> bool:
        # Lanes are sorted by remaining time, so once a job here cannot preempt, none behind can.
        return entry.key[0] < job_length(victim.job) - victim.executed(now)

    def victim_rank(self, victim: RunningEntry, now: float) -> tuple[float, ...]:
        left = job_length(victim.job) - victim.executed(now)
        return (-left, victim.lost_work(now))


register(FifoPolicy)
register(PriorityPolicy)
register(SjfPolicy)
register(SrtfPolicy)
