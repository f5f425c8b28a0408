"""Preemption candidates: the running jobs a waiting job may preempt, by which right, in which
order and how many, listed once per cycle for the jobs entitled to the same ones."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from aicluster.core import VictimKind
from aicluster.scheduler.entries import PendingEntry, RunningEntry
from aicluster.scheduler.index import FreeIndex
from aicluster.scheduler.protection import Protection, protected_until
from aicluster.scheduler.rights import Reach, Reclaim, borrowed_jobs, policy_ceiling
from aicluster.scheduler.shortcuts import PlainPolicy
from aicluster.scheduler.state import SchedulerState

__all__ = [
    "CandidateKinds",
    "CandidateList",
    "CandidateMemo",
    "PreemptionContext",
    "UsageDelta",
    "by_rank",
    "gpus_per_node",
    "list_candidates",
    "over_quota",
    "protections",
    "shared_candidates",
]

UsageDelta = Mapping[tuple[str, str], int]


@dataclass(slots=True)
class PreemptionContext:
    """What one cycle's victim searches share (as Kueue's ``preemptionCtx``): the state and the
    time, the jobs the cycle has preempted so far (``taken``) and its usage changes
    (``usage_delta``), and two memos valid for the cycle: searches that failed, by job shape and
    candidate list, with the index version they saw (``failed``), and candidate lists
    (``listed``). The cycle owns the collections and changes them as it decides."""

    state: SchedulerState
    now: float
    shortcuts: PlainPolicy
    taken: set[str] = field(default_factory=set)
    usage_delta: UsageDelta = field(default_factory=dict)
    failed: dict[tuple[object, ...], int] = field(default_factory=dict)
    listed: CandidateMemo = field(default_factory=dict)
    # The running jobs on borrowed GPUs (rights.borrowed_jobs), with len(taken) when found.
    standing: tuple[int, set[str]] | None = None
    # The earliest lapse of a protection that held a candidate back (protection.py).
    held_until: float = math.inf

    def borrowed(self) -> set[str]:
        if self.standing is None or self.standing[0] != len(self.taken):
            state = self.state
            quota_for = _quota_lookup(state)
            self.standing = (len(self.taken), borrowed_jobs(state.running, self.taken, quota_for))
        return self.standing[1]


def _quota_lookup(state: SchedulerState) -> Callable[[str, str], int]:
    def quota_for(tenant: str, gpu_type: str) -> int:
        return state.tenant(tenant).quota_for(gpu_type)

    return quota_for


def over_quota(state: SchedulerState, delta: UsageDelta, tenant: str, gpu_type: str) -> int:
    return state.over_quota(tenant, gpu_type, delta.get((tenant, gpu_type), 0))


def _held_back(
    context: PreemptionContext,
    victim: RunningEntry,
    own_priority: bool,
    skipped: list[Protection] | None,
) -> bool:
    """Whether ``victim`` is protected from this preemptor now (:mod:`..protection`), noted in
    ``skipped`` when it is."""
    until = protected_until(context.state.config, victim, own_priority)
    if context.now >= until:
        return False
    if until < context.held_until:
        context.held_until = until
    if skipped is not None:
        skipped.append(Protection(victim.job.id, victim.started_at, until))
    return True


def protections(
    context: PreemptionContext, entry: PendingEntry, types: Sequence[str]
) -> list[Protection]:
    """The running jobs ``entry`` could preempt but for their protections (its ``why``)."""
    skipped: list[Protection] = []
    _candidates(context, entry, types, skipped)
    return skipped


def _candidates(
    context: PreemptionContext,
    entry: PendingEntry,
    types: Sequence[str],
    skipped: list[Protection] | None = None,
) -> dict[str, VictimKind]:
    """Running jobs ``entry`` may preempt, with the right by which (in no particular order),
    as the configured rights (:mod:`.rights`) allow, less the protected runs (noted in
    ``skipped`` when given)."""
    state, now, taken, delta = context.state, context.now, context.taken, context.usage_delta
    job, policy, running, rights = entry.job, state.policy, state.running, state.config.rights
    quotas = state.quotas_active  # without quotas no one borrows
    within = not quotas or not any(
        state.over_quota(job.tenant, t, job.total_gpus + delta.get((job.tenant, t), 0))
        for t in types
    )
    guard = state.config.protects
    if (
        not quotas
        and skipped is None
        and context.shortcuts.enabled
        and rights.priority is Reach.BORROWED
        and rights.policy is Reach.BORROWED
    ):
        return _open_candidates(context, entry, types)
    standing, ceiling = rights.by_standing, policy_ceiling(rights, job.priority)
    borrowed_set = context.borrowed() if quotas and standing else set()
    kinds: dict[str, VictimKind] = {}

    def consider(job_id: str, kind: VictimKind) -> None:
        if job_id in kinds or job_id in taken:
            return
        victim = running[job_id]
        if not victim.job.preemptible or victim.gpu_type not in types:
            return
        foreign = victim.job.tenant != job.tenant
        if quotas:
            tenant_borrows = over_quota(state, delta, victim.job.tenant, victim.gpu_type) > 0
            borrowed = job_id in borrowed_set if standing else tenant_borrows
            if kind is VictimKind.RECLAIM:
                lower = victim.job.priority < job.priority
                if (
                    foreign
                    and tenant_borrows
                    and borrowed
                    and _reclaims(rights.reclaim, lower)
                    and not (guard and _held_back(context, victim, False, skipped))
                ):
                    kinds[job_id] = kind
                return
            if standing and not within and not borrowed:
                return  # a borrower takes borrowed GPUs only
            if foreign and not borrowed and state.tenant(victim.job.tenant).has_quota:
                return
            threshold = rights.max_priority_threshold
            if foreign and not within and threshold is not None and victim.job.priority > threshold:
                return
        reach = rights.reach(kind.value, not within)
        if reach is Reach.NONE or (foreign and reach is Reach.OWN):
            return
        if kind is VictimKind.PRIORITY or (
            victim.job.priority <= ceiling and policy.may_preempt(entry, victim, now)
        ):
            own = kind is VictimKind.PRIORITY and not foreign
            if not (guard and _held_back(context, victim, own, skipped)):
                kinds[job_id] = kind

    if quotas and within and rights.reclaim is not Reclaim.NEVER:
        for job_id in list(running):  # the job is within its quota: it may reclaim
            consider(job_id, VictimKind.RECLAIM)
    for priority in sorted(state.by_priority):
        if priority > job.priority - state.config.priority_gap:
            break
        for job_id in state.by_priority[priority]:
            consider(job_id, VictimKind.PRIORITY)
    if policy.preemptive:
        for running_class in sorted(state.by_class, reverse=True):
            if not policy.class_may_be_preempted(entry, running_class):
                continue
            for job_id in state.by_class[running_class]:
                consider(job_id, VictimKind.POLICY)
    return kinds


def _reclaims(reclaim: Reclaim, lower_priority: bool) -> bool:
    return reclaim is Reclaim.ANY or (reclaim is Reclaim.LOWER_PRIORITY and lower_priority)


def _open_candidates(
    context: PreemptionContext, entry: PendingEntry, types: Sequence[str]
) -> dict[str, VictimKind]:
    """Shortcut: :func:`_candidates` without quotas (the hot path): no reclaim, and every
    preemptible running job of an allowed type is open to the priority and the policy's rights;
    the same jobs in the same order as ``consider`` takes them."""
    state, now, taken, shortcuts = context.state, context.now, context.taken, context.shortcuts
    job, policy, running = entry.job, state.policy, state.running
    guard, tenant = state.config.protects, job.tenant
    kinds: dict[str, VictimKind] = {}
    for priority in sorted(state.by_priority):
        if priority > job.priority - state.config.priority_gap:
            break
        for job_id in state.by_priority[priority]:
            if job_id in kinds or job_id in taken:
                continue
            victim = running[job_id]
            if (
                victim.job.preemptible
                and victim.gpu_type in types
                and not (guard and _held_back(context, victim, victim.job.tenant == tenant, None))
            ):
                kinds[job_id] = VictimKind.PRIORITY
    # The policy's right reaches no job of a higher priority (with the rights by standing).
    ceiling = policy_ceiling(state.config.rights, job.priority)
    if policy.preemptive:
        for running_class in sorted(state.by_class, reverse=True):
            if not policy.class_may_be_preempted(entry, running_class):
                continue
            ids = [
                job_id
                for job_id in state.by_class[running_class]
                if job_id not in kinds
                and job_id not in taken
                and (victim := running[job_id]).job.preemptible
                and victim.gpu_type in types
                and (victim.job.priority <= ceiling)
                and not (guard and _held_back(context, victim, False, None))
            ]
            if shortcuts.preempts_whole_class(entry, running_class):
                kinds.update(dict.fromkeys(ids, VictimKind.POLICY))
                continue
            victims = [running[job_id] for job_id in ids]
            mays = shortcuts.may_preempt_each(entry, victims, now)
            for job_id, may in zip(ids, mays, strict=True):
                if may:
                    kinds[job_id] = VictimKind.POLICY
    return kinds


def _ranked(context: PreemptionContext, kinds: CandidateKinds) -> list[RunningEntry]:
    """Candidates in the order they are freed: reclaim, then priority, then the policy's right;
    within each by the policy's victim rank (all of them: callers keep the ``max_victims``
    first)."""
    running = context.state.running
    return by_rank(context, kinds, [running[job_id] for job_id in kinds])


def by_rank(
    context: PreemptionContext, kinds: CandidateKinds, victims: list[RunningEntry]
) -> list[RunningEntry]:
    """``victims`` sorted by (right, the policy's victim rank, seq); seq is unique, so the keys
    are distinct and entries are never compared."""
    # (heapq.nsmallest for the max_victims first was tried: its loop is Python's, and the
    # congested 50,000-GPU Tiresias run took 15-25% longer than with this sort in two
    # side-by-side runs: docs/benchmarks.md, "A congested Tiresias cycle".)
    ranks = context.shortcuts.victim_ranks(victims, context.now)
    keys = [
        (kinds[victim.job.id].rank, rank, victim.seq)
        for victim, rank in zip(victims, ranks, strict=True)
    ]
    order = sorted(range(len(victims)), key=keys.__getitem__)
    return [victims[i] for i in order]


class CandidateKinds:
    """The right by which each candidate may be preempted, by job id: a listed mapping less the
    jobs the cycle has preempted since it was listed.

    Speed-up: a list shared within a cycle (:func:`shared_candidates`) drops the jobs taken
    since it was made. Copying the mapping without them costs every running job per victim
    search of a congested cycle; this view leaves the mapping as it was and skips them."""

    __slots__ = ("_listed", "_size", "_taken")

    def __init__(self, listed: dict[str, VictimKind], taken: frozenset[str] = frozenset()) -> None:
        self._listed = listed
        self._taken = taken
        self._size = len(listed) - sum(1 for job_id in taken if job_id in listed)

    def without(self, taken: set[str]) -> CandidateKinds:
        """These candidates less ``taken`` (which holds every job this view leaves out)."""
        return CandidateKinds(self._listed, frozenset(taken))

    def first_of(self, ranked: list[RunningEntry], most: int) -> list[RunningEntry]:
        """The first ``most`` of ``ranked`` that are among these candidates."""
        listed, taken = self._listed, self._taken
        kept: list[RunningEntry] = []
        for victim in ranked:
            if len(kept) >= most:
                break
            job_id = victim.job.id
            if job_id in listed and job_id not in taken:
                kept.append(victim)
        return kept

    def __getitem__(self, job_id: str) -> VictimKind:
        if job_id in self._taken:
            raise KeyError(job_id)
        return self._listed[job_id]

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[str]:
        taken = self._taken
        return (job_id for job_id in self._listed if job_id not in taken)


@dataclass(slots=True)
class CandidateList:
    """Candidates shared by the jobs of one cycle that are entitled to the same victims; ranked
    only when a search needs their order."""

    taken: int  # how many jobs the cycle had preempted when this was listed
    kinds: CandidateKinds
    ranked: list[RunningEntry] | None = None
    # Every candidate ranked (``ranked`` is its ``max_victims`` first), or a ranked list of this
    # cycle whose candidates include these (see shared_candidates).
    order: list[RunningEntry] | None = None
    seqs: tuple[int, ...] = ()
    # What a search would release at most (every candidate, or the ``max_victims`` first
    # ranked), its GPUs in all and per node: fixed with the list, so worked out once.
    pool: list[RunningEntry] | None = None
    pool_gpus: int = 0
    pool_freed: dict[int, int] | None = None
    pool_nodes: list[tuple[int, ...]] | None = None
    # Keyed by the index's content version (free GPUs, not bucket order): whether a job of
    # each shape could fit were the whole pool released, and the pool's victims on nodes with
    # free GPUs in rank order (the list is one cycle's, so ``now`` is fixed).
    fits_all: dict[tuple[object, ...], tuple[int, bool]] = field(default_factory=dict)
    seen: tuple[int, list[RunningEntry]] | None = None

    def rank(self, context: PreemptionContext) -> list[RunningEntry]:
        if self.ranked is None:
            most = context.state.config.max_victims
            if self.order is None:
                self.order = _ranked(context, self.kinds)
                self.ranked = self.order[:most]
            else:  # Shortcut: a wider list of this cycle, ranked, less the jobs not in this one
                self.ranked = self.kinds.first_of(self.order, most)
            self.seqs = tuple(victim.seq for victim in self.ranked)
        return self.ranked

    def released_at_most(self, context: PreemptionContext) -> list[RunningEntry]:
        if self.pool is None:
            if len(self.kinds) <= context.state.config.max_victims:
                running = context.state.running
                self.pool = [running[job_id] for job_id in self.kinds]
            else:
                self.pool = self.rank(context)
            self.pool_gpus = sum(victim.job.total_gpus for victim in self.pool)
        return self.pool

    def freed_per_node(self, index: FreeIndex) -> dict[int, int]:
        """GPUs the pool holds per node (call :meth:`released_at_most` first)."""
        if self.pool_freed is None:
            self.pool_freed = gpus_per_node(index, self.pool or [])
        return self.pool_freed

    def nodes_per_victim(self, index: FreeIndex) -> list[tuple[int, ...]]:
        """The nodes of each victim of the pool, in the pool's order."""
        if self.pool_nodes is None:
            node_id = index.node_id
            self.pool_nodes = [
                tuple(node_id[slot.node] for slot in victim.placement.slots)
                for victim in self.pool or []
            ]
        return self.pool_nodes


#: Per-cycle memo of candidate lists (see :func:`shared_candidates`).
CandidateMemo = dict[tuple[object, ...], CandidateList]


def list_candidates(
    context: PreemptionContext, entry: PendingEntry, types: Sequence[str]
) -> CandidateList:
    """The candidates for ``entry``, listed afresh (the plain search)."""
    return CandidateList(len(context.taken), CandidateKinds(_candidates(context, entry, types)))


def shared_candidates(
    context: PreemptionContext, entry: PendingEntry, types: Sequence[str]
) -> CandidateList:
    """The candidates for ``entry``, from the context's memo where another job of the cycle was
    entitled to exactly the same ones. Without quotas a job's candidates depend on it only
    through its priority and the policy's ``preemption_key``, and under a minimum run time its
    tenant (:mod:`..protection`; reclaim and the borrowing rules
    read its tenant and the cycle's usage, so with quotas nothing is shared)."""
    state, taken, memo = context.state, context.taken, context.listed
    memo_key: tuple[object, ...] | None = None
    if not state.quotas_active:
        policy_key = context.shortcuts.preemption_key(entry)
        if policy_key is not None:
            memo_key = (policy_key, entry.job.priority, tuple(types))
            if state.config.min_runtime_s > 0:  # (its own tenant's priority is not held back)
                memo_key = (*memo_key, entry.job.tenant)
            known = memo.get(memo_key)
            if known is not None and known.taken == len(taken):
                return known
            if known is not None:  # jobs were preempted since: the same list without them
                found = CandidateList(len(taken), known.kinds.without(taken))
                # Ranked, as they are in the same order (each one's key depends on it alone and
                # the cycle's time), by dropping the taken from the known list's ranking.
                found.order = known.order
                memo[memo_key] = found
                return found
    found = list_candidates(context, entry, types)
    if memo_key is not None:
        memo[memo_key] = found
    return found


def gpus_per_node(index: FreeIndex, victims: Sequence[RunningEntry]) -> dict[int, int]:
    """GPUs the victims hold per node."""
    freed: dict[int, int] = {}
    node_id = index.node_id
    for victim in victims:
        for slot in victim.placement.slots:
            i = node_id[slot.node]
            freed[i] = freed.get(i, 0) + slot.gpus
    return freed
