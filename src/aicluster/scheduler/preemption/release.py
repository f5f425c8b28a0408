"""Releasing victims: candidates freed in rank order until the waiting job fits, then those it
turned out not to need given back (costliest first).

A reclaim victim is taken only while its tenant is still borrowing once the victims before it
are gone (Kueue's rule; see :mod:`.search`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from aicluster.core import DomainLevel, Job, Placement, VictimKind
from aicluster.scheduler.entries import RunningEntry
from aicluster.scheduler.index import FreeIndex
from aicluster.scheduler.placement import find_placement, gpu_types_for
from aicluster.scheduler.preemption.candidates import (
    CandidateKinds,
    CandidateList,
    PreemptionContext,
    UsageDelta,
    over_quota,
)
from aicluster.scheduler.state import SchedulerState

__all__ = ["Victims", "free_until_fits"]


@dataclass(frozen=True, slots=True)
class Victims:
    jobs: list[RunningEntry]
    kinds: dict[str, VictimKind]  # job id -> the right it is preempted by
    placement: Placement


def free_until_fits(
    context: PreemptionContext,
    job: Job,
    types: Sequence[str],
    listed: CandidateList,
    may_fit: bool,
) -> Victims | None:
    """Release the ranked candidates ``listed`` in order until the job fits, then give back those
    it turned out not to need. ``may_fit``: whether releasing them all could make the job fit
    (False only with shortcuts, where the capacity histograms tell)."""
    state, delta, shortcuts = context.state, context.usage_delta, context.shortcuts.enabled
    index = state.index
    candidates, kinds = listed.rank(context), listed.kinds
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
    kinds: CandidateKinds,
    delta: UsageDelta,
) -> Iterator[RunningEntry]:
    """The candidates the search releases, in order: a reclaim victim is skipped once its
    tenant stopped borrowing with the victims before it."""
    released = dict(delta)  # usage changes so far: the cycle's, then this search's victims
    for victim in candidates:
        key = (victim.job.tenant, victim.gpu_type)
        if kinds[victim.job.id] is VictimKind.RECLAIM and over_quota(state, released, *key) <= 0:
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
