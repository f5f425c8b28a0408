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

The search is here; who may be preempted, in which order, is :mod:`.candidates`;
releasing them and giving back the unneeded is :mod:`.release`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aicluster.core import DomainLevel, Job
from aicluster.scheduler.entries import PendingEntry, RunningEntry, job_shape
from aicluster.scheduler.index import FreeIndex
from aicluster.scheduler.placement import gpu_types_for
from aicluster.scheduler.preemption.candidates import (
    CandidateList,
    PreemptionContext,
    by_rank,
    gpus_per_node,
    list_candidates,
    shared_candidates,
)
from aicluster.scheduler.preemption.release import Victims, free_until_fits
from aicluster.scheduler.state import SchedulerState

__all__ = ["find_victims", "preemption_possible"]


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


def find_victims(
    context: PreemptionContext, entry: PendingEntry, types: Sequence[str]
) -> Victims | None:
    """Victims whose preemption lets ``entry`` fit, or None. Leaves the index as it found it
    unless victims are returned, in which case their GPUs stay released (tentatively).

    The context's ``failed`` remembers searches that found nothing, by job shape and candidate
    list (the jobs and the right by which each is a candidate), with the index version they
    saw: a job of the same shape facing the same candidates on an unchanged index fails alike.
    ``listed`` likewise remembers candidate lists (the running jobs do not change during a
    cycle; ``taken`` only grows, and a list drops the jobs taken since it was made)."""
    state, job = context.state, entry.job
    if not context.shortcuts.enabled:  # the plain search: every candidate, released in order
        found = list_candidates(context, entry, types)
        if _too_few_gpus(state, job, types, found.rank(context)):
            return None
        return free_until_fits(context, job, types, found, True)
    # Shortcut: the candidate list shared with the cycle's other jobs, the searches that cannot
    # succeed answered from the capacity histograms (their side effect on the buckets' order
    # replayed), and failures remembered by the index version they saw.
    found = shared_candidates(context, entry, types)
    if not found.kinds:
        return None
    victims = found.released_at_most(context)
    if _too_few_gpus(state, job, types, victims, found.pool_gpus):
        return None
    shape = job_shape(job)
    may_fit = _fits_if_pool_freed(context, found, job, shape)
    if not may_fit and _failure_replayed(context, found):
        return None
    return _search_unless_failed(context, found, job, types, shape, may_fit)


def _fits_if_pool_freed(
    context: PreemptionContext, found: CandidateList, job: Job, shape: tuple[object, ...]
) -> bool:
    """Whether a job of ``shape`` could fit were every candidate ``found`` may release freed
    (:func:`_fits_if_all_freed`), remembered by the index's content version."""
    index = context.state.index
    freed = found.freed_per_node(index)
    content = index.content_version
    fits_all = found.fits_all.get(shape)
    if fits_all is None or fits_all[0] != content:
        victims = found.released_at_most(context)
        fits_all = found.fits_all[shape] = (content, _fits_if_all_freed(index, job, victims, freed))
    return fits_all[1]


def _failure_replayed(context: PreemptionContext, found: CandidateList) -> bool:
    """For a search that would fail: whether the index was left as the search would leave it,
    without running it (then there is nothing more to do). Its round trip reorders the nodes it
    touches, but the order of fully allocated nodes is read by no search: only the victims on
    nodes with free GPUs count, and only their order (without quotas no reclaim skips a
    victim)."""
    state = context.state
    index = state.index
    whole = len(found.kinds) <= state.config.max_victims
    content = index.content_version
    if found.seen is not None and found.seen[0] == content:
        seen = found.seen[1]
    else:
        victims, freed = found.released_at_most(context), found.freed_per_node(index)
        seen = _seen(index, victims, found.nodes_per_victim(index), freed)
        if whole and not state.quotas_active:
            seen = by_rank(context, found.kinds, seen)
        found.seen = (content, seen)
    if not seen:
        return True
    return (
        whole
        and not state.quotas_active
        and index.round_trip([victim.placement.slots for victim in seen])
    )


def _search_unless_failed(
    context: PreemptionContext,
    found: CandidateList,
    job: Job,
    types: Sequence[str],
    shape: tuple[object, ...],
    may_fit: bool,
) -> Victims | None:
    """The search itself, unless one for the same shape and candidates failed on this very
    index (the context's ``failed``)."""
    index, failed = context.state.index, context.failed
    ranked = found.rank(context)
    # The victims' kinds belong to the key: with quotas, jobs of two tenants may list the same
    # victims by different rights (a reclaim victim is released only while its tenant borrows),
    # so one's failure is not the other's.
    kinds = tuple(found.kinds[victim.job.id] for victim in ranked)
    key = (shape, tuple(types), found.seqs, kinds)
    if failed.get(key) == index.version:
        return None
    # The ranked candidates are the pool itself (all of them, or the max_victims first ranked),
    # so whether releasing them all could make the job fit is ``may_fit``, on an unchanged index.
    result = free_until_fits(context, job, types, found, may_fit)
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
    freed = gpus_per_node(index, candidates) if freed_per_node is None else freed_per_node
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
        by_capacity = index.by_capacity(level == DomainLevel.RACK, unit)
        if by_capacity is not None and level == DomainLevel.RACK:
            # Shortcut: a domain that holds the gang as it is, from the buckets by capacity,
            # else one of the few the candidates free units on (the plain loop asks them all;
            # its sums per type matter only at the pod level).
            if by_capacity.holds(units, per_type):
                return True
            capacities = by_capacity.capacity
            if any(
                capacities[d] + extra >= units and domains[d].gpu_type in per_type
                for d, extra in added.items()
            ):
                return True
            continue
        for d, domain in enumerate(domains):
            if domain.gpu_type in per_type:
                capacity = domain.capacity(unit) + added.get(d, 0)
                if capacity >= units:
                    return True
                if level == DomainLevel.POD:  # pods of one type partition its nodes
                    per_type[domain.gpu_type] += capacity
    return job.max_domain >= DomainLevel.CLUSTER and max(per_type.values(), default=0) >= units
