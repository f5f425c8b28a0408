"""Anti-thrashing: the runs that may not be preempted yet (``preemption.min_runtime_s`` and
``preemption.cooldown_s``), and the words a waiting job gets when one holds it back.

- *Minimum run time*: a run younger than ``min_runtime_s`` is not preempted by another
  tenant's job (by reclaim or priority) nor by the policy's own right (SRTF, Tiresias). Its own
  tenant's higher priority still preempts it: a tenant orders its own work, and that right
  only ever goes up the tenant's priorities, so it cannot bounce a job back and forth.
- *Cool-down*: a run of a job that has been preempted before is not preempted by any right, its
  own tenant's priority included, until it is ``cooldown_s`` old: no job is preempted twice
  within ``cooldown_s`` of run time, whoever asks.

A protection lapses at the run's start plus the larger of the two, so a job that waits only
for protected victims waits at most ``max(min_runtime_s, cooldown_s)`` past the start of the
youngest of them; a cycle in which a protection held a victim back says when the first such
lapses (``Plan.protected_until``, also in ``Plan.next_wakeup``), and the simulator runs a cycle
then (the live loop cycles every tick).
Protections only remove victims from the rights, so the termination argument
(:mod:`aicluster.scheduler.preemption`) holds with them: every preemption still raises its
measure, and with the clock stopped the protected set does not change.

Both are measured from the run's ``started_at``, which the state takes from the loop that
started it: the simulator's clock, or live the store's start time (kept over a restart of the
control plane), and the job's ``preempted_at`` travels with its progress (``jobs.progress``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aicluster.scheduler.config import SchedulerConfig
from aicluster.scheduler.entries import RunningEntry

__all__ = ["Protection", "protected_until"]


def protected_until(config: SchedulerConfig, victim: RunningEntry, own_priority: bool) -> float:
    """When ``victim``'s protection against a preemptor lapses (-inf: it has none);
    ``own_priority``: the preemptor is of the victim's tenant and preempts by priority."""
    until = -math.inf
    if config.min_runtime_s > 0 and not own_priority:
        until = victim.started_at + config.min_runtime_s
    if config.cooldown_s > 0 and victim.preempted_at > -math.inf:
        until = max(until, victim.started_at + config.cooldown_s)
    return until


@dataclass(frozen=True, slots=True)
class Protection:
    """A candidate victim a waiting job may not take yet: its job, and the protection's
    length and end."""

    job_id: str
    started_at: float
    until: float

    def describe(self, config: SchedulerConfig, now: float, others: int = 0) -> str:
        """``protected: job j ran 4 min of its 10 min minimum`` (or of its cool-down)."""
        length = self.until - self.started_at
        which = "minimum" if length == config.min_runtime_s else "cool-down after a preemption"
        ran = max(0.0, now - self.started_at)
        more = f" (and {others} more protected job(s))" if others else ""
        return f"protected: job {self.job_id} ran {_span(ran)} of its {_span(length)} {which}{more}"


def _span(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
