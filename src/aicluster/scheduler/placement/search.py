"""Topology-aware gang placement.

A gang of ``units`` placement units of ``unit`` GPUs (see :class:`aicluster.core.Job`) goes into
the *lowest* topology level that can hold it — one node, then one rack, then one pod, then the
cluster — never wider than the job's ``max_domain``. Within a level the domain is chosen by best fit
(the fullest domain that still fits, limiting fragmentation); within the domain the gang takes the
fewest nodes, ending on the best-fitting node.

CPUs and memory go with each unit: a node takes only as many units as its free CPUs and memory
hold too. A job without GPUs is a gang of workers placed by CPUs and memory alone, on the nodes
whose GPUs it would strand least (no free GPUs first), one node when ``max_domain`` says so.

The search by GPUs is here; CPUs and memory, and a gang without GPUs, are :mod:`.host`;
the slots of a placement found and the failure's reason are :mod:`.result`; the
topology-oblivious baseline (``placement.strategy: random``) is :mod:`.random`.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Iterable, Sequence

from aicluster.core import DomainLevel, Job, PendingCode, Placement, Slot
from aicluster.scheduler.index import Domain, FreeIndex
from aicluster.scheduler.locality import applies, cached_bytes, on_nodes
from aicluster.scheduler.placement.host import (
    holding_a_unit,
    holds_host,
    host_fragmented,
    host_short,
    without_gpus,
)
from aicluster.scheduler.placement.pipeline import by_rack_in_pipelines, units_per_pipeline
from aicluster.scheduler.placement.random import place_at_random
from aicluster.scheduler.placement.result import (
    NO_DOMAIN_FITS,
    PlacementFailure,
    build_placement,
    fewest_nodes,
    gpu_capacity,
    gpu_shape,
    unit_host,
)

__all__ = ["find_placement", "gpu_types_for"]

_NOTHING: frozenset[int] = frozenset()


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
        return without_gpus(index, job, exclude, explain)
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
        shape, capacity = gpu_shape(job, largest), gpu_capacity(index, job, types)
        return PlacementFailure(
            PendingCode.NO_CAPACITY, f"needs {shape}; the cluster has {capacity}, {free} free"
        )
    if index.host_binds(job):
        short = host_short(index, job, types)
        if short is not None:
            return short
    if job.max_domain == DomainLevel.NVLINK:
        return _in_one_nvlink_domain(index, job, types, exclude) or PlacementFailure(
            PendingCode.TOPOLOGY, f"no NVLink domain has {job.total_gpus} free GPUs"
        )
    if index.random_seed is None:
        found = _in_narrowest_domain(index, job, types, exclude, largest)
    else:  # the topology-oblivious baseline
        found = place_at_random(index, job, types, exclude, index.random_seed)
    if found is not None:
        return found
    if not explain:
        return NO_DOMAIN_FITS
    return _why_no_domain_fits(index, job, types)


def _in_narrowest_domain(
    index: FreeIndex, job: Job, types: Sequence[str], exclude: Collection[int], largest: int
) -> Placement | None:
    """The gang on one node, else in the best-fitting rack, then pod, then over the cluster, no
    wider than the job's ``max_domain``. ``largest``: the most GPUs a node of ``types`` has."""
    unit = job.unit_gpus
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
        by_capacity = index.by_capacity(level == DomainLevel.RACK, unit)
        if by_capacity is not None and not (index.locality and applies(index, job)):
            # Shortcut: the fitting domains in best-fit order from buckets kept by capacity, not
            # by asking every domain (index/fit.py; the order _in_domains sorts them in).
            found = _pack_first(index, job, by_capacity.best_fit(job.units, types), exclude)
        else:
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
                return build_placement(index, job, placed, DomainLevel.CLUSTER, index.cluster.name)
    return None


def _excluded_free(index: FreeIndex, exclude: Collection[int], types: Sequence[str]) -> int:
    free, schedulable, nodes = index.free, index.schedulable, index.nodes
    return sum(free[i] for i in exclude if schedulable[i] and nodes[i].gpu_type in types)


def _on_one_node(
    index: FreeIndex, job: Job, types: Sequence[str], exclude: Container[int]
) -> Placement | None:
    """Best fit: the node with the fewest free GPUs that still holds the whole gang."""
    best: tuple[int, int] | None = None
    # Shortcut (index.fit_shortcut): a node in a bucket of at least the gang's free GPUs holds
    # it whole when no NVLink group or CPUs and memory constrain it, so the first node not
    # excluded is the one the plain fit test would find.
    gpus_only = index.fit_shortcut and not job.needs_nvlink and not index.host_binds(job)
    for gpu_type in types:
        buckets = index.buckets[gpu_type]
        for free in range(job.total_gpus, len(buckets)):
            if best is not None and free >= best[0]:
                break
            if gpus_only:
                node = _first_not_excluded(buckets[free], exclude)
            else:
                node = _first_fitting(index, job, buckets[free], exclude)
            if node is not None:
                best = (free, node)
                break
    if best is None:
        return None
    node = best[1]
    if index.locality and applies(index, job):  # of equally best-fitting nodes, the most cached
        node = _most_cached(index, job, types, best[0], exclude, node)
    name = index.nodes[node].name
    return build_placement(index, job, [(node, job.units)], DomainLevel.NODE, name)


