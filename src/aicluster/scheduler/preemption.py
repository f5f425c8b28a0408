"""Gang-aware preemption: the fewest, lowest-ranked victims that let a waiting job fit.

Three rights, each enabled by the config's ``preemption`` switch:
- *reclaim*: a tenant within its quota may preempt jobs of tenants using more than their quota;
- *priority*: a job may preempt lower-priority jobs (at least ``priority_gap`` levels lower) of its
  own tenant, or of a tenant over quota;
- *policy*: the queue policy's own right (SRTF, Tiresias demotion), limited like priority when
  quotas are in force.
A victim is always a whole gang. Candidates are freed greedily in rank order until the job fits,
then victims that turned out unnecessary are given back (costliest first).

Quota checks count the cycle's own decisions so far (``usage_delta``), and a reclaim victim is
taken only while its tenant is still borrowing once the victims before it are gone (Kueue's
rule). Without both, reclaims ping-pong: a tenant admitted several jobs "within quota" against
its usage before the cycle, ended over quota, and was reclaimed from on the next cycle by a
tenant that an earlier reclaim had pushed below quota.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from aicluster.core import DomainLevel, Job, Placement, VictimKind
from aicluster.scheduler.index import FreeIndex
from aicluster.scheduler.placement import find_placement, gpu_types_for
from aicluster.scheduler.shortcuts import PlainPolicy
from aicluster.scheduler.state import PendingEntry, RunningEntry, SchedulerState, job_shape

__all__ = ["CandidateMemo", "PreemptionContext", "Victims", "find_victims", "preemption_possible"]


@dataclass(frozen=True, slots=True)
class Victims:
    jobs: list[RunningEntry]
    kinds: dict[str, VictimKind]  # job id -> the right it is preempted by
    placement: Placement


def preemption_possible(state: SchedulerState) -> bool:
    """Cheap test: could any waiting job preempt anything this cycle?"""
    if not state.config.preemption or not state.running:
        return False
    if state.policy.preemptive or state.quotas_active:
        return True
    gap = state.config.priority_gap
    return bool(state.pending_priorities) and (
        max(state.pending_priorities) - gap >= min(state.by_priority)
    )


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


def _over_quota(state: SchedulerState, delta: UsageDelta, tenant: str, gpu_type: str) -> int:
    return state.over_quota(tenant, gpu_type, delta.get((tenant, gpu_type), 0))


def _candidates(
    context: PreemptionContext, entry: PendingEntry, types: Sequence[str]
) -> dict[str, VictimKind]:
    """Running jobs ``entry`` may preempt, with the right by which (in no particular order)."""
    state, now, taken, delta = context.state, context.now, context.taken, context.usage_delta
    job, policy, running = entry.job, state.policy, state.running
    quotas = state.quotas_active  # without quotas no one borrows and every right is open
    if not quotas and context.shortcuts.enabled:
        return _open_candidates(context, entry, types)
    kinds: dict[str, VictimKind] = {}

    def consider(job_id: str, kind: VictimKind) -> None:
        if job_id in kinds or job_id in taken:
            return
        victim = running[job_id]
        if not victim.job.preemptible or victim.gpu_type not in types:
            return
        if quotas:
            foreign = victim.job.tenant != job.tenant
            borrowing = _over_quota(state, delta, victim.job.tenant, victim.gpu_type) > 0
            if kind is VictimKind.RECLAIM:
                if foreign and borrowing:
                    kinds[job_id] = kind
                return
            if foreign and not borrowing and state.tenant(victim.job.tenant).has_quota:
                return
        if kind is VictimKind.PRIORITY or policy.may_preempt(entry, victim, now):
            kinds[job_id] = kind

    if quotas and not any(
        state.over_quota(job.tenant, t, job.total_gpus + delta.get((job.tenant, t), 0))
        for t in types
    ):  # the job is within its quota: it may reclaim from borrowers
        for job_id in list(running):
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


def _open_candidates(
    context: PreemptionContext, entry: PendingEntry, types: Sequence[str]
) -> dict[str, VictimKind]:
    """Shortcut: :func:`_candidates` without quotas (the hot path): no reclaim, and every
    preemptible running job of an allowed type is open to the priority and the policy's rights;
    the same jobs in the same order as ``consider`` takes them."""
    state, now, taken, shortcuts = context.state, context.now, context.taken, context.shortcuts
    job, policy, running = entry.job, state.policy, state.running
    kinds: dict[str, VictimKind] = {}
    for priority in sorted(state.by_priority):
        if priority > job.priority - state.config.priority_gap:
            break
        for job_id in state.by_priority[priority]:
            if job_id in kinds or job_id in taken:
                continue
            victim = running[job_id]
            if victim.job.preemptible and victim.gpu_type in types:
                kinds[job_id] = VictimKind.PRIORITY
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


def _ranked(context: PreemptionContext, kinds: dict[str, VictimKind]) -> list[RunningEntry]:
    """Candidates in the order they are freed: reclaim, then priority, then the policy's right;
    within each by the policy's victim rank; at most ``max_victims`` of them."""
    state = context.state
    running = state.running
    ranked = _by_rank(context, kinds, [running[job_id] for job_id in kinds])
    return ranked[: state.config.max_victims]


