"""The scheduler's shortcuts: one switchable layer around its plain decisions.

The plain path decides each thing once, as it is defined: a policy's ``may_preempt`` and
``victim_rank`` asked job by job, every placement and victim search run in full. A shortcut
answers the same question faster: in bulk, from a memo, or by proving that the full search
cannot change the outcome. Each one must give exactly the plain answer. With
``SchedulerConfig.shortcuts`` off (``scheduler.shortcuts: false`` in the configuration file) the
scheduler runs the plain path; a property test replays random scenarios both ways and compares
every decision and the free-capacity index's layout.

Here live the policies' shortcuts, wrapped around a plain :class:`QueuePolicy` (as Nomad's
``FeasibilityWrapper`` wraps a plain checker). The cycle's and the victim search's own
shortcuts stay where they stand, each marked ``Shortcut:`` and asked through
:attr:`PolicyShortcuts.enabled`.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable, Sequence

from aicluster.scheduler.entries import PendingEntry, RunningEntry
from aicluster.scheduler.policies.base import QueuePolicy
from aicluster.scheduler.state import SchedulerState

__all__ = ["PlainPolicy", "PolicyShortcuts", "shortcuts_for"]


class PlainPolicy:
    """The plain answers, one job at a time: what every shortcut must equal (and what runs with
    shortcuts off)."""

    enabled = False

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy

    def may_preempt_each(
        self, entry: PendingEntry, victims: Sequence[RunningEntry], now: float
    ) -> list[bool]:
        """``policy.may_preempt`` for each victim."""
        return [self.policy.may_preempt(entry, victim, now) for victim in victims]

    def victim_ranks(self, victims: Sequence[RunningEntry], now: float) -> list[tuple[float, ...]]:
        """``policy.victim_rank`` of each victim."""
        return [self.policy.victim_rank(victim, now) for victim in victims]

    def preempts_whole_class(self, entry: PendingEntry, running_class: int) -> bool:
        """True only where ``may_preempt`` is known True for ``entry`` and every running job of
        ``running_class`` (then it is not asked job by job). Plainly: never known."""
        return False

    def preemption_over(self, entry: PendingEntry, state: SchedulerState) -> bool:
        """True when neither ``entry`` nor any job the ordering yields after it in this cycle
        may preempt by the policy's own right. Plainly: never known."""
        return False

    def preemption_key(self, entry: PendingEntry) -> Hashable | None:
        """A value through which alone the policy's preemption rights depend on ``entry`` (jobs
        with equal keys and priorities may preempt the same running jobs, so a cycle lists them
        once); None where it cannot say (plainly: never)."""
        return None


class PolicyShortcuts(PlainPolicy):
    """What every policy may skip: a policy that never preempts by its own right is over with
    preemption at once."""

    enabled = True

    def preemption_over(self, entry: PendingEntry, state: SchedulerState) -> bool:
        return not self.policy.preemptive


class SrtfShortcuts(PolicyShortcuts):
    def preemption_key(self, entry: PendingEntry) -> Hashable | None:
        return entry.key[0]  # remaining time: may_preempt reads nothing else of the entry


class TiresiasShortcuts(PolicyShortcuts):
    """Tiresias' rights and victim ranks in bulk (a replay's hottest path)."""

    def may_preempt_each(
        self, entry: PendingEntry, victims: Sequence[RunningEntry], now: float
    ) -> list[bool]:
        # Shortcut: may_preempt with RunningEntry.attained written out: the same float
        # operations, and max(a, b) as "b if b > a else a", which is what max returns.
        thresholds, queue = self.policy.config.tiresias_thresholds, entry.key[0]
        may = []
        for victim in victims:
            ran = now - victim.started_at
            attained = victim.attained_before + victim.job.total_gpus * (ran if ran > 0.0 else 0.0)
            may.append(queue < bisect_right(thresholds, attained))
        return may

    def victim_ranks(self, victims: Sequence[RunningEntry], now: float) -> list[tuple[float, ...]]:
        # Shortcut: victim_rank with RunningEntry.attained and .lost_work written out: the same
        # float operations in the same order, so the same values, with max(a, b) as "b if b > a
        # else a" and min(a, b) as "b if b < a else a", which is what they return.
        thresholds = self.policy.config.tiresias_thresholds
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

    def preempts_whole_class(self, entry: PendingEntry, running_class: int) -> bool:
        # A running job's class is its queue when the class was given (at its start or a
        # refresh); attained service only grows with time, and so does the queue computed from
        # it (each float operation is monotone), so its queue now is at least its class.
        return entry.key[0] < running_class

    def preemption_over(self, entry: PendingEntry, state: SchedulerState) -> bool:
        # Lanes merge in key order, so later jobs sit in the same queue or a higher one; running
        # jobs are found by their class (their queue), and only a higher one may be preempted.
        return not state.by_class or entry.key[0] >= max(state.by_class)

    def preemption_key(self, entry: PendingEntry) -> Hashable | None:
        return entry.key[0]  # the queue: may_preempt and class_may_be_preempted read only it


_BY_POLICY: dict[str, type[PolicyShortcuts]] = {
    "srtf": SrtfShortcuts,
    "tiresias": TiresiasShortcuts,
}


_latest: list[PlainPolicy] = []  # the last one made: every cycle asks again for the same


def shortcuts_for(policy: QueuePolicy, enabled: bool) -> PlainPolicy:
    """The policy's shortcuts, or its plain answers when ``enabled`` is False."""
    if _latest and _latest[0].policy is policy and _latest[0].enabled == enabled:
        return _latest[0]  # (stateless, so shared: a replay runs a cycle per event)
    made = _BY_POLICY.get(policy.name, PolicyShortcuts)(policy) if enabled else PlainPolicy(policy)
    _latest[:] = [made]
    return made
