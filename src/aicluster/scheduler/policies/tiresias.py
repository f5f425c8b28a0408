"""Tiresias: discretized two-dimensional least-attained-service (Gu et al., NSDI'19).

A job's attained service is GPUs × seconds run. Queue ``q`` holds jobs whose service lies between
thresholds ``q-1`` and ``q``; lower queues run first and may preempt jobs in higher ones; within a
queue jobs run in arrival order. A job waiting longer than ``promote_knob`` × its last run is
promoted to the top queue so it cannot starve; as in Tiresias, promotion restarts its attained
service, so once running it stays in the top queue until it earns its way down again (otherwise it
is demoted the moment it starts, preempted by the next promoted job within seconds, and promoted
jobs preempt one another in a loop that does no work).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable, Sequence

from aicluster.scheduler.policies.base import QueuePolicy, register
from aicluster.scheduler.state import PendingEntry, RunningEntry, SchedulerState

__all__ = ["TiresiasPolicy"]


class TiresiasPolicy(QueuePolicy):
    name = "tiresias"
    preemptive = True

    def queue_of(self, attained: float) -> int:
        return bisect_right(self.config.tiresias_thresholds, attained)

    def _promoted(self, entry: PendingEntry, now: float) -> bool:
        knob = self.config.tiresias_promote_knob
        waited = now - entry.enqueued_at
        return knob > 0 and entry.last_run_seconds > 0 and waited >= knob * entry.last_run_seconds

    def key(self, entry: PendingEntry, now: float) -> tuple[float, ...]:
        if self._promoted(entry, now):
            entry.attained_gpu_seconds = 0.0  # the service count restarts with the promotion
            return (0.0, entry.job.submit_time)
        return (float(self.queue_of(entry.attained_gpu_seconds)), entry.job.submit_time)

    def rekey_at(self, entry: PendingEntry) -> float | None:
        knob = self.config.tiresias_promote_knob
        if knob <= 0 or entry.last_run_seconds <= 0 or entry.key[0] == 0:
            return None
        return entry.enqueued_at + knob * entry.last_run_seconds

    def may_preempt(self, entry: PendingEntry, victim: RunningEntry, now: float) -> bool:
        return entry.key[0] < self.queue_of(victim.attained(now))

    def may_preempt_each(
        self, entry: PendingEntry, victims: Sequence[RunningEntry], now: float
    ) -> list[bool]:
        # may_preempt with RunningEntry.attained written out: the same float operations, and
        # max(a, b) as "b if b > a else a", which is what max returns (a hot path).
        thresholds, queue = self.config.tiresias_thresholds, entry.key[0]
        may = []
        for victim in victims:
            ran = now - victim.started_at
            attained = victim.attained_before + victim.job.total_gpus * (ran if ran > 0.0 else 0.0)
            may.append(queue < bisect_right(thresholds, attained))
        return may

    def preemption_over(self, entry: PendingEntry, state: SchedulerState) -> bool:
        # Lanes merge in key order, so later jobs sit in the same queue or a higher one; running
        # jobs are found by their class (their queue), and only a higher one may be preempted.
        return not state.by_class or entry.key[0] >= max(state.by_class)

    def preemption_key(self, entry: PendingEntry) -> Hashable | None:
        return entry.key[0]

    def victim_rank(self, victim: RunningEntry, now: float) -> tuple[float, ...]:
        return (-float(self.queue_of(victim.attained(now))), victim.lost_work(now))

    def victim_ranks(self, victims: Sequence[RunningEntry], now: float) -> list[tuple[float, ...]]:
        # victim_rank with RunningEntry.attained and .lost_work written out: the same float
        # operations in the same order, so the same values, with max(a, b) as "b if b > a else
        # a" and min(a, b) as "b if b < a else a", which is what they return (ranking is the
        # hottest path of a Tiresias replay).
        thresholds = self.config.tiresias_thresholds
        ranks: list[tuple[float, ...]] = []
        for victim in victims:
            started, job = victim.started_at, victim.job
            ran = now - started
            attained = victim.attained_before + job.total_gpus * (ran if ran > 0.0 else 0.0)
            latest = victim.last_checkpoint_at
            if started > latest:
                latest = started
            interval = job.checkpoint_interval
            if interval:
                periodic = started + (ran // interval) * interval
                if periodic > latest:
                    latest = periodic
            lost = now - (now if now < latest else latest)
            ranks.append((-float(bisect_right(thresholds, attained)), lost if lost > 0.0 else 0.0))
        return ranks

    def running_class(self, running: RunningEntry, now: float) -> int:
        return self.queue_of(running.attained(now))

    def class_may_be_preempted(self, entry: PendingEntry, running_class: int) -> bool:
        return entry.key[0] < running_class

    def preempts_whole_class(self, entry: PendingEntry, running_class: int) -> bool:
        # A running job's class is its queue when the class was given (at its start or a
        # refresh); attained service only grows with time, and so does the queue computed from
        # it (each float operation is monotone), so its queue now is at least its class.
        return entry.key[0] < running_class

    def running_wakeups(self, running: RunningEntry) -> list[float]:
        gpus = running.job.total_gpus
        if gpus <= 0:
            return []
        return [
            running.started_at + (threshold - running.attained_before) / gpus + 1e-6
            for threshold in self.config.tiresias_thresholds
            if threshold > running.attained_before
        ]


register(TiresiasPolicy)