def _by_rank(
    context: PreemptionContext, kinds: dict[str, VictimKind], victims: list[RunningEntry]
) -> list[RunningEntry]:
    """``victims`` sorted by (right, the policy's victim rank, seq); seq is unique, so the keys
    are distinct and entries are never compared."""
    ranks = context.shortcuts.victim_ranks(victims, context.now)
    keys = [
        (kinds[victim.job.id].rank, rank, victim.seq)
        for victim, rank in zip(victims, ranks, strict=True)
    ]
    order = sorted(range(len(victims)), key=keys.__getitem__)
    return [victims[i] for i in order]


@dataclass(slots=True)
class _Listed:
    """Candidates shared by the jobs of one cycle that are entitled to the same victims; ranked
    only when a search needs their order."""

    taken: int  # how many jobs the cycle had preempted when this was listed
    kinds: dict[str, VictimKind]
    ranked: list[RunningEntry] | None = None
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
            self.ranked = _ranked(context, self.kinds)
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
            self.pool_freed = _freed_per_node(index, self.pool or [])
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


#: Per-cycle memo of candidate lists (see :func:`find_victims`).
CandidateMemo = dict[tuple[object, ...], _Listed]


def find_victims(
    context: PreemptionContext, entry: PendingEntry, types: Sequence[str]
) -> Victims | None:
    """Victims whose preemption lets ``entry`` fit, or None. Leaves the index as it found it
    unless victims are returned, in which case their GPUs stay released (tentatively).

    The context's ``failed`` remembers searches that found nothing, by job shape and candidate
    list, with the index version they saw: a job of the same shape facing the same candidates
    on an unchanged index fails alike. ``listed`` likewise remembers candidate lists (the
    running jobs do not change during a cycle; ``taken`` only grows, and a list drops the jobs
    taken since it was made)."""
    state, failed = context.state, context.failed
    if not context.shortcuts.enabled:  # the plain search: every candidate, released in order
        found = _Listed(len(context.taken), _candidates(context, entry, types))
        ranked = found.rank(context)
        if _too_few_gpus(state, entry.job, types, ranked):
            return None
        return _free_until_fits(context, entry.job, types, ranked, found.kinds)
    # Shortcut: the candidate list shared with the cycle's other jobs, the searches that cannot
    # succeed answered from the capacity histograms (their side effect on the buckets' order
    # replayed), and failures remembered by the index version they saw.
    found = _listed(context, entry, types)
    if not found.kinds:
        return None
    index, job = state.index, entry.job
    whole = len(found.kinds) <= state.config.max_victims
    victims = found.released_at_most(context)
    if _too_few_gpus(state, job, types, victims, found.pool_gpus):
        return None
    freed = found.freed_per_node(index)
    content = index.content_version
    shape = job_shape(job)
    fits_all = found.fits_all.get(shape)
    if fits_all is None or fits_all[0] != content:
        fits_all = found.fits_all[shape] = (content, _fits_if_all_freed(index, job, victims, freed))
    if not fits_all[1]:
        # The search would fail. Its round trip reorders the nodes it touches, but the order of
        # fully allocated nodes is read by no search: only the victims on nodes with free GPUs
        # count, and only their order (without quotas no reclaim skips a victim).
        if found.seen is not None and found.seen[0] == content:
            seen = found.seen[1]
        else:
            seen = _seen(index, victims, found.nodes_per_victim(index), freed)
            if whole and not state.quotas_active:
                seen = _by_rank(context, found.kinds, seen)
            found.seen = (content, seen)
        if not seen:
            return None
        if (
            whole
            and not state.quotas_active
            and index.round_trip([victim.placement.slots for victim in seen])
        ):
            return None
    ranked = found.rank(context)
    key = (shape, tuple(types), found.seqs)
    if failed.get(key) == index.version:
        return None
    # The ranked candidates are the pool itself (all of them, or the max_victims first ranked),
    # so whether releasing them all could make the job fit is fits_all, on an unchanged index.
    result = _free_until_fits(context, job, types, ranked, found.kinds, freed, fits_all[1])
    if result is None:
        failed[key] = index.version
    return result


