"""One scheduling cycle: ``schedule(snapshot, config) -> Plan``.

For each pending job in policy order: admission (quota and borrowing), placement, and if it does
not fit, preemption; the first job blocked by capacity takes an EASY-backfill reservation (or,
without backfill, stops the cycle). Every job examined gets a reason; lanes whose head failed are
skipped whole, which keeps a cycle's cost proportional to the decisions it makes.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field

from aicluster.core import (
    Admit,
    DomainLevel,
    Job,
    PendingCode,
    PendingReason,
    Placement,
    Plan,
    Preempt,
    VictimKind,
)
from aicluster.scheduler.backfill import Reservation, reserve
from aicluster.scheduler.config import SchedulerConfig
from aicluster.scheduler.placement import PlacementFailure, find_placement, gpu_types_for
from aicluster.scheduler.policies.base import Candidate, Ordering
from aicluster.scheduler.preemption import (
    CandidateMemo,
    PreemptionContext,
    find_victims,
    preemption_possible,
)
from aicluster.scheduler.shortcuts import shortcuts_for
from aicluster.scheduler.state import PendingEntry, Snapshot, job_shape

__all__ = ["schedule"]


def schedule(snapshot: Snapshot, config: SchedulerConfig | None = None) -> Plan:
    """Decide admissions, placements and preemptions for one cycle. Pure: the snapshot's state
    is left exactly as found (tentative allocations are rolled back); deterministic.

    ``config`` defaults to the state's own; it must name the same queue policy the state was
    built with (the state keeps its queue sorted by that policy).
    """
    config = config or snapshot.state.config
    if config.queue != snapshot.state.policy.name:
        raise ValueError(
            f"the state is ordered by {snapshot.state.policy.name!r}, not {config.queue!r}"
        )
    return _Cycle(snapshot, config).run()


@dataclass
class _Cycle:
    snapshot: Snapshot
    config: SchedulerConfig
    plan: Plan = field(default_factory=Plan)
    usage_delta: dict[tuple[str, str], int] = field(default_factory=dict)
    # CPUs and memory (milli-CPUs, MiB) the cycle's admissions and preemptions add per tenant.
    host_delta: dict[str, tuple[int, int]] = field(default_factory=dict)
    reservation: Reservation | None = None
    blocked_by: str | None = None
    # Placement failures by job shape, valid while the index stays at the version they saw:
    # lanes of other tenants with the same shape then fail alike without a second search.
    failures: dict[tuple[Hashable, ...], tuple[int, PlacementFailure]] = field(default_factory=dict)
    # Placements found, valid at exactly the version they saw (unlike failures, not carried
    # over a victim search's round trip: that reorders the buckets best fit breaks ties by).
    placements: dict[tuple[Hashable, ...], tuple[int, Placement]] = field(default_factory=dict)
    victim_failures: dict[tuple[object, ...], int] = field(default_factory=dict)
    victim_lists: CandidateMemo = field(default_factory=dict)
    preempted: set[str] = field(default_factory=set)
    lane_reasons: dict[int, PendingReason] = field(default_factory=dict)
    admitted_ends: dict[int, float] = field(default_factory=dict)
    # Per-cycle memos of values many candidates ask for alike (the cycle is the hot path).
    types_by_gpu_type: dict[str, tuple[list[str], tuple[str, ...]]] = field(default_factory=dict)
    reserved_free_at: tuple[int, bool] = (-1, False)  # (index version, answer)
    nothing_fits_at: tuple[int, bool] = (-1, False)
    reservation_reasons: dict[tuple[int, bool], PendingReason] = field(default_factory=dict)
    no_more_preemption: bool = False
    shape_heads: list[tuple[Hashable, Job]] | None = None

    def __post_init__(self) -> None:
        self.state = self.snapshot.state
        self.index = self.state.index
        self.now = self.snapshot.now
        self.can_preempt = preemption_possible(self.state)
        self.quotas_active = self.state.quotas_active  # tenants do not change during a cycle
        self.host_quotas_active = self.state.host_quotas_active
        # The victim searches' shared view: the same collections the cycle updates.
        self.shortcuts = shortcuts_for(self.state.policy, self.config.shortcuts)
        self.preemption = PreemptionContext(
            self.state,
            self.now,
            self.shortcuts,
            self.preempted,
            self.usage_delta,
            self.victim_failures,
            self.victim_lists,
        )

    def run(self) -> Plan:
        with self.index.tentative():
            ordering = self.state.policy.ordering(self.snapshot)
            while (candidate := ordering.pop()) is not None:
                if self._exhausted(self.state.pending[candidate.job_id]):
                    ordering.put_back(candidate)
                    break
                self._consider(candidate, ordering)
            if self.config.explain:
                self._explain_rest(ordering)
            self.plan.default_reason = self._default_reason()
        self.plan.next_wakeup = self.state.next_wakeup(self.now)
        return self.plan

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
        return self._only_reserved_free() or self._nothing_fits()

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

    def _only_reserved_free(self) -> bool:
        reservation = self.reservation
        if reservation is None or not math.isinf(reservation.start):
            return False
        if self.state.pending_without_gpus:  # they need no GPU: the free ones decide nothing
            return False
        index = self.index
        version, answer = self.reserved_free_at
        if version == index.version:  # the reservation is fixed once made: only GPUs change
            return answer
        reserved = sum(index.free[i] for i in reservation.nodes if index.schedulable[i])
        answer = reserved == sum(index.free_by_type.values())
        self.reserved_free_at = (index.version, answer)
        return answer

    def _nothing_fits(self) -> bool:
        """Whether no queued job of any shape can be placed outside the reservation (one of
        unknown start, which admits no one onto its nodes): then, with preemption over, every
        later job only waits. Jobs of one shape fit alike (the placement memo's premise), and
        the types a job is admitted to are among those its GPU type allows, so one search per
        shape over every allowed type decides for all, and a shape no easier to fit than one
        that failed is not searched (:func:`_no_easier`); elastic jobs (which may fit smaller)
        and a known start (short jobs may use reserved nodes) keep the cycle going."""
        reservation, state = self.reservation, self.state
        if reservation is None or not math.isinf(reservation.start) or state.pending_elastic:
            return False
        if self.config.power_cap_watts is not None:  # its check allocates tentatively
            return False
        version, answer = self.nothing_fits_at
        if version == self.index.version:
            return answer
        answer = True
        outside: dict[tuple[str, ...], int] = {}  # free GPUs off the reserved nodes, by types
        failed: list[Job] = []
        for shape, job in self._shape_heads():
            types, key = self._types_for(job)  # the smallest is likeliest to fit: tried first
            if not types:
                continue
            free = outside.get(key)
            if free is None:
                free = outside[key] = self._free_outside(reservation.nodes, types)
            if job.total_gpus > free:  # find_placement's first test: it would fail at once
                continue
            if any(_no_easier(job, smaller) for smaller in failed):
                continue
            if isinstance(self._place(job, types, shape), Placement):
                answer = False
                break
            failed.append(job)
        self.nothing_fits_at = (self.index.version, answer)
        return answer

    def _free_outside(self, reserved: frozenset[int], types: list[str]) -> int:
        """Free GPUs of ``types`` off the ``reserved`` nodes (what find_placement counts)."""
        index = self.index
        free, schedulable, nodes = index.free, index.schedulable, index.nodes
        held = sum(free[i] for i in reserved if schedulable[i] and nodes[i].gpu_type in types)
        return sum(index.free_by_type[t] for t in types) - held

    def _shape_heads(self) -> list[tuple[Hashable, Job]]:
        """One queued job per shape, smallest first (the queue does not change during a cycle,
        so this is listed once)."""
        if self.shape_heads is None:
            state = self.state
            heads: dict[Hashable, Job] = {}
            for lane, items in state.lanes.items():
                if lane[1] not in heads:
                    heads[lane[1]] = state.pending[items[0][2]].job
            self.shape_heads = sorted(heads.items(), key=lambda item: item[1].total_gpus)
        return self.shape_heads

    def _consider(self, candidate: Candidate, ordering: Ordering) -> None:
        entry = self.state.pending[candidate.job_id]
        job = entry.job
        self.plan.examined += 1
        types, refusal = self._admissible_types(job)
        if refusal is not None:
            self._wait(candidate, ordering, refusal)
            return
        outcome = self._place(job, types, entry.lane[1])
        if isinstance(outcome, Placement):
            self._admit(entry, outcome, backfilled=self.reservation is not None)
            ordering.finish(candidate, placed=True, drop_lane=False)
            return
        if job.elastic and self._admit_smaller(entry, types):
            ordering.finish(candidate, placed=True, drop_lane=False)
            return
        # A job without GPUs does not preempt: victims are searched by the GPUs they free.
        if (
            self.can_preempt
            and not self.no_more_preemption
            and job.total_gpus
            and self._preempt_for(entry, types)
        ):
            ordering.finish(candidate, placed=True, drop_lane=False)
            return
        self._wait(candidate, ordering, self._blocked(entry, types, outcome))

    # -- admission --------------------------------------------------------------------------

    def _admissible_types(self, job: Job) -> tuple[list[str], PendingReason | None]:
        if self.host_quotas_active and job.needs_host:
            refusal = self._over_host_quota(job)
            if refusal is not None:
                return [], refusal
        types = self._types_for(job)[0]
        if types and (not self.quotas_active or not job.total_gpus):
            return types, None
        if not types:
            return [], PendingReason(
                PendingCode.INFEASIBLE, f"no node in the cluster has GPU type {job.gpu_type}"
            )
        tenant = self.state.tenant(job.tenant)
        if not tenant.has_quota:
            return types, None
        allowed = [t for t in types if self._borrowed_after(job, t) <= tenant.borrow_limit_for(t)]
        if allowed:
            return allowed, None
        t = types[0]
        used = self._used(job.tenant, t)
        quota, limit = tenant.quota_for(t), tenant.borrow_limit_for(t)
        if limit == 0:
            return [], PendingReason(
                PendingCode.OVER_QUOTA,
                f"over quota: tenant {job.tenant} uses {used} of {quota} {t} GPUs and the job "
                f"needs {job.total_gpus}; borrowing is not allowed",
            )
        return [], PendingReason(
            PendingCode.BORROW_LIMIT,
            f"borrowing limit: tenant {job.tenant} uses {used} {t} GPUs (quota {quota}, may "
            f"borrow {limit}) and the job needs {job.total_gpus}",
        )

    def _over_host_quota(self, job: Job) -> PendingReason | None:
        """Why ``job`` waits for its tenant's CPU or memory cap, if it does."""
        tenant = self.state.tenant(job.tenant)
        cpus, memory = self._host_used(job.tenant)
        for label, cap, used, needed, scale in (
            ("CPUs", tenant.cpu_quota, cpus, job.total_millicpus, 1000),
            ("GB of memory", tenant.memory_quota_gb, memory, job.total_memory_mib, 1024),
        ):
            if cap is not None and used + needed > round(cap * scale):
                return PendingReason(
                    PendingCode.OVER_QUOTA,
                    f"over quota: tenant {job.tenant} uses {used / scale:g} of {cap:g} {label} "
                    f"and the job needs {needed / scale:g}",
                )
        return None

    def _host_used(self, tenant: str) -> tuple[int, int]:
        cpus, memory = self.state.host_usage.get(tenant, (0, 0))
        added_cpus, added_memory = self.host_delta.get(tenant, (0, 0))
        return cpus + added_cpus, memory + added_memory

    def _add_host(self, job: Job, sign: int) -> None:
        cpus, memory = self.host_delta.get(job.tenant, (0, 0))
        self.host_delta[job.tenant] = (
            cpus + sign * job.total_millicpus,
            memory + sign * job.total_memory_mib,
        )

    def _types_for(self, job: Job) -> tuple[list[str], tuple[str, ...]]:
        found = self.types_by_gpu_type.get(job.gpu_type)
        if found is None:
            types = gpu_types_for(self.index, job)
            found = self.types_by_gpu_type[job.gpu_type] = (types, tuple(types))
        return found

    def _used(self, tenant: str, gpu_type: str) -> int:
        return self.state.used(tenant, gpu_type) + self.usage_delta.get((tenant, gpu_type), 0)

    def _borrowed_after(self, job: Job, gpu_type: str) -> int:
        """GPUs the tenant would borrow in all if ``job`` started."""
        quota = self.state.tenant(job.tenant).quota_for(gpu_type)
        return max(0, self._used(job.tenant, gpu_type) + job.total_gpus - quota)

    def _borrow_needed(self, job: Job, gpu_type: str) -> int:
        """GPUs ``job`` itself borrows beyond what the tenant borrows already."""
        quota = self.state.tenant(job.tenant).quota_for(gpu_type)
        already = max(0, self._used(job.tenant, gpu_type) - quota)
        return self._borrowed_after(job, gpu_type) - already

    # -- placement --------------------------------------------------------------------------

    def _place(
        self, job: Job, types: list[str], shape: Hashable | None = None
    ) -> Placement | PlacementFailure:
        """``shape`` is ``job_shape(job)`` where the caller has it (a pending entry's lane)."""
        reservation = self.reservation
        admits = reservation is not None and reservation.admits(job, self.now)
        if not self.shortcuts.enabled:
            return self._search(job, types, admits)
        # Shortcut: the search's answer remembered by what it depends on (this cycle's index
        # version, or across cycles its content hash).
        listed = self._types_for(job)
        key_types = listed[1] if types is listed[0] else tuple(types)
        key = (job_shape(job) if shape is None else shape, key_types, id(reservation), admits)
        version = self.index.version
        known = self.failures.get(key)
        if known is not None and known[0] == version:
            return known[1]
        fits = self.placements.get(key)
        if fits is not None and fits[0] == version:
            return fits[1]
        lasting = self._lasting_key(key, reservation)
        if lasting is not None:
            failure = self.index.content_memo.get(lasting)
            if isinstance(failure, PlacementFailure):
                self.failures[key] = (version, failure)
                return failure
        found = self._search(job, types, admits)
        if isinstance(found, PlacementFailure):
            self.failures[key] = (version, found)
            if lasting is not None:
                self.index.remember(lasting, found)
        elif self.config.power_cap_watts is None:  # else the search allocated tentatively
            self.placements[key] = (version, found)
        return found

    def _lasting_key(
        self, key: tuple[Hashable, ...], reservation: Reservation | None
    ) -> tuple[Hashable, ...] | None:
        """The key of a placement failure across cycles: the search's inputs (shape, types,
        the reserved nodes, whether the job may use them) and the index's content hash. A
        failure depends on how many GPUs are free where, never on the order the buckets list
        nodes in, and the search changes nothing, so answering from memory decides alike. None
        where the search is not such a function: under a power cap it allocates tentatively
        (which reorders buckets), and on clusters with NVLink splits the hash is not kept."""
        content = self.index.content_hash
        if content is None or self.config.power_cap_watts is not None:
            return None
        nodes = None if reservation is None else reservation.nodes
        return ("placement", key[0], key[1], nodes, key[3], self.config.explain, content)

    def _search(self, job: Job, types: list[str], admits: bool) -> Placement | PlacementFailure:
        reservation = self.reservation
        exclude = reservation.nodes if reservation is not None else frozenset()
        explain = self.config.explain  # without it, no one reads a failure's details
        found = find_placement(self.index, job, exclude=exclude, types=types, explain=explain)
        if isinstance(found, PlacementFailure) and admits:
            found = find_placement(self.index, job, types=types, explain=explain)
        if isinstance(found, Placement) and not self._within_power_cap(found):
            return PlacementFailure(
                PendingCode.POWER_CAP,
                f"starting it would exceed the power cap of {self.config.power_cap_watts:.0f} W",
            )
        return found

    def _within_power_cap(self, placement: Placement) -> bool:
        cap = self.config.power_cap_watts
        if cap is None:
            return True
        self.index.allocate(placement.slots)
        fits = self.index.watts <= cap
        self.index.release(placement.slots)
        return fits

    def _admit_smaller(self, entry: PendingEntry, types: list[str]) -> bool:
        """Start an elastic job on as many workers as fit now (at least its min_workers); it
        grows back when capacity returns (the control loop restarts it at full size)."""
        for workers in entry.job.smaller_sizes():
            smaller = entry.job.resized(workers)
            if self.quotas_active and any(
                self._borrowed_after(smaller, t)
                > self.state.tenant(smaller.tenant).borrow_limit_for(t)
                for t in types
            ):
                continue
            found = self._place(smaller, types)
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
        self.index.allocate(placement.slots)
        gpu_type = self.index.nodes[self.index.node_id[placement.slots[0].node]].gpu_type
        borrowed = self._borrow_needed(job, gpu_type) if self.quotas_active else 0
        key = (job.tenant, gpu_type)
        self.usage_delta[key] = self.usage_delta.get(key, 0) + job.total_gpus
        if job.needs_host:
            self._add_host(job, 1)
        estimate = job.duration_estimate
        end = math.inf if estimate is None else self.now + estimate - entry.executed_seconds
        for name in placement.nodes:
            node = self.index.node_id[name]
            self.admitted_ends[node] = max(self.admitted_ends.get(node, self.now), end)
        why = f"placed in {placement.explain()}"
        if borrowed:
            why += f"; borrows {borrowed} idle {gpu_type} GPUs"
        if backfilled:
            why += "; backfilled without delaying the reserved head job"
        workers = None
        if job.workers != entry.job.workers:
            workers = job.workers
            why += (
                f"; elastic: {job.workers} of {entry.job.workers} workers until more GPUs free up"
            )
        self.plan.admissions.append(Admit(job.id, placement, why, borrowed, backfilled, workers))

    # -- preemption -------------------------------------------------------------------------

    def _preempt_for(self, entry: PendingEntry, types: list[str]) -> bool:
        before = self.index.version
        victims = find_victims(self.preemption, entry, types)
        if victims is None:
            self._carry_over(before)
            return False
        job = entry.job
        for victim in victims.jobs:
            kind = victims.kinds[victim.job.id]
            self.preempted.add(victim.job.id)
            key = (victim.job.tenant, victim.gpu_type)
            self.usage_delta[key] = self.usage_delta.get(key, 0) - victim.job.total_gpus
            if victim.job.needs_host:
                self._add_host(victim.job, -1)
            reason = {
                VictimKind.RECLAIM: (
                    f"reclaimed: tenant {job.tenant} needs its quota back for job {job.id}"
                ),
                VictimKind.PRIORITY: f"preempted by higher-priority job {job.id}",
                VictimKind.POLICY: (
                    f"preempted by job {job.id} under the {self.config.queue} policy"
                ),
            }[kind]
            self.plan.preemptions.append(Preempt(victim.job.id, reason, kind, job.id))
        self._admit(entry, victims.placement, backfilled=False)
        return True

    def _carry_over(self, before: int) -> None:
        """A failed victim search gives every GPU back, so what the cycle knew of the index at
        version ``before`` still holds: failures and free sums depend only on free GPUs, not on
        the order in which the index lists nodes (which the round trip changes)."""
        after = self.index.version
        for key, (version, failure) in self.failures.items():
            if version == before:
                self.failures[key] = (after, failure)
        for key, version in self.victim_failures.items():
            if version == before:
                self.victim_failures[key] = after
        if self.reserved_free_at[0] == before:
            self.reserved_free_at = (after, self.reserved_free_at[1])
        if self.nothing_fits_at[0] == before:  # whether a shape fits does not hang on order
            self.nothing_fits_at = (after, self.nothing_fits_at[1])

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
        reason = self.reservation_reasons.get(key)
        if reason is None:
            hint = "" if key[1] else " (it gives no duration estimate)"
            reason = self.reservation_reasons[key] = PendingReason(
                PendingCode.RESERVATION,
                f"needs {job.total_gpus} GPUs; what is free would delay the head of the queue"
                f"{hint}: {reservation.describe(self.index)}",
                reservation.job_id,
            )
        return reason

    def _wait(self, candidate: Candidate, ordering: Ordering, reason: PendingReason) -> None:
        self.plan.pending[candidate.job_id] = reason
        # Jobs of one lane fail alike, except against a reservation with a known start: there a
        # later job with a shorter estimate may still fit before the head starts.
        timed = self.reservation is not None and not math.isinf(self.reservation.start)
        drop = not (timed and reason.code is PendingCode.RESERVATION)
        if drop and self.config.explain:  # read only when explaining the rest
            self.lane_reasons[id(ordering.lane_items(candidate))] = reason
        ordering.finish(candidate, placed=False, drop_lane=drop)

    def _default_reason(self) -> PendingReason:
        if self.blocked_by is not None:
            return PendingReason(
                PendingCode.QUEUE_ORDER,
                f"waiting behind job {self.blocked_by} (strict queue order, no backfill)",
                self.blocked_by,
            )
        free = sum(self.index.free_by_type.values())
        return PendingReason(
            PendingCode.NO_CAPACITY,
            f"waiting for capacity: jobs ahead in the queue take the {free} free GPU(s) first",
        )

    def _explain_rest(self, ordering: Ordering) -> None:
        """Give every job not examined the reason of its lane's head, or the default."""
        default = self._default_reason()
        pending = self.plan.pending
        for items, position in ordering.remaining():
            lane_reason = self.lane_reasons.get(id(items))
            reason = default
            if lane_reason is not None and position > 0:
                reason = _like(lane_reason, items[position - 1][2])
            for _, _, job_id in items[position:]:
                pending.setdefault(job_id, reason)


def _no_easier(job: Job, failed: Job) -> bool:
    """Whether ``job`` can fit only where ``failed`` (which did not) would: same GPU type and
    widest domain, no NVLink group, units at least as many and as large. A domain's capacity in
    units only shrinks as the unit grows, and placement succeeds exactly when some domain's
    capacity holds the gang (so it is monotone); the free-GPU buckets' order plays no part."""
    return (
        not job.needs_nvlink
        and not failed.needs_nvlink
        and job.max_domain == failed.max_domain >= DomainLevel.NODE
        and job.gpu_type == failed.gpu_type
        and job.unit_gpus >= failed.unit_gpus
        and job.units >= failed.units
        # CPUs and memory bound a node's units alike (min with its GPU room), and a job without
        # GPUs is placed by another search: compare only within one kind.
        and job.unit_millicpus >= failed.unit_millicpus
        and job.unit_memory_mib >= failed.unit_memory_mib
        and bool(job.total_gpus) == bool(failed.total_gpus)
    )


def _like(reason: PendingReason, head: str) -> PendingReason:
    message = f"{reason.message} (as for job {head}, ahead in its lane)"
    return PendingReason(reason.code, message, reason.blocking_job)
