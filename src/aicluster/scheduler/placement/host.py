"""Placement by CPUs and memory: a gang without GPUs, and the checks and reasons that a gang's
CPUs and memory add to the GPU search."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from aicluster.core import DomainLevel, Job, Node, PendingCode, Placement
from aicluster.scheduler.index import FreeIndex
from aicluster.scheduler.locality import applies, cached_bytes, on_nodes
from aicluster.scheduler.placement.result import (
    NO_DOMAIN_FITS,
    PlacementFailure,
    build_placement,
    unit_host,
)

__all__ = ["holding_a_unit", "holds_host", "host_fragmented", "host_short", "without_gpus"]

Room = tuple[int, int, int, int]  # (free GPUs, workers it holds, free millicpus, node)


def holds_host(index: FreeIndex, node: int, job: Job, units: int) -> bool:
    return (
        not index.host_binds(job)
        or index.host_units(node, job.unit_millicpus, job.unit_memory_mib) >= units
    )


def _amounts(job: Job, units: int) -> str:
    cpus, memory = unit_host(job)
    return f"{cpus * units:g} CPUs and {memory * units:g} GB of memory"


def _fits_every_node(index: FreeIndex, job: Job) -> bool:
    """Whether a unit's CPUs and memory are within what every node has."""
    return (
        job.unit_millicpus <= index.least_millicpus
        and job.unit_memory_mib <= index.least_memory_mib
    )


def holding_a_unit(index: FreeIndex, job: Job, types: Sequence[str]) -> list[str]:
    """The GPU types whose largest node holds a unit's GPUs (only their CPUs and memory count)."""
    return [t for t in types if index.max_gpus_by_type[t] >= job.unit_gpus]


def host_short(index: FreeIndex, job: Job, types: Sequence[str]) -> PlacementFailure | None:
    """Why the gang's CPUs or memory rule it out before any search (of ``types``), or None."""
    short = _host_beyond_free(index, job)
    if not _fits_every_node(index, job):  # (the common case skips the search by type)
        short = _host_beyond_any_node(index, job, holding_a_unit(index, job, types)) or short
    return short


def _host_beyond_any_node(
    index: FreeIndex, job: Job, types: Sequence[str]
) -> PlacementFailure | None:
    """INFEASIBLE when one unit's CPUs or memory exceed what any node of ``types`` has."""
    what = "a worker" if job.workers_per_unit == 1 else "a tensor-parallel group"
    for label, needed, most_by_type, scale in (
        ("CPUs", job.unit_millicpus, index.max_millicpus_by_type, 1000),
        ("GB of memory", job.unit_memory_mib, index.max_memory_mib_by_type, 1024),
    ):
        most = max((most_by_type.get(t, 0) for t in types), default=0)
        if needed > most:
            return PlacementFailure(
                PendingCode.INFEASIBLE,
                f"{what} needs {needed / scale:g} {label} on one node; the largest node has "
                f"{most / scale:g}",
            )
    return None


def _host_beyond_free(index: FreeIndex, job: Job) -> PlacementFailure | None:
    """NO_CAPACITY when the gang's CPUs or memory exceed what is free on schedulable nodes."""
    for label, needed, free, scale in (
        ("CPUs", job.total_millicpus, index.free_millicpus_total, 1000),
        ("GB of memory", job.total_memory_mib, index.free_memory_mib_total, 1024),
    ):
        if needed > free:
            return PlacementFailure(
                PendingCode.NO_CAPACITY, f"needs {needed / scale:g} {label}, {free / scale:g} free"
            )
    return None


