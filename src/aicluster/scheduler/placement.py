"""Topology-aware gang placement.

A gang of ``units`` placement units of ``unit`` GPUs (see :class:`aicluster.core.Job`) goes into
the *lowest* topology level that can hold it — one node, then one rack, then one pod, then the
cluster — never wider than the job's ``max_domain``. Within a level the domain is chosen by best fit
(the fullest domain that still fits, limiting fragmentation); within the domain the gang takes the
fewest nodes, ending on the best-fitting node.

CPUs and memory go with each unit: a node takes only as many units as its free CPUs and memory
hold too. A job without GPUs is a gang of workers placed by CPUs and memory alone, on the nodes
whose GPUs it would strand least (no free GPUs first), one node when ``max_domain`` says so.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container, Iterable, Sequence
from dataclasses import dataclass

from aicluster.core import DomainLevel, Job, Node, PendingCode, Placement, Slot
from aicluster.scheduler.index import Domain, FreeIndex, spread

__all__ = ["PlacementFailure", "find_placement", "gpu_types_for"]

_NOTHING: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class PlacementFailure:
    code: PendingCode
    message: str


def gpu_types_for(index: FreeIndex, job: Job) -> list[str]:
    return [t for t in index.gpu_types if job.gpu_type in ("any", t)]


def find_placement(
    index: FreeIndex,
    job: Job,
    *,
    exclude: Collection[int] = _NOTHING,
    types: Sequence[str] | None = None,
    explain: bool = True,
) -> Placement | PlacementFailure:
    """Where ``job``'s gang fits now, or why it does not. Never changes ``index``.

    ``exclude`` holds node indices not to use; ``types`` narrows the GPU types allowed. Without
    ``explain`` a topology failure says only that no domain fits (working out the largest one
    for the message visits every domain again: a victim search, which only asks whether the
    job fits, would pay for it at every step).
    """
    unit = job.unit_gpus
    if unit <= 0:
        return _without_gpus(index, job, exclude, explain)
    allowed = gpu_types_for(index, job)
    types = allowed if types is None else [t for t in allowed if t in types]
    if not types:
        return PlacementFailure(PendingCode.INFEASIBLE, f"no node has GPU type {job.gpu_type}")
    largest = max(index.max_gpus_by_type[t] for t in types)
    if unit > largest:
        return PlacementFailure(
            PendingCode.INFEASIBLE,
            f"a worker needs {unit} GPUs on one node; the largest node has {largest}",
        )
    # Free GPUs on excluded (reserved) nodes are not free for this job: counting them out here
    # fails a blocked job at once instead of after a search over every domain.
    free = sum(index.free_by_type[t] for t in types) - _excluded_free(index, exclude, types)
    if free < job.total_gpus:
        return PlacementFailure(
            PendingCode.NO_CAPACITY, f"needs {job.total_gpus} GPUs, {free} free"
        )
    if job.needs_host:
        short = _host_beyond_free(index, job)
        if not _fits_every_node(index, job):  # (the common case skips the search by type)
            short = _host_beyond_any_node(index, job, _holding_a_unit(index, job, types)) or short
        if short is not None:
            return short
    if job.max_domain == DomainLevel.NVLINK:
        return _in_one_nvlink_domain(index, job, types, exclude) or PlacementFailure(
            PendingCode.TOPOLOGY, f"no NVLink domain has {job.total_gpus} free GPUs"
        )
    if job.total_gpus <= largest:
        found = _on_one_node(index, job, types, exclude)
        if found is not None:
            return found
    for level, domains in (
        (DomainLevel.RACK, index.racks),
        (DomainLevel.POD, index.pods),
    ):
        if level > job.max_domain:
            break
        found = _in_domains(index, job, [d for d in domains if d.gpu_type in types], exclude)
        if found is not None:
            return found
    if job.max_domain >= DomainLevel.CLUSTER:
        for gpu_type in types:
            # The pods of a type hold all its nodes: if their capacities (which count excluded
            # nodes and ignore NVLink splits, so they can only be larger) fall short, so does
            # packing, which would visit every node of the type to find out.
            if sum(d.capacity(unit) for d in index.pods if d.gpu_type == gpu_type) < job.units:
                continue
            placed = _pack(index, job, index.nodes_of_type[gpu_type], exclude)
            if placed is not None:
                return _placement(index, job, placed, DomainLevel.CLUSTER, index.cluster.name)
    if not explain:
        return _NO_DOMAIN_FITS
    if job.needs_host:
        short = _host_fragmented(index, job, _holding_a_unit(index, job, types))
        if short is not None:
            return short
    return _topology_failure(index, job, types)


_NO_DOMAIN_FITS = PlacementFailure(PendingCode.TOPOLOGY, "no domain fits the gang")


def _excluded_free(index: FreeIndex, exclude: Collection[int], types: Sequence[str]) -> int:
    free, schedulable, nodes = index.free, index.schedulable, index.nodes
    return sum(free[i] for i in exclude if schedulable[i] and nodes[i].gpu_type in types)


def _on_one_node(
    index: FreeIndex, job: Job, types: Sequence[str], exclude: Container[int]
) -> Placement | None:
    """Best fit: the node with the fewest free GPUs that still holds the whole gang."""
    best: tuple[int, int] | None = None
    for gpu_type in types:
        buckets = index.buckets[gpu_type]
        for free in range(job.total_gpus, len(buckets)):
            if best is not None and free >= best[0]:
                break
            node = _first_fitting(index, job, buckets[free], exclude)
            if node is not None:
                best = (free, node)
                break
    if best is None:
        return None
    return _placement(
        index, job, [(best[1], job.units)], DomainLevel.NODE, index.nodes[best[1]].name
    )


def _in_one_nvlink_domain(
    index: FreeIndex, job: Job, types: Sequence[str], exclude: Container[int]
) -> Placement | None:
    """The whole gang inside one NVLink domain: best fit by the domain's free GPUs."""
    best: tuple[int, int, int] | None = None  # (free in domain, node, domain)
    for gpu_type in types:
        for bucket in index.buckets[gpu_type][job.total_gpus :]:
            for node in bucket:
                if node in exclude or not _holds_host(index, node, job, job.units):
                    continue
                split = index.nvlink_free[node] or [index.free[node]]
                for domain, free in enumerate(split):
                    if free >= job.total_gpus and (best is None or free < best[0]):
                        best = (free, node, domain)
    if best is None:
        return None
    _, node, domain = best
    name = index.nodes[node].name
    cpus, memory = _unit_host(job)
    slots = tuple(Slot(name, job.unit_gpus, domain, cpus, memory) for _ in range(job.units))
    return Placement(slots, DomainLevel.NVLINK, f"{name}/nvlink-{domain}", {"nodes": 1.0})