def _too_few_gpus(
    state: SchedulerState,
    job: Job,
    types: Sequence[str],
    pool: Sequence[RunningEntry],
    pool_gpus: int | None = None,
) -> bool:
    """Whether even preempting every job of the ``pool`` would leave too few free GPUs (then no
    search is made: the index stays exactly as it is). ``pool_gpus``: their GPUs, if known."""
    if pool_gpus is None:
        pool_gpus = sum(victim.job.total_gpus for victim in pool)
    return sum(state.index.free_by_type[t] for t in types) + pool_gpus < job.total_gpus


def _seen(
    index: FreeIndex,
    victims: Sequence[RunningEntry],
    nodes: Sequence[tuple[int, ...]],
    freed: Mapping[int, int],
) -> list[RunningEntry]:
    """The victims whose release and re-allocation would leave the index observably changed:
    those holding a node with free GPUs. Buckets are walked from one free GPU up (placement,
    fit tests; the reservation's node search takes the minimum), so the order of nodes with
    none is read by no search; a full node's NVLink domains are all full again after a round
    trip; and a node out of placement sits in no bucket (unless split, when it counts).
    ``nodes`` holds each victim's nodes, ``freed`` the nodes of them all (as keys)."""
    free, schedulable, split = index.free, index.schedulable, index.nvlink_free
    seen = {i for i in freed if free[i] > 0 and (schedulable[i] or split[i] is not None)}
    if not seen:
        return []
    return [
        victim for victim, held in zip(victims, nodes, strict=True) if not seen.isdisjoint(held)
    ]


def _listed(context: PreemptionContext, entry: PendingEntry, types: Sequence[str]) -> _Listed:
    """The candidates for ``entry``, from the context's memo where another job of the cycle was
    entitled to exactly the same ones. Without quotas a job's candidates depend on it only
    through its priority and the policy's ``preemption_key`` (reclaim and the borrowing rules
    read its tenant and the cycle's usage, so with quotas nothing is shared)."""
    state, taken, memo = context.state, context.taken, context.listed
    memo_key: tuple[object, ...] | None = None
    if not state.quotas_active:
        policy_key = context.shortcuts.preemption_key(entry)
        if policy_key is not None:
            memo_key = (policy_key, entry.job.priority, tuple(types))
            known = memo.get(memo_key)
            if known is not None and known.taken == len(taken):
                return known
            if known is not None:  # jobs were preempted since: the same list without them
                found = _Listed(
                    len(taken), {k: v for k, v in known.kinds.items() if k not in taken}
                )
                if known.ranked is not None and len(known.kinds) <= state.config.max_victims:
                    found.ranked = [v for v in known.ranked if v.job.id not in taken]
                    found.seqs = tuple(victim.seq for victim in found.ranked)
                memo[memo_key] = found
                return found
    found = _Listed(len(taken), _candidates(context, entry, types))
    if memo_key is not None:
        memo[memo_key] = found
    return found