def host_fragmented(
    index: FreeIndex, job: Job, types: Sequence[str] | None
) -> PlacementFailure | None:
    """NO_CAPACITY naming CPUs or memory when the nodes (of ``types``; None: all) cannot hold
    the gang's units by that resource alone, however GPUs stand. Visits every node: only for
    the reason of a job that waits."""
    nodes = [
        i
        for i, node in enumerate(index.nodes)
        if index.schedulable[i] and (types is None or node.gpu_type in types)
    ]
    for label, per_unit, free, scale in (
        ("CPUs", job.unit_millicpus, index.free_millicpus, 1000),
        ("GB of memory", job.unit_memory_mib, index.free_memory_mib, 1024),
    ):
        if not per_unit:
            continue
        if sum(free[i] // per_unit for i in nodes) < job.units:
            most = max((free[i] for i in nodes), default=0)
            return PlacementFailure(
                PendingCode.NO_CAPACITY,
                f"no set of nodes has {per_unit / scale:g} {label} free for each of "
                f"{job.units} worker(s) (most free on one node: {most / scale:g})",
            )
    return None


def without_gpus(
    index: FreeIndex, job: Job, exclude: Collection[int], explain: bool
) -> Placement | PlacementFailure:
    """A gang that asks for no GPUs: each worker on a node with room for its CPUs and memory,
    preferring the nodes with the fewest free GPUs (so as not to strand a GPU job's room), then
    the best fit by CPUs (of nodes equal so far, with the locality term on, the one caching the
    most of the job's data); one node when ``max_domain`` is a node (or an NVLink domain, which
    means nothing without GPUs), else the fewest nodes."""
    if not job.needs_host:
        return PlacementFailure(PendingCode.INFEASIBLE, "a job must ask for GPUs, CPUs or memory")
    all_types = list(index.gpu_types)
    short = _host_beyond_any_node(index, job, all_types) or _host_beyond_free(index, job)
    if short is not None:
        return short
    cpus, memory, free = job.unit_millicpus, job.unit_memory_mib, index.free
    room = [
        (free[i], capacity, index.free_millicpus[i], i)
        for i in range(len(index.nodes))
        if index.schedulable[i]
        and i not in exclude
        and (capacity := index.host_units(i, cpus, memory)) > 0
    ]
    whole = [item for item in room if item[1] >= job.units]
    if whole:
        _, _, _, node = min(whole, key=_node_order(index, job))
        return build_placement(
            index, job, [(node, job.units)], DomainLevel.NODE, index.nodes[node].name
        )
    for level, domain_of in (
        (DomainLevel.RACK, lambda node: node.rack),
        (DomainLevel.POD, lambda node: node.pod),
        (DomainLevel.CLUSTER, lambda node: index.cluster.name),
    ):
        if level > job.max_domain:
            break
        found = _spread_in_domains(index, job, room, level, domain_of)
        if found is not None:
            return found
    if not explain:
        return NO_DOMAIN_FITS
    return host_fragmented(index, job, None) or PlacementFailure(
        PendingCode.TOPOLOGY, f"no node has {_amounts(job, job.units)} free"
    )


def _spread_in_domains(
    index: FreeIndex,
    job: Job,
    room: list[Room],
    level: DomainLevel,
    domain_of: Callable[[Node], str],
) -> Placement | None:
    """A gang without GPUs over several nodes of one domain at ``level``: the domain with the
    least room that holds it (best fit), filled from the nodes with the fewest free GPUs."""
    domains: dict[str, list[Room]] = {}
    for item in room:
        domains.setdefault(domain_of(index.nodes[item[3]]), []).append(item)
    fitting = [
        (total, name)
        for name, items in domains.items()
        if (total := sum(item[1] for item in items)) >= job.units
    ]
    if not fitting:
        return None
    if index.locality and applies(index, job):  # of equally roomy domains, the most cached
        _, name = min(
            fitting,
            key=lambda item: (item[0], -_domain_cached(index, job, domains[item[1]]), item[1]),
        )
    else:
        _, name = min(fitting)
    held = _cached_of(index, job)
    chosen, needed = [], job.units
    for _, capacity, _, node in sorted(
        domains[name], key=lambda item: (item[0], -item[1], -held(item[3]), item[3])
    ):
        take = min(capacity, needed)
        chosen.append((node, take))
        needed -= take
        if not needed:
            break
    return build_placement(index, job, chosen, level, name)


def _cached_of(index: FreeIndex, job: Job) -> Callable[[int], int]:
    """A node's cached bytes of the job's data; 0 for every node where the term decides
    nothing (:func:`aicluster.scheduler.locality.applies`), so the order is the plain one."""
    if index.locality and applies(index, job):
        return lambda node: cached_bytes(index, job, node)
    return lambda node: 0


def _node_order(index: FreeIndex, job: Job) -> Callable[[Room], tuple[int, ...]]:
    """The one node for a gang without GPUs: the fewest free GPUs, the best fit by workers and
    by CPUs, then (locality) the most cached, then the first."""
    held = _cached_of(index, job)
    return lambda item: (item[0], item[1], item[2], -held(item[3]), item[3])


def _domain_cached(index: FreeIndex, job: Job, items: list[Room]) -> int:
    return on_nodes(index, job, (item[3] for item in items))
