"""Tiresias: discretized two-dimensional least-attained-service (Gu et al., NSDI'19).

A job's attained service is GPUs × seconds run. Queue ``q`` holds jobs whose service lies between
thresholds ``q-1`` and ``q``; lower queues run first and may preempt jobs in higher ones; within a
queue jobs run in arrival order. A job waiting longer than ``promote_knob`` × its last run is
promoted to the top queue so it cannot starve; as in Tiresias, promotion restarts its attained
service, so once running it stays in the top queue until it earns its way down again (otherwise it
is demoted the moment it starts, preempted by the next promoted job within seconds, and promoted
jobs preempt one another in a loop that does no work).

The promotion guard has two parts. A job's last run counts as at least the minimum run time
(``preemption.min_runtime_s``) when its wait for promotion is measured, so a job stopped after a
moment (by its own tenant's priority, which the minimum does not hold back, or by a failure)
does not come back to the top queue after ``promote_knob`` moments and take GPUs from jobs that
have run far longer. And past a job's first ``promote_backoff_after`` requeues (8 by default),
the wait grows ``promote_backoff`` times (2 by default) with each further one: requeued for the
k-th time, a job waits knob × last run × backoff^max(0, k - after).

Why the second part: with a constant wait, a long job that is promoted, runs its minimum, is
demoted and preempted comes back every (1 + knob) × the minimum for as long as the cluster is
over capacity, and every return preempts another long job that later does the same. On Philly's
whole trace with the communication model on (its gangs slower when spread, so the load stays
above capacity for weeks) that churn never ended: 3.3 preemptions a job by job 45,000 and
154,636 GPU-hours lost (``bench/philly_preemption.py``, ``docs/benchmarks.md``). With the wait
growing, a job is requeued at most after + 1 + log_b(T / (knob × min_runtime_s)) times in a span
T (b the backoff), however long the overload lasts, so the promotions, and the preemptions they
cause, settle. The price: a job requeued many times waits longer for its starvation guard (it
still runs by its attained service, as every Tiresias job does). The first requeues are free of
it because most jobs have few, and the guard is what bounds their wait: growing the wait from
the first requeue on raised Philly's mean JCT by 10% (model off), from the ninth by 1.6%.

Demotion needs no guard: a demoted run is protected from the policy's right until it is
``min_runtime_s`` old (:mod:`aicluster.scheduler.protection`).
"""

from __future__ import annotations

from bisect import bisect_right

from aicluster.scheduler.entries import PendingEntry, RunningEntry
from aicluster.scheduler.policies.base import QueuePolicy, register

__all__ = ["TiresiasPolicy"]

_MAX_GROWTHS = 64


class TiresiasPolicy(QueuePolicy):
    name = "tiresias"
    preemptive = True

    def queue_of(self, attained: float) -> int:
        return bisect_right(self.config.tiresias_thresholds, attained)

    def _promotion_wait(self, entry: PendingEntry) -> float:
        """How long a job waits to be promoted: knob × its last run (at least the minimum run
        time), × backoff for each requeue past the first ``backoff_after`` (module docstring)."""
        config = self.config
        last_run = max(entry.last_run_seconds, config.min_runtime_s)
        later = max(0, entry.restarts - config.tiresias_promote_backoff_after)
        # At most 64 doublings (or 16-fold growths, 2^256): already longer than any trace, and
        # a float power past about 2^1024 raises OverflowError instead of growing.
        backoff = config.tiresias_promote_backoff ** min(later, _MAX_GROWTHS)
        return config.tiresias_promote_knob * last_run * backoff

    def _promoted(self, entry: PendingEntry, now: float) -> bool:
        knob = self.config.tiresias_promote_knob
        waited = now - entry.enqueued_at
        return knob > 0 and entry.last_run_seconds > 0 and waited >= self._promotion_wait(entry)

    def restarts_service(self, entry: PendingEntry, now: float) -> bool:
        return self._promoted(entry, now)  # the service count restarts with the promotion

    def key(self, entry: PendingEntry, now: float) -> tuple[float, ...]:
        if self._promoted(entry, now):
            return (0.0, entry.job.submit_time)
        return (float(self.queue_of(entry.attained_gpu_seconds)), entry.job.submit_time)

    def rekey_at(self, entry: PendingEntry) -> float | None:
        knob = self.config.tiresias_promote_knob
        if knob <= 0 or entry.last_run_seconds <= 0 or entry.key[0] == 0:
            return None
        return entry.enqueued_at + self._promotion_wait(entry)

    def may_preempt(self, entry: PendingEntry, victim: RunningEntry, now: float) -> bool:
        return entry.key[0] < self.queue_of(victim.attained(now))

    def victim_rank(self, victim: RunningEntry, now: float) -> tuple[float, ...]:
        return (-float(self.queue_of(victim.attained(now))), victim.lost_work(now))

    def running_class(self, running: RunningEntry, now: float) -> int:
        return self.queue_of(running.attained(now))

    def class_may_be_preempted(self, entry: PendingEntry, running_class: int) -> bool:
        return entry.key[0] < running_class

    def next_running_wakeup(self, running: RunningEntry, after: float) -> float | None:
        gpus = running.job.total_gpus
        if gpus <= 0:
            return None
        for threshold in self.config.tiresias_thresholds:
            if threshold > running.attained_before:
                when = running.started_at + (threshold - running.attained_before) / gpus + 1e-6
                if when > after:
                    return when
        return None


register(TiresiasPolicy)
