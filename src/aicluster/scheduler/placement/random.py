"""Random placement: the topology-oblivious baseline (``placement.strategy: random``).

The hard constraints stay those of topology-aware placement (the GPU type, each tensor-parallel
group inside one NVLink domain, each unit's CPUs and memory on its node, ``max_domain``); only the
preference goes: the gang takes nodes in a random order, each node as many of its units as it
holds, until it is placed. Under ``max_domain`` the domain (node, rack or pod) is drawn first,
among those of the allowed GPU types. So a gang fits exactly when topology-aware placement finds
it room; what differs is where it goes, and with it how far its traffic travels.

The order is drawn from the configured seed and the job's id, never from a generator's running
state: the same job on the same free capacity is placed the same way, whichever searches (victim
searches, shortcuts) asked before, and the scheduler stays a function of its snapshot.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from random import Random  # a seeded instance per job, never the global generator

from aicluster.core import DomainLevel, Job, Placement
from aicluster.scheduler.index import FreeIndex
from aicluster.scheduler.placement.result import build_placement

__all__ = ["place_at_random"]


def place_at_random(
    index: FreeIndex, job: Job, types: Sequence[str], exclude: Container[int], seed: int
) -> Placement | None:
    """``job``'s gang on nodes in a random order (see the module), or None if it fits nowhere."""
    draw = Random(f"placement:{seed}:{job.id}")
    groups = _domains(index, job.max_domain, types)
    draw.shuffle(groups)
    for nodes in groups:
        order = list(nodes)
        draw.shuffle(order)
        placed = _first_fit(index, job, order, exclude)
        if placed is not None:
            level, name = _narrowest(index, [node for node, _ in placed])
            return build_placement(index, job, placed, level, name)
    return None


def _domains(index: FreeIndex, widest: DomainLevel, types: Sequence[str]) -> list[list[int]]:
    """The node sets a gang no wider than ``widest`` may spread over: single nodes, racks, pods,
    or all nodes of one GPU type."""
    if widest <= DomainLevel.NODE:
        return [[node] for gpu_type in types for node in index.nodes_of_type[gpu_type]]
    if widest == DomainLevel.RACK:
        return [domain.nodes for domain in index.racks if domain.gpu_type in types]
    if widest == DomainLevel.POD:
        return [domain.nodes for domain in index.pods if domain.gpu_type in types]
    return [index.nodes_of_type[gpu_type] for gpu_type in types]


def _first_fit(
    index: FreeIndex, job: Job, order: Sequence[int], exclude: Container[int]
) -> list[tuple[int, int]] | None:
    """Units per node, taking nodes in ``order``, each as many units as it holds."""
    needed, chosen = job.units, []
    for node in order:
        if node in exclude:
            continue
        capacity = index.unit_capacity(node, job.unit_gpus, job.needs_nvlink)
        if job.needs_host:
            capacity = min(
                capacity, index.host_units(node, job.unit_millicpus, job.unit_memory_mib)
            )
        if capacity > 0:
            chosen.append((node, min(capacity, needed)))
            needed -= capacity
            if needed <= 0:
                return chosen
    return None


def _narrowest(index: FreeIndex, nodes: Sequence[int]) -> tuple[DomainLevel, str]:
    """The narrowest domain holding ``nodes``: its level and name."""
    if len(set(nodes)) == 1:
        return DomainLevel.NODE, index.nodes[nodes[0]].name
    racks = {index.node_rack[node] for node in nodes}
    if len(racks) == 1:
        return DomainLevel.RACK, index.racks[racks.pop()].name
    pods = {index.node_pod[node] for node in nodes}
    if len(pods) == 1:
        return DomainLevel.POD, index.pods[pods.pop()].name
    return DomainLevel.CLUSTER, index.cluster.name