def _first_fitting(
    index: FreeIndex, job: Job, bucket: Iterable[int], exclude: Container[int]
) -> int | None:
    for node in bucket:
        if node in exclude:
            continue
        if index.unit_capacity(node, job.unit_gpus, job.needs_nvlink) >= job.units and (
            not job.needs_host
            or index.host_units(node, job.unit_millicpus, job.unit_memory_mib) >= job.units
        ):
            return node
    return None


def _in_domains(
    index: FreeIndex, job: Job, domains: Sequence[Domain], exclude: Container[int]
) -> Placement | None:
    """Best-fit domain by unit capacity, then the fewest nodes inside it."""
    fitting = [
        (capacity, position, domain)
        for position, domain in enumerate(domains)
        if (capacity := domain.capacity(job.unit_gpus)) >= job.units
    ]
    fitting.sort(key=lambda item: (item[0], item[1]))
    for _, _, domain in fitting:
        placed = _pack(index, job, domain.nodes, exclude)
        if placed is not None:
            return _placement(index, job, placed, domain.level, domain.name)
    return None


def _pack(
    index: FreeIndex, job: Job, nodes: Sequence[int], exclude: Container[int]
) -> list[tuple[int, int]] | None:
    """Units per node using the fewest nodes: fill the roomiest, finish on the best fit."""
    unit, needed = job.unit_gpus, job.units
    free, schedulable = index.free, index.schedulable
    if job.needs_nvlink:
        capacities = [
            (capacity, node)
            for node in nodes
            if schedulable[node]
            and node not in exclude
            and (capacity := index.unit_capacity(node, unit, True)) > 0
        ]
    else:  # the hot path: capacity is just free // unit, so skip the method call
        capacities = [
            (capacity, node)
            for node in nodes
            if (capacity := free[node] // unit) > 0 and schedulable[node] and node not in exclude
        ]
    if job.needs_host:  # a node takes only the units its CPUs and memory hold too
        cpus, memory, host_units = job.unit_millicpus, job.unit_memory_mib, index.host_units
        capacities = [
            (bounded, node)
            for capacity, node in capacities
            if (bounded := min(capacity, host_units(node, cpus, memory))) > 0
        ]
    if sum(capacity for capacity, _ in capacities) < needed:
        return None
    capacities.sort(key=lambda item: (-item[0], item[1]))
    chosen: list[tuple[int, int]] = []
    for position, (capacity, node) in enumerate(capacities):
        finishing = [c for c in capacities[position:] if c[0] >= needed]
        if finishing:
            _, best_node = min(finishing, key=lambda item: (item[0], item[1]))
            chosen.append((best_node, needed))
            return chosen
        chosen.append((node, capacity))
        needed -= capacity
    return None


def _placement(
    index: FreeIndex,
    job: Job,
    units_per_node: list[tuple[int, int]],
    level: DomainLevel,
    domain: str,
) -> Placement:
    slots = [
        slot for node, count in units_per_node for slot in _node_slots(index, node, count, job)
    ]
    powered = sum(1 for node, _ in units_per_node if index.powered(node))
    left = sum(index.free[node] for node, _ in units_per_node) - job.total_gpus
    score = {
        "nodes": float(len(units_per_node)),
        "powered_nodes": float(powered),
        "free_left_on_nodes": float(left),
        "level": float(level),
    }
    return Placement(tuple(slots), level, domain, score)


def _node_slots(index: FreeIndex, node: int, count: int, job: Job) -> list[Slot]:
    """Slots for ``count`` units on one node: each unit in the fullest NVLink domain that fits."""
    name, unit = index.nodes[node].name, job.unit_gpus
    cpus, memory = _unit_host(job)
    split = index.nvlink_free[node]
    if split is None:
        return [Slot(name, unit, 0, cpus, memory)] * count
    local, slots = list(split), []
    for _ in range(count):
        fits = [d for d, free in enumerate(local) if free >= unit]
        if fits:
            domain = min(fits, key=lambda d: (local[d], d))
            local[domain] -= unit
            slots.append(Slot(name, unit, domain, cpus, memory))
        else:  # a unit wider than an NVLink domain (no tensor parallelism across it)
            for domain, step in spread(local, -unit, index.nodes[node].nvlink_size):
                local[domain] += step
            slots.append(Slot(name, unit, -1, cpus, memory))
    return slots


def _unit_host(job: Job) -> tuple[float, float]:
    """The CPUs and memory (GB) of one placement unit: its workers' together."""
    if not job.needs_host:
        return 0.0, 0.0
    workers = job.workers_per_unit
    return job.cpus_per_worker * workers, job.memory_gb_per_worker * workers


def _holds_host(index: FreeIndex, node: int, job: Job, units: int) -> bool:
    return (
        not job.needs_host
        or index.host_units(node, job.unit_millicpus, job.unit_memory_mib) >= units
    )


def _spread_in_domains(
    index: FreeIndex,
    job: Job,
    room: list[tuple[int, int, int, int]],
    level: DomainLevel,
    domain_of: Callable[[Node], str],
) -> Placement | None:
    """A gang without GPUs over several nodes of one domain at ``level``: the domain with the
    least room that holds it (best fit), filled from the nodes with the fewest free GPUs."""
    domains: dict[str, list[tuple[int, int, int, int]]] = {}
    for item in room:
        domains.setdefault(domain_of(index.nodes[item[3]]), []).append(item)
    fitting = [
        (total, name)
        for name, items in domains.items()
        if (total := sum(item[1] for item in items)) >= job.units
    ]
    if not fitting:
        return None
    _, name = min(fitting)
    chosen, needed = [], job.units
    for _, capacity, _, node in sorted(
        domains[name], key=lambda item: (item[0], -item[1], item[3])
    ):
        take = min(capacity, needed)
        chosen.append((node, take))
        needed -= take
        if not needed:
            break
    return _placement(index, job, chosen, level, name)


# -- CPUs and memory ------------------------------------------------------------------------


def _amounts(job: Job, units: int) -> str:
    cpus, memory = _unit_host(job)
    return f"{cpus * units:g} CPUs and {memory * units:g} GB of memory"


def _fits_every_node(index: FreeIndex, job: Job) -> bool:
    """Whether a unit's CPUs and memory are within what every node has."""
    return (
        job.unit_millicpus <= index.least_millicpus
        and job.unit_memory_mib <= index.least_memory_mib
    )


def _holding_a_unit(index: FreeIndex, job: Job, types: Sequence[str]) -> list[str]:
    """The GPU types whose largest node holds a unit's GPUs (only their CPUs and memory count)."""
    return [t for t in types if index.max_gpus_by_type[t] >= job.unit_gpus]


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


def _host_fragmented(
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


def _without_gpus(
    index: FreeIndex, job: Job, exclude: Collection[int], explain: bool
) -> Placement | PlacementFailure:
    """A gang that asks for no GPUs: each worker on a node with room for its CPUs and memory,
    preferring the nodes with the fewest free GPUs (so as not to strand a GPU job's room), then
    the best fit by CPUs; one node when ``max_domain`` is a node (or an NVLink domain, which
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
        _, _, _, node = min(whole)
        return _placement(index, job, [(node, job.units)], DomainLevel.NODE, index.nodes[node].name)
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
        return _NO_DOMAIN_FITS
    return _host_fragmented(index, job, None) or PlacementFailure(
        PendingCode.TOPOLOGY, f"no node has {_amounts(job, job.units)} free"
    )


def _topology_failure(index: FreeIndex, job: Job, types: Sequence[str]) -> PlacementFailure:
    unit, level = job.unit_gpus, job.max_domain
    if level <= DomainLevel.NODE:
        where, domains = "node", []
    elif level == DomainLevel.RACK:
        where, domains = "rack", [d for d in index.racks if d.gpu_type in types]
    else:
        where, domains = "pod", [d for d in index.pods if d.gpu_type in types]
    shape = f"{job.total_gpus} GPUs" + (f" in groups of {unit}" if unit > 1 else "")
    if domains:
        capacities = [domain.capacity(unit) for domain in domains]
        most = max(capacities)
        best = domains[capacities.index(most)]  # the first of the largest, as max() takes
        return PlacementFailure(
            PendingCode.TOPOLOGY, f"no {where} fits {shape} (most: {most * unit} in {best.name})"
        )
    return PlacementFailure(
        PendingCode.TOPOLOGY, f"free GPUs are fragmented: no set of nodes fits {shape}"
    )