def _most_cached(
    index: FreeIndex, job: Job, types: Sequence[str], free: int, exclude: Container[int], first: int
) -> int:
    """Of the nodes with ``free`` GPUs that hold the gang, the one whose cache holds the most
    of the job's data (``first``, the plain search's pick, where none holds more)."""
    best, most = first, cached_bytes(index, job, first)
    for gpu_type in types:
        bucket = index.buckets[gpu_type]
        if free >= len(bucket):
            continue
        for node in bucket[free]:
            held = cached_bytes(index, job, node)
            if held > most and _first_fitting(index, job, (node,), exclude) is not None:
                best, most = node, held
    return best


def _in_one_nvlink_domain(
    index: FreeIndex, job: Job, types: Sequence[str], exclude: Container[int]
) -> Placement | None:
    """The whole gang inside one NVLink domain: best fit by the domain's free GPUs."""
    best: tuple[int, int, int] | None = None  # (free in domain, node, domain)
    for gpu_type in types:
        for bucket in index.buckets[gpu_type][job.total_gpus :]:
            for node in bucket:
                if node in exclude or not holds_host(index, node, job, job.units):
                    continue
                split = index.nvlink_free[node] or [index.free[node]]
                for domain, free in enumerate(split):
                    if free >= job.total_gpus and (best is None or free < best[0]):
                        best = (free, node, domain)
    if best is None:
        return None
    _, node, domain = best
    name = index.nodes[node].name
    cpus, memory = unit_host(job)
    slots = tuple(Slot(name, job.unit_gpus, domain, cpus, memory) for _ in range(job.units))
    return Placement(slots, DomainLevel.NVLINK, f"{name}/nvlink-{domain}", {"nodes": 1.0})


def _first_not_excluded(bucket: Iterable[int], exclude: Container[int]) -> int | None:
    for node in bucket:
        if node not in exclude:
            return node
    return None


def _first_fitting(
    index: FreeIndex, job: Job, bucket: Iterable[int], exclude: Container[int]
) -> int | None:
    for node in bucket:
        if node in exclude:
            continue
        if index.unit_capacity(node, job.unit_gpus, job.needs_nvlink) >= job.units and (
            not index.host_binds(job)
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
    if index.locality and applies(index, job):  # of equally fitting domains, the most cached first
        fitting.sort(key=lambda item: (item[0], -on_nodes(index, job, item[2].nodes), item[1]))
    else:
        fitting.sort(key=lambda item: (item[0], item[1]))
    return _pack_first(index, job, (domain for _, _, domain in fitting), exclude)


def _pack_first(
    index: FreeIndex, job: Job, domains: Iterable[Domain], exclude: Container[int]
) -> Placement | None:
    """The gang in the first of ``domains`` it packs into."""
    for domain in domains:
        placed = _pack(index, job, domain.nodes, exclude)
        if placed is not None:
            return build_placement(index, job, placed, domain.level, domain.name)
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
    if index.host_binds(job):  # a node takes only the units its CPUs and memory hold too
        cpus, memory, host_units = job.unit_millicpus, job.unit_memory_mib, index.host_units
        capacities = [
            (bounded, node)
            for capacity, node in capacities
            if (bounded := min(capacity, host_units(node, cpus, memory))) > 0
        ]
    if job.parallelism.pipeline > 1:  # pipelines inside racks where they fit (a preference)
        per_pipeline = units_per_pipeline(job)
        if per_pipeline is not None and job.units > per_pipeline:
            found = by_rack_in_pipelines(index, job, capacities, per_pipeline)
            if found is not None:
                return found
    if index.locality and applies(index, job):  # of equally roomy nodes, the most cached first
        return fewest_nodes(capacities, needed, lambda node: cached_bytes(index, job, node))
    return fewest_nodes(capacities, needed)


def _why_no_domain_fits(index: FreeIndex, job: Job, types: Sequence[str]) -> PlacementFailure:
    """The reason of a job that no domain holds: its CPUs or memory, else the domain nearest to
    holding its GPUs (visits every domain: only for the reason of a job that waits)."""
    if job.needs_host:
        short = host_fragmented(index, job, holding_a_unit(index, job, types))
        if short is not None:
            return short
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
