"""EASY backfill reservations (Lifka, 1995), made topology-aware.

When the first job in order cannot be placed, it reserves the nodes it will wait for: the domain
at its level with the most free capacity, and in it the nodes closest to drained. Later jobs may
use reserved nodes only if their estimated end comes before the reservation's estimated start;
without estimates (the start is unknown) they may use only capacity outside the reservation, so
nothing ever delays the head job.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

from aicluster.core import DomainLevel, Job
from aicluster.scheduler.entries import job_shape
from aicluster.scheduler.index import FreeIndex
from aicluster.scheduler.state import SchedulerState

__all__ = ["Reservation", "reserve"]


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: str
    nodes: frozenset[int]
    start: float  # estimated; math.inf when running jobs on the nodes give no estimates

    def admits(self, job: Job, now: float) -> bool:
        """Whether ``job`` may use reserved nodes: only if it surely ends before the start (so
        never while the start is unknown)."""
        estimate = job.duration_estimate
        return estimate is not None and not math.isinf(self.start) and now + estimate <= self.start

    def describe(self, index: FreeIndex) -> str:
        names = sorted(index.nodes[i].name for i in self.nodes)
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        when = "" if math.isinf(self.start) else f", expected at t={self.start:.0f}s"
        return f"job {self.job_id} holds a reservation on {shown}{when}"


def reserve(
    state: SchedulerState,
    job: Job,
    types: Sequence[str],
    now: float,
    admitted_ends: Mapping[int, float],
) -> Reservation | None:
    """The head job's reservation. ``admitted_ends`` maps nodes to the latest estimated end of
    jobs admitted earlier in this cycle (math.inf when one gives no estimate)."""
    if job.unit_gpus <= 0:
        return None
    nodes = _reserved_nodes(state.index, job, types)
    if nodes is None:
        return None
    start = _estimated_start(state, nodes, now, admitted_ends)
    return Reservation(job.id, frozenset(nodes), start)


def _reserved_nodes(index: FreeIndex, job: Job, types: Sequence[str]) -> tuple[int, ...] | None:
    """The nodes to reserve, remembered across cycles by the index's content hash: like a
    placement failure they depend only on how many GPUs are free where (the groups, the drain
    order and the best node are all chosen by free GPUs, ties by node index)."""
    content = index.content_hash
    key = None if content is None else ("reserve", job_shape(job), tuple(types), content)
    if key is not None and key in index.content_memo:
        return index.content_memo[key]  # type: ignore[return-value]
    found = None
    for group in _candidate_groups(index, job, types):
        nodes = _drain_set(index, group, job)
        if nodes is not None:
            found = tuple(nodes)
            break
    if key is not None:
        index.remember(key, found)
    return found


def _candidate_groups(index: FreeIndex, job: Job, types: Sequence[str]) -> Iterable[Sequence[int]]:
    """Node groups at the job's lowest feasible level, most free capacity first.

    Levels are built only when reached (a cycle reserves for its blocked head every time, and
    listing every node of a large cluster per cycle dominated simulation time)."""
    unit, units = job.unit_gpus, job.units

    def total_units(nodes: Sequence[int]) -> int:
        return sum(index.nodes[i].gpus // unit for i in nodes if index.schedulable[i])

    for level in (DomainLevel.NODE, DomainLevel.RACK, DomainLevel.POD, DomainLevel.CLUSTER):
        if level > job.max_domain:
            break
        if level == DomainLevel.NODE:
            if job.total_gpus > index.max_gpus:
                continue
            best = _best_node(index, job, types)
            if best is not None:
                return [[best]]
            continue
        by_capacity = None
        if level != DomainLevel.CLUSTER:
            by_capacity = index.by_capacity(level == DomainLevel.RACK, unit)
        if by_capacity is not None:
            # Shortcut: the domains that hold the gang once free, freest first, from buckets
            # kept by capacity (index/fit.py) rather than by summing every node of the level.
            freest = iter(by_capacity.freest(units, types))
            first = next(freest, None)
            if first is not None:  # (the first always holds the gang: the rest are not listed)
                return chain([first.nodes], (domain.nodes for domain in freest))
            continue
        fitting = [g for g in _groups(index, level, types) if total_units(g) >= units]
        if fitting:
            return sorted(fitting, key=lambda g: -_free_units(index, g, unit))
    return []


def _best_node(index: FreeIndex, job: Job, types: Sequence[str]) -> int | None:
    """The schedulable node, big enough for the whole gang, with the most free units (the
    lowest index among equals): what sorting every node by free units would put first, found
    by walking the free-GPU buckets from the top."""
    unit, units = job.unit_gpus, job.units
    nodes = index.nodes
    for level in range(index.max_gpus // unit, -1, -1):
        found = [
            i
            for t in types
            for free in range(level * unit, min((level + 1) * unit, index.max_gpus + 1))
            for i in index.buckets[t][free]
            if nodes[i].gpus // unit >= units
        ]
        if found:
            return min(found)
    return None


def _groups(index: FreeIndex, level: DomainLevel, types: Sequence[str]) -> list[list[int]]:
    if level == DomainLevel.RACK:
        return [d.nodes for d in index.racks if d.gpu_type in types]
    if level == DomainLevel.POD:
        return [d.nodes for d in index.pods if d.gpu_type in types]
    return _per_type(index, types)


def _per_type(index: FreeIndex, types: Sequence[str]) -> list[list[int]]:
    return [index.nodes_of_type[t] for t in types]  # read only


def _free_units(index: FreeIndex, nodes: Sequence[int], unit: int) -> int:
    return sum(index.free[i] // unit for i in nodes if index.schedulable[i])


def _drain_set(index: FreeIndex, nodes: Sequence[int], job: Job) -> list[int] | None:
    """The fewest nodes, freest first, whose full capacity holds the gang."""
    unit, needed = job.unit_gpus, job.units
    usable = [i for i in nodes if index.schedulable[i] and index.nodes[i].gpus >= unit]
    usable.sort(key=lambda i: (-index.free[i], i))
    chosen: list[int] = []
    for i in usable:
        chosen.append(i)
        needed -= index.nodes[i].gpus // unit
        if needed <= 0:
            return chosen
    return None


def _estimated_start(
    state: SchedulerState, nodes: Sequence[int], now: float, admitted_ends: Mapping[int, float]
) -> float:
    """When every job on the reserved nodes is expected to end (inf if any lacks an estimate)."""
    start = now
    for i in nodes:
        start = max(start, admitted_ends.get(i, now))
        for job_id in state.node_jobs[i]:
            running = state.running[job_id]
            estimate = running.job.duration_estimate
            if estimate is None:
                return math.inf
            left = (estimate - running.executed_before) / running.speed  # wall seconds
            start = max(start, running.started_at + left)
    return start