def _free_until_fits(
    context: PreemptionContext,
    job: Job,
    types: Sequence[str],
    candidates: list[RunningEntry],
    kinds: dict[str, VictimKind],
    freed_per_node: Mapping[int, int] | None = None,
    may_fit: bool | None = None,
) -> Victims | None:
    """Release candidates in order until the job fits, then give back those it turned out not
    to need. ``freed_per_node`` is what the candidates hold per node, and ``may_fit`` whether
    releasing them all could make the job fit (:func:`_fits_if_all_freed`), where the caller
    has them."""
    state, delta, shortcuts = context.state, context.usage_delta, context.shortcuts.enabled
    index = state.index
    if may_fit is None:
        may_fit = not shortcuts or _fits_if_all_freed(index, job, candidates, freed_per_node)
    if not may_fit:  # Shortcut (only ever False with shortcuts)
        # Releasing a subset frees less, so every prefix the search would try fails too. The
        # search would still have released and re-allocated its victims, which moves their nodes
        # within the free-GPU buckets (the tie-break of best fit): the index replays just that.
        slots = [victim.placement.slots for victim in _released(state, candidates, kinds, delta)]
        if index.round_trip(slots):
            return None
    fits = _one_node_fit_test(index, job) if shortcuts else None
    freed: list[RunningEntry] = []
    placement: Placement | None = None
    for victim in _released(state, candidates, kinds, delta):
        index.release(victim.placement.slots)
        freed.append(victim)
        if sum(index.free_by_type[t] for t in types) < job.total_gpus:
            continue
        if fits is not None and not fits():
            continue
        found = find_placement(index, job, explain=False)
        if isinstance(found, Placement):
            placement = found
            break
    if placement is None:
        for victim in reversed(freed):
            index.allocate(victim.placement.slots)
        return None
    placement = _prune(state, job, freed, placement, fits)
    return Victims(freed, {v.job.id: kinds[v.job.id] for v in freed}, placement)


def _released(
    state: SchedulerState,
    candidates: list[RunningEntry],
    kinds: dict[str, VictimKind],
    delta: UsageDelta,
) -> Iterator[RunningEntry]:
    """The candidates the search releases, in order: a reclaim victim is skipped once its
    tenant stopped borrowing with the victims before it."""
    released = dict(delta)  # usage changes so far: the cycle's, then this search's victims
    for victim in candidates:
        key = (victim.job.tenant, victim.gpu_type)
        if kinds[victim.job.id] is VictimKind.RECLAIM and _over_quota(state, released, *key) <= 0:
            continue
        released[key] = released.get(key, 0) - victim.job.total_gpus
        yield victim


def _prune(
    state: SchedulerState,
    job: Job,
    freed: list[RunningEntry],
    placement: Placement,
    fits: Callable[[], bool] | None,
) -> Placement:
    """Give back victims the job turned out not to need, costliest first."""
    index = state.index
    if fits is not None and not job.needs_nvlink and not job.needs_host:
        return _prune_one_unit(index, job, freed, placement)  # (it counts GPUs only)
    for position in range(len(freed) - 2, -1, -1):  # the last one freed made it fit
        victim = freed[position]
        index.allocate(victim.placement.slots)
        if fits is not None and not fits():
            index.release(victim.placement.slots)
            continue
        found = find_placement(index, job, explain=False)
        if isinstance(found, Placement):
            del freed[position]  # by position: comparing entries field by field is slow
            placement = found
        else:
            index.release(victim.placement.slots)
    return placement


def _prune_one_unit(
    index: FreeIndex, job: Job, freed: list[RunningEntry], placement: Placement
) -> Placement:
    """:func:`_prune` for a gang of one placement unit (no NVLink group). Whether a victim can
    be given back is the one-node fit test, which reads only how many GPUs each node has free:
    so the give-backs are first worked out on counts, then the same allocations and releases
    are made on the index, and the full search runs once, right after the last give-back (the
    index there, bucket order included, is the one the step-by-step search found it in; the
    searches after earlier give-backs only produced placements it then replaced)."""
    unit = job.unit_gpus
    types = gpu_types_for(index, job)
    free, schedulable, nodes, node_id = index.free, index.schedulable, index.nodes, index.node_id
    # Nodes that could take the unit now (what the fit test looks for in the buckets).
    roomy = sum(len(bucket) for t in types for bucket in index.buckets[t][unit:])
    counted: dict[int, int] = {}
    given_back: list[int] = []
    for position in range(len(freed) - 2, -1, -1):  # the last one freed made it fit
        before = dict(counted)
        lost = 0
        for slot in freed[position].placement.slots:
            i = node_id[slot.node]
            if not schedulable[i] or nodes[i].gpu_type not in types:
                continue
            had = counted.get(i, free[i])
            counted[i] = had - slot.gpus
            lost += had >= unit > had - slot.gpus
        if roomy - lost > 0:
            roomy -= lost
            given_back.append(position)
        else:
            counted = before
    last = given_back[-1] if given_back else -1
    kept = set(given_back)
    for position in range(len(freed) - 2, -1, -1):
        slots = freed[position].placement.slots
        index.allocate(slots)
        if position not in kept:
            index.release(slots)
        elif position == last:
            found = find_placement(index, job, explain=False)
            if not isinstance(found, Placement):  # the fit test is exact: never
                raise RuntimeError(f"job {job.id} fits a node but no placement was found")
            placement = found
    for position in given_back:  # descending: each deletion leaves the others' positions
        del freed[position]
    return placement


