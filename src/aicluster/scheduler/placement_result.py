"""What a placement search returns: the placement of a gang's units on chosen nodes (their
slots, NVLink domain and CPUs and memory each), or the failure and its reason."""

from __future__ import annotations

from dataclasses import dataclass

from aicluster.core import DomainLevel, Job, PendingCode, Placement, Slot
from aicluster.scheduler.index import FreeIndex
from aicluster.scheduler.index_domains import spread

__all__ = ["NO_DOMAIN_FITS", "PlacementFailure", "build_placement", "unit_host"]


@dataclass(frozen=True, slots=True)
class PlacementFailure:
    code: PendingCode
    message: str


NO_DOMAIN_FITS = PlacementFailure(PendingCode.TOPOLOGY, "no domain fits the gang")


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
