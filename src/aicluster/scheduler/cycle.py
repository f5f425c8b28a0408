"""One scheduling cycle: ``schedule(snapshot, config) -> Plan``.

For each pending job in policy order: admission (quota and borrowing), placement, and if it does
not fit, preemption; the first job blocked by capacity takes an EASY-backfill reservation (or,
without backfill, stops the cycle). Every job examined gets a reason (its words: :mod:`.reasons`);
lanes whose head failed are skipped whole, which keeps a cycle's cost proportional to the
decisions it makes.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field

from aicluster.core import (
    Admit,
    Job,
    PendingCode,
    PendingReason,
    Placement,
    Plan,
    Preempt,
)
from aicluster.scheduler.admission import Admission
from aicluster.scheduler.backfill import Reservation, reserve
from aicluster.scheduler.budgets import within_budgets
from aicluster.scheduler.config import SchedulerConfig
from aicluster.scheduler.early_stop import nothing_fits, only_reserved_free
from aicluster.scheduler.entries import PendingEntry, job_shape
from aicluster.scheduler.locality import applies
from aicluster.scheduler.memo import CycleMemo
from aicluster.scheduler.placement import PlacementFailure, find_placement
from aicluster.scheduler.policies.base import Candidate, Ordering
from aicluster.scheduler.preemption import PreemptionContext, find_victims, preemption_possible
from aicluster.scheduler.preemption.candidates import protections
from aicluster.scheduler.reasons import (
    admitted,
    behind_reservation,
    by_default,
    explain_rest,
    preempted,
    resuming,
)
from aicluster.scheduler.shortcuts import shortcuts_for
from aicluster.scheduler.state import Snapshot

__all__ = ["schedule"]


def schedule(
    snapshot: Snapshot, config: SchedulerConfig | None = None, *, hold: bool = False
) -> Plan:
    """Decide admissions, placements and preemptions for one cycle. Pure: the snapshot's state
    is left exactly as found (tentative allocations are rolled back); deterministic.

    ``config`` defaults to the state's own; it must name the same queue policy the state was
    built with (the state keeps its queue sorted by that policy).

    Shortcut (``hold``, with ``config.shortcuts``; the simulator asks for it): where the cycle's
    tentative changes were exactly its admissions' allocations and it preempts nothing, the
    index keeps them instead of rolling them back, and ``plan.held`` tells the caller to start
    the admissions without allocating again (``effects.admit(..., allocated=True)``). The index
    ends as rolling back and allocating again would leave it (``FreeIndex.holds_exactly``).
    """
    config = config or snapshot.state.config
    if config.queue != snapshot.state.policy.name:
        raise ValueError(
            f"the state is ordered by {snapshot.state.policy.name!r}, not {config.queue!r}"
        )
    return _Cycle(snapshot, config, hold=hold).run()


@dataclass
class _Cycle:
    snapshot: Snapshot
    config: SchedulerConfig
    hold: bool = False
    plan: Plan = field(default_factory=Plan)
    reservation: Reservation | None = None
    blocked_by: str | None = None
    preempted: set[str] = field(default_factory=set)
    lane_reasons: dict[int, PendingReason] = field(default_factory=dict)
    admitted_ends: dict[int, float] = field(default_factory=dict)
    no_more_preemption: bool = False
    # Shortcut: what the cycle remembers (out of the decisions' way).
    memo: CycleMemo = field(default_factory=CycleMemo)

    def __post_init__(self) -> None:
        self.state = self.snapshot.state
        self.index = self.state.index
        self.now = self.snapshot.now
        self.can_preempt = preemption_possible(self.state)
        self.admission = Admission(self.state)
        self.quotas_active = self.admission.quotas_active
        # The victim searches' shared view: the same collections the cycle updates.
        self.shortcuts = shortcuts_for(self.state.policy, self.config.shortcuts)
        self.preemption: PreemptionContext | None = None  # made by the first victim search

    def _preemption_context(self) -> PreemptionContext:
        """The victim searches' shared view: the same collections the cycle updates."""
        if self.preemption is None:
            self.preemption = PreemptionContext(
                self.state,
                self.now,
                self.shortcuts,
                self.preempted,
                self.admission.usage_delta,
                self.memo.victim_failures,
                self.memo.victim_lists,
            )
        return self.preemption

    def run(self) -> Plan:
        section = self.index.tentative()
        with section:
            ordering = self.state.policy.ordering(self.snapshot)
            while (candidate := ordering.pop()) is not None:
                if self._exhausted(self.state.pending[candidate.job_id]):
                    ordering.put_back(candidate)
                    break
                self._consider(candidate, ordering)
            default = by_default(self.blocked_by, self.index, self.state.power, self.now)
            if self.config.explain:
                explain_rest(ordering, self.plan.pending, self.lane_reasons, default)
            self.plan.default_reason = default
            section.keep = self.plan.held = self._holds()
        self.plan.next_wakeup = self.state.next_wakeup(self.now)
        held = self.preemption.held_until if self.preemption is not None else math.inf
        if held < math.inf:  # a protection held a victim back: the cycle runs again then
            self.plan.protected_until = held
            wakeup = self.plan.next_wakeup
            self.plan.next_wakeup = held if wakeup is None else min(wakeup, held)
        return self.plan

    def _holds(self) -> bool:
        """Shortcut (see :func:`schedule`): whether the index may keep this cycle's changes."""
        if not self.hold or not self.shortcuts.enabled or self.plan.preemptions:
            return False
        return self.index.holds_exactly([admit.placement.slots for admit in self.plan.admissions])

    def _exhausted(self, entry: PendingEntry) -> bool:
        if self.blocked_by is not None:
            return True
        if self.can_preempt and not self._preemption_over(entry):
            return False
        if not any(self.index.free_by_type.values()) and not self.state.pending_without_gpus:
            return True
        # Shortcut: without reasons to give, stop once every later job would only wait: every
        # free GPU is held for the blocked head and no job may use it (its start is unknown), or
        # no shape of job in the queue fits what is free outside the reservation.
        if self.config.explain or not self.shortcuts.enabled:
            return False
        reservation = self.reservation
        # Speed-up (asked of every candidate): both tests need a reservation of unknown start.
        if reservation is None or reservation.start != math.inf:
            return False
        return only_reserved_free(self) or nothing_fits(self)

    def _preemption_over(self, entry: PendingEntry) -> bool:
        """Whether neither ``entry`` nor any job after it in this cycle may preempt: then the
        rules for a cycle without preemption apply to the rest (a job that can neither be placed
        nor preempt only waits). Reclaim and priority rights are judged for the whole queue, the
        policy's own right by the policy (see ``QueuePolicy.preemption_over``)."""
        if self.no_more_preemption:
            return True
        state = self.state
        if self.quotas_active or not self.shortcuts.preemption_over(entry, state):
            return False
        priorities = state.pending_priorities
        if priorities and state.by_priority and max(priorities) > min(state.by_priority):
            return False
        self.no_more_preemption = True  # the running jobs do not change during a cycle
        return True

    def _consider(self, candidate: Candidate, ordering: Ordering) -> None:
        entry = self.state.pending[candidate.job_id]
        job = entry.job
        self.plan.examined += 1
        types, refusal = self.admission.admissible_types(job, self.types_for(job)[0])
        if refusal is not None:
            self._wait(candidate, ordering, refusal)
            return
        outcome = self.place(job, types, entry.lane[1])
        if isinstance(outcome, Placement):
            self._admit(entry, outcome, backfilled=self.reservation is not None)
            ordering.finish(candidate, placed=True, drop_lane=False)
            return
        if job.elastic and self._admit_smaller(entry, types):
            ordering.finish(candidate, placed=True, drop_lane=False)
            return
        # A job without GPUs does not preempt: victims are searched by the GPUs they free.
        preempts = self.can_preempt and not self.no_more_preemption and job.total_gpus > 0
        if preempts and self._preempt_for(entry, types):
            ordering.finish(candidate, placed=True, drop_lane=False)
            return
        reason = self._blocked(entry, types, outcome)
        if preempts and self.config.explain and self.config.protects:
            reason = self._protected(entry, types, reason)
        self._wait(candidate, ordering, reason)

    # -- admission --------------------------------------------------------------------------

    def types_for(self, job: Job) -> tuple[list[str], tuple[str, ...]]:
        """The GPU types ``job`` may use, as a list and as a tuple (a key)."""
        found = self.memo.types_by_gpu_type.get(job.gpu_type)  # (inlined: asked twice a job)
        return found if found is not None else self.memo.types_for(self.index, job)

    # -- placement --------------------------------------------------------------------------

    def place(
        self, job: Job, types: list[str], shape: Hashable | None = None
    ) -> Placement | PlacementFailure:
        """``shape`` is ``job_shape(job)`` where the caller has it (a pending entry's lane)."""
        reservation = self.reservation
        admits = reservation is not None and reservation.admits(job, self.now)
        if not self.shortcuts.enabled or (self.index.locality and applies(self.index, job)):
            # (a job whose data decides between placements shares no placement by shape)
            return self._search(job, types, admits)
        # Shortcut: the search's answer remembered by what it depends on (this cycle's index
        # version, or across cycles its content hash).
        listed = self.types_for(job)
        key_types = listed[1] if types is listed[0] else tuple(types)
        key = (job_shape(job) if shape is None else shape, key_types, id(reservation), admits)
        version, memo = self.index.version, self.memo
        # This cycle's answer at this index version (one lookup per candidate, the hottest).
        failed = memo.failures.get(key)
        if failed is not None and failed[0] == version:
            return failed[1]
        fits = memo.placements.get(key)
        if fits is not None and fits[0] == version:
            return fits[1]
        lasting = self._lasting_key(key, reservation)
        known = self.memo.across_cycles(key, self.index, lasting)
        if known is not None:
            return known
        found = self._search(job, types, admits)
        # (under power budgets the search allocated tentatively: a placement found is not kept;
        # a random placement is drawn for its job and is not another job's to take)
        keep = self.state.budgets is None and self.index.random_seed is None
        self.memo.remember(key, self.index, lasting, found, keep)
        return found

    def _lasting_key(
        self, key: tuple[Hashable, ...], reservation: Reservation | None
    ) -> tuple[Hashable, ...] | None:
        """The key of a placement failure across cycles: the search's inputs (shape, types,
        the reserved nodes, whether the job may use them) and the index's content hash. A
        failure depends on how many GPUs are free where, never on the order the buckets list
        nodes in, and the search changes nothing, so answering from memory decides alike. None
        where the search is not such a function: under power budgets it allocates tentatively
        (which reorders buckets), and on clusters with NVLink splits the hash is not kept."""
        content = self.index.content_hash
        if content is None or self.state.budgets is not None:
            return None
        nodes = None if reservation is None else reservation.nodes
        return ("placement", key[0], key[1], nodes, key[3], self.config.explain, content)

    def _search(self, job: Job, types: list[str], admits: bool) -> Placement | PlacementFailure:
        reservation = self.reservation
        exclude = reservation.nodes if reservation is not None else frozenset()
        explain = self.config.explain  # without it, no one reads a failure's details
        found = find_placement(self.index, job, exclude=exclude, types=types, explain=explain)
        if isinstance(found, PlacementFailure) and admits:
            exclude = frozenset()
            found = find_placement(self.index, job, types=types, explain=explain)
        budgets = self.state.budgets
        if budgets is not None and isinstance(found, Placement):
            return within_budgets(budgets, job, found, exclude, types)
        return found

    def _admit_smaller(self, entry: PendingEntry, types: list[str]) -> bool:
        """Start an elastic job on as many workers as fit now (at least its min_workers); it
        grows back when capacity returns (the control loop restarts it at full size)."""
        for workers in entry.job.smaller_sizes():
            smaller = entry.job.resized(workers)
            if not self.admission.within_borrow_limits(smaller, types):
                continue
            found = self.place(smaller, types)
            if isinstance(found, Placement):
                self._admit(entry, found, backfilled=self.reservation is not None, job=smaller)
                return True
        return False

    def _admit(
        self,
        entry: PendingEntry,
        placement: Placement,
        *,
        backfilled: bool,
        job: Job | None = None,
    ) -> None:
        job = job or entry.job
        index = self.index
        index.allocate(placement.slots)
        gpu_type = index.nodes[index.node_id[placement.slots[0].node]].gpu_type
        borrowed = self.admission.borrow_needed(job, gpu_type)
        self.admission.count(job, gpu_type, 1)
        estimate = job.duration_estimate
        end = math.inf if estimate is None else self.now + estimate - entry.executed_seconds
        ends, now = self.admitted_ends, self.now
        for slot in placement.slots:  # (a node holding several slots is set alike each time)
            node = index.node_id[slot.node]
            ends[node] = max(ends.get(node, now), end)
        workers = job.workers if job.workers != entry.job.workers else None
        # Without explain no one reads the reason (the simulator): its text is not built.
        why = ""
        if self.config.explain:
            why = admitted(index, entry, job, placement, gpu_type, borrowed, backfilled)
        self.plan.admissions.append(Admit(job.id, placement, why, borrowed, backfilled, workers))

    # -- preemption -------------------------------------------------------------------------

    def _preempt_for(self, entry: PendingEntry, types: list[str]) -> bool:
        before = self.index.version
        victims = find_victims(self._preemption_context(), entry, types)
        if victims is None:
            self.memo.carry_over(before, self.index.version)
            return False
        budgets = self.state.budgets
        if budgets is not None and budgets.check(victims.placement.slots) is not None:
            for victim in victims.jobs:  # (their GPUs were released tentatively: back)
                self.index.allocate(victim.placement.slots)
            return False
        job = entry.job
        for victim in victims.jobs:
            kind = victims.kinds[victim.job.id]
            self.preempted.add(victim.job.id)
            self.admission.count(victim.job, victim.gpu_type, -1)
            reason = preempted(kind, job, self.config.queue)
            self.plan.preemptions.append(Preempt(victim.job.id, reason, kind, job.id))
        self._admit(entry, victims.placement, backfilled=False)
        return True

    def _protected(
        self, entry: PendingEntry, types: list[str], reason: PendingReason
    ) -> PendingReason:
        """``reason`` and, where protected runs (:mod:`.protection`) are among the job's
        candidates, the first of them to lapse."""
        if reason.code in (PendingCode.INFEASIBLE, PendingCode.POWER_CAP):
            return reason
        found = protections(self._preemption_context(), entry, types)
        if not found:
            return reason
        first = min(found, key=lambda protection: (protection.until, protection.job_id))
        others = len({protection.job_id for protection in found}) - 1
        message = f"{reason.message}; {first.describe(self.config, self.now, others)}"
        return PendingReason(reason.code, message, reason.blocking_job)

    # -- waiting ----------------------------------------------------------------------------

    def _blocked(
        self, entry: PendingEntry, types: list[str], failure: PlacementFailure
    ) -> PendingReason:
        job = entry.job
        if failure.code in (PendingCode.INFEASIBLE, PendingCode.POWER_CAP):
            return PendingReason(failure.code, failure.message)
        if self.reservation is not None:
            return self._blocked_by_reservation(job, self.reservation)
        if self.config.backfill == "none":
            self.blocked_by = job.id
            return PendingReason(failure.code, f"head of the queue: {failure.message}")
        if not job.total_gpus:  # reservations hold GPUs: it waits without one
            return PendingReason(failure.code, failure.message)
        self.reservation = reserve(self.state, job, types, self.now, self.admitted_ends)
        if self.reservation is None:
            return PendingReason(failure.code, failure.message)
        return PendingReason(
            failure.code,
            f"head of the queue: {failure.message}; reserved "
            f"{len(self.reservation.nodes)} node(s) to start as soon as they drain",
        )

    def _blocked_by_reservation(self, job: Job, reservation: Reservation) -> PendingReason:
        # The reservation is made once a cycle, so jobs of one size share one reason.
        key = (job.total_gpus, job.duration_estimate is not None)
        reason = self.memo.reservation_reasons.get(key)
        if reason is None:
            reason = behind_reservation(job, reservation, self.index)
            self.memo.reservation_reasons[key] = reason
        return reason

    def _wait(self, candidate: Candidate, ordering: Ordering, reason: PendingReason) -> None:
        if self.state.power is not None and self.config.explain:
            job = self.state.pending[candidate.job_id].job
            if job.total_gpus:
                reason = resuming(self.state.power, job.gpu_type, reason, self.now)
        self.plan.pending[candidate.job_id] = reason
        # Jobs of one lane fail alike, except against a reservation with a known start: there a
        # later job with a shorter estimate may still fit before the head starts.
        timed = self.reservation is not None and not math.isinf(self.reservation.start)
        drop = not (timed and reason.code is PendingCode.RESERVATION)
        if drop and self.config.explain:  # read only when explaining the rest
            self.lane_reasons[id(ordering.lane_items(candidate))] = reason
        ordering.finish(candidate, placed=False, drop_lane=drop)