def _freed_per_node(index: FreeIndex, victims: Sequence[RunningEntry]) -> dict[int, int]:
    """GPUs the victims hold per node."""
    freed: dict[int, int] = {}
    node_id = index.node_id
    for victim in victims:
        for slot in victim.placement.slots:
            i = node_id[slot.node]
            freed[i] = freed.get(i, 0) + slot.gpus
    return freed


def _fits_if_all_freed(
    index: FreeIndex,
    job: Job,
    candidates: Sequence[RunningEntry],
    freed_per_node: Mapping[int, int] | None = None,
) -> bool:
    """Whether ``find_placement(index, job)`` could succeed were every candidate released, worked
    out from the capacity histograms without touching the index. False is exact: placement is
    monotone in free GPUs (each level of the search succeeds exactly when some domain's capacity
    in units holds the gang), so no subset of the candidates can make the job fit either. True
    only means the search must run (it also answers True where it cannot tell: NVLink groups).
    ``freed_per_node`` is what the candidates hold per node, where the caller has it."""
    unit, units = job.unit_gpus, job.units
    if job.needs_nvlink or unit <= 0 or job.max_domain < DomainLevel.NODE:
        return True
    types = gpu_types_for(index, job)
    freed = _freed_per_node(index, candidates) if freed_per_node is None else freed_per_node
    free, schedulable, nodes = index.free, index.schedulable, index.nodes
    gain: dict[int, int] = {}  # node -> placement units it gains
    for i, gpus in freed.items():
        if schedulable[i] and nodes[i].gpu_type in types:
            extra = (free[i] + gpus) // unit - free[i] // unit
            if extra:
                gain[i] = extra
    if job.max_domain == DomainLevel.NODE:
        if any(free[i] // unit + extra >= units for i, extra in gain.items()):
            return True
        return any(bucket for t in types for bucket in index.buckets[t][unit * units :])
    # A rack or a pod that fits holds the gang (a node that fits lies in some rack that does).
    per_type = dict.fromkeys(types, 0)
    for level, domains, owner in (
        (DomainLevel.RACK, index.racks, index.node_rack),
        (DomainLevel.POD, index.pods, index.node_pod),
    ):
        if level > job.max_domain:
            return False
        added: dict[int, int] = {}
        for i, extra in gain.items():
            added[owner[i]] = added.get(owner[i], 0) + extra
        for d, domain in enumerate(domains):
            if domain.gpu_type in per_type:
                capacity = domain.capacity(unit) + added.get(d, 0)
                if capacity >= units:
                    return True
                if level == DomainLevel.POD:  # pods of one type partition its nodes
                    per_type[domain.gpu_type] += capacity
    return job.max_domain >= DomainLevel.CLUSTER and max(per_type.values(), default=0) >= units


def _one_node_fit_test(index: FreeIndex, job: Job) -> Callable[[], bool] | None:
    """For a gang of one placement unit, an exact and cheap stand-in for "find_placement would
    succeed now": some schedulable node of an allowed type has the unit free, its CPUs and
    memory too (every level of the search reduces to that for one unit). The victim search asks
    it after every release and calls the full search only when it says yes. None for other
    gangs."""
    unit = job.unit_gpus
    if job.units != 1 or unit <= 0 or job.max_domain < DomainLevel.NODE:
        return None
    buckets = [index.buckets[t] for t in gpu_types_for(index, job)]
    needs_nvlink, needs_host = job.needs_nvlink, job.needs_host
    cpus, memory = job.unit_millicpus, job.unit_memory_mib

    def fits() -> bool:
        for by_free in buckets:
            for free in range(unit, len(by_free)):
                for node in by_free[free]:
                    if needs_nvlink and index.unit_capacity(node, unit, True) < 1:
                        continue
                    if needs_host and index.host_units(node, cpus, memory) < 1:
                        continue  # the node's CPUs or memory cannot hold the unit
                    return True
        return False

    return fits
