"""Shortcut: stopping a quiet cycle (one without per-job reasons) once no later job can start.

The plain cycle considers every pending job; these tests prove, from what is free and what the
queue holds, that every job still to come would only wait, so the simulator's cycle may stop
there. Exact (the same decisions): a property test replays random scenarios with and without
them (``scheduler.shortcuts``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Protocol

from aicluster.core import DomainLevel, Job, Placement
from aicluster.scheduler.backfill import Reservation
from aicluster.scheduler.config import SchedulerConfig
from aicluster.scheduler.index import FreeIndex
from aicluster.scheduler.memo import CycleMemo
from aicluster.scheduler.placement import PlacementFailure
from aicluster.scheduler.state import SchedulerState

__all__ = ["CycleView", "nothing_fits", "only_reserved_free"]


class CycleView(Protocol):
    """What the early stops read of a cycle."""

    state: SchedulerState
    index: FreeIndex
    config: SchedulerConfig
    memo: CycleMemo
    reservation: Reservation | None

    def types_for(self, job: Job) -> tuple[list[str], tuple[str, ...]]: ...

    def place(
        self, job: Job, types: list[str], shape: Hashable | None = None
    ) -> Placement | PlacementFailure: ...


def only_reserved_free(cycle: CycleView) -> bool:
    """Whether every free GPU lies on the nodes reserved for a blocked head of unknown start
    (which no job may use): then every later job of GPUs only waits."""
    reservation = cycle.reservation
    if reservation is None or not math.isinf(reservation.start):
        return False
    if cycle.state.pending_without_gpus:  # they need no GPU: the free ones decide nothing
        return False
    index = cycle.index
    version, answer = cycle.memo.reserved_free_at
    if version == index.version:  # the reservation is fixed once made: only GPUs change
        return answer
    reserved = sum(index.free[i] for i in reservation.nodes if index.schedulable[i])
    answer = reserved == sum(index.free_by_type.values())
    cycle.memo.reserved_free_at = (index.version, answer)
    return answer


def nothing_fits(cycle: CycleView) -> bool:
    """Whether no queued job of any shape can be placed outside the reservation (one of
    unknown start, which admits no one onto its nodes): then, with preemption over, every
    later job only waits. Jobs of one shape fit alike (the placement memo's premise), and
    the types a job is admitted to are among those its GPU type allows, so one search per
    shape over every allowed type decides for all, and a shape no easier to fit than one
    that failed is not searched (:func:`_no_easier`); elastic jobs (which may fit smaller)
    and a known start (short jobs may use reserved nodes) keep the cycle going."""
    reservation, state = cycle.reservation, cycle.state
    if reservation is None or not math.isinf(reservation.start) or state.pending_elastic:
        return False
    if state.budgets is not None:  # their check allocates tentatively
        return False
    version, answer = cycle.memo.nothing_fits_at
    if version == cycle.index.version:
        return answer
    answer = True
    outside: dict[tuple[str, ...], int] = {}  # free GPUs off the reserved nodes, by types
    failed: list[Job] = []
    for shape, job in _shape_heads(cycle):
        types, key = cycle.types_for(job)  # the smallest is likeliest to fit: tried first
        if not types:
            continue
        free = outside.get(key)
        if free is None:
            free = outside[key] = _free_outside(cycle.index, reservation.nodes, types)
        if job.total_gpus > free:  # find_placement's first test: it would fail at once
            continue
        if any(_no_easier(job, smaller) for smaller in failed):
            continue
        if isinstance(cycle.place(job, types, shape), Placement):
            answer = False
            break
        failed.append(job)
    cycle.memo.nothing_fits_at = (cycle.index.version, answer)
    return answer


def _free_outside(index: FreeIndex, reserved: frozenset[int], types: list[str]) -> int:
    """Free GPUs of ``types`` off the ``reserved`` nodes (what find_placement counts)."""
    free, schedulable, nodes = index.free, index.schedulable, index.nodes
    held = sum(free[i] for i in reserved if schedulable[i] and nodes[i].gpu_type in types)
    return sum(index.free_by_type[t] for t in types) - held


def _shape_heads(cycle: CycleView) -> list[tuple[Hashable, Job]]:
    """One queued job per shape, smallest first (the queue does not change during a cycle,
    so this is listed once)."""
    if cycle.memo.shape_heads is None:
        state = cycle.state
        heads: dict[Hashable, Job] = {}
        for lane, items in state.lanes.items():
            if lane[1] not in heads:
                heads[lane[1]] = state.pending[items[0][2]].job
        cycle.memo.shape_heads = sorted(heads.items(), key=lambda item: item[1].total_gpus)
    return cycle.memo.shape_heads


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
