"""What a placement search returns: the placement of a gang's units on chosen nodes (their
slots, NVLink domain and CPUs and memory each), or the failure and its reason."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aicluster.core import DomainLevel, Job, PendingCode, Placement, Slot
from aicluster.scheduler.index import FreeIndex, spread
from aicluster.scheduler.locality import DATA_CACHED_BYTES, applies, on_nodes

__all__ = [
    "NO_DOMAIN_FITS",
    "PlacementFailure",
    "build_placement",
    "fewest_nodes",
    "gpu_capacity",
    "gpu_shape",
    "pipelines_in_rack",
    "unit_host",
]


@dataclass(frozen=True, slots=True)
class PlacementFailure:
    code: PendingCode
    message: str


NO_DOMAIN_FITS = PlacementFailure(PendingCode.TOPOLOGY, "no domain fits the gang")


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def gpu_shape(job: Job, node_gpus: int) -> str:
    """The GPUs a job asks for, as reasons name them: ``8 GPUs`` for one worker, else
    ``3 workers × 8 GPUs = 24 GPUs``, with ``(whole nodes)`` when each worker takes all of a
    node of ``node_gpus`` (the largest node of the job's GPU types)."""
    if job.workers == 1:
        return _gpus(job.total_gpus)
    whole = " (whole nodes)" if job.gpus_per_worker == node_gpus else ""
    return f"{job.workers} workers × {_gpus(job.gpus_per_worker)}{whole} = {_gpus(job.total_gpus)}"


def gpu_capacity(index: FreeIndex, job: Job, types: Sequence[str]) -> str:
    """The cluster's GPUs of ``types`` (all its nodes, cordoned ones too): ``16 GPUs``, or
    ``16 H100 GPUs`` for a job that names its type."""
    total = sum(index.gpus_by_type[t] for t in types)
    return _gpus(total) if job.gpu_type == "any" else f"{total} {job.gpu_type} GPUs"


def build_placement(
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
    if job.parallelism.pipeline > 1:  # (pipeline.py prefers them whole)
        inside, pipelines = pipelines_in_rack(index, job, slots)
        score["pipelines_in_rack"] = inside / pipelines if pipelines else 1.0
    if index.locality and applies(index, job):
        score[DATA_CACHED_BYTES] = float(on_nodes(index, job, (n for n, _ in units_per_node)))
    return Placement(tuple(slots), level, domain, score)


def _node_slots(index: FreeIndex, node: int, count: int, job: Job) -> list[Slot]:
    """Slots for ``count`` units on one node: each unit in the fullest NVLink domain that fits."""
    name, unit = index.nodes[node].name, job.unit_gpus
    cpus, memory = unit_host(job)
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


def unit_host(job: Job) -> tuple[float, float]:
    """The CPUs and memory (GB) of one placement unit: its workers' together."""
    if not job.needs_host:
        return 0.0, 0.0
    workers = job.workers_per_unit
    return job.cpus_per_worker * workers, job.memory_gb_per_worker * workers


def fewest_nodes(
    capacities: list[tuple[int, int]],
    needed: int,
    prefer: Callable[[int], int] | None = None,
) -> list[tuple[int, int]] | None:
    """``needed`` units over the fewest nodes of ``capacities`` (units each node can take, by
    node; sorted here): fill the roomiest, finish on the best fit; None when they hold too few.
    ``prefer`` (a node's data cached, :mod:`..locality`) orders nodes of equal capacity, higher
    first; without it, by node index."""
    if sum(capacity for capacity, _ in capacities) < needed:
        return None
    if prefer is None:
        capacities.sort(key=lambda item: (-item[0], item[1]))
    else:
        ranks = {node: -prefer(node) for _, node in capacities}
        capacities.sort(key=lambda item: (-item[0], ranks[item[1]], item[1]))
    chosen: list[tuple[int, int]] = []
    for position, (capacity, node) in enumerate(capacities):
        finishing = [c for c in capacities[position:] if c[0] >= needed]
        if finishing:
            if prefer is None:
                _, best_node = min(finishing, key=lambda item: (item[0], item[1]))
            else:
                _, best_node = min(finishing, key=lambda item: (item[0], ranks[item[1]], item[1]))
            chosen.append((best_node, needed))
            return chosen
        chosen.append((node, capacity))
        needed -= capacity
    return None


def pipelines_in_rack(index: FreeIndex, job: Job, slots: Sequence[Slot]) -> tuple[int, int]:
    """Of the gang's pipelines, how many lie inside one rack, and how many there are, with the
    ranks numbered as the runtime numbers them (rack by rack, in placement order)."""
    per_pipeline = job.parallelism.pipeline * job.parallelism.tensor
    gpus_by_rack: dict[str, int] = {}
    for slot in slots:
        rack = index.nodes[index.node_id[slot.node]].rack
        gpus_by_rack[rack] = gpus_by_rack.get(rack, 0) + slot.gpus
    inside, start = 0, 0
    for gpus in gpus_by_rack.values():  # each rack's ranks: [start, start + gpus)
        first = -(-start // per_pipeline)  # the first pipeline that starts in the rack
        inside += max(0, (start + gpus) // per_pipeline - first)
        start += gpus
    return inside, start // per_pipeline
