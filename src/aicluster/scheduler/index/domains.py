"""Domains of the free-capacity index: racks and pods per GPU type, each with its histogram of
free GPUs, built from a cluster's nodes; and how a node's GPUs spread over its NVLink domains."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from operator import mul

from aicluster.core import DomainLevel, Node

__all__ = ["Domain", "build_domains", "spread"]


@dataclass(slots=True)
class Domain:
    """A rack or pod restricted to one GPU type (a gang uses a single GPU type)."""

    level: DomainLevel
    name: str
    gpu_type: str
    nodes: list[int]
    histogram: list[int]  # histogram[f] = schedulable nodes with f free GPUs

    def capacity(self, unit: int) -> int:
        """How many placement units of ``unit`` GPUs fit (ignoring NVLink splits)."""
        histogram = self.histogram
        return sum(map(mul, histogram, _units_per_free(unit, len(histogram))))


@cache
def _units_per_free(unit: int, size: int) -> tuple[int, ...]:
    """``free // unit`` for every free count below ``size`` (the capacity's weights)."""
    return tuple(free // unit for free in range(size))


def build_domains(
    nodes: Sequence[Node], max_gpus: int
) -> tuple[list[Domain], list[Domain], list[int], list[int]]:
    """The racks and the pods of ``nodes``, one per GPU type, with empty histograms (of up to
    ``max_gpus`` free), and the rack and the pod of each node (positions in those lists)."""
    racks, node_rack = _grouped(nodes, DomainLevel.RACK, [node.rack for node in nodes], max_gpus)
    pods, node_pod = _grouped(nodes, DomainLevel.POD, [node.pod for node in nodes], max_gpus)
    return racks, pods, node_rack, node_pod


def _grouped(
    nodes: Sequence[Node], level: DomainLevel, names: Sequence[str], max_gpus: int
) -> tuple[list[Domain], list[int]]:
    """The domains at ``level``, one per name and GPU type in the order the nodes first name
    them, and the position of each node's domain."""
    ids: dict[tuple[str, str], int] = {}
    domains: list[Domain] = []
    owner: list[int] = []
    for i, node in enumerate(nodes):
        key = (names[i], node.gpu_type)
        if key not in ids:
            ids[key] = len(domains)
            domains.append(Domain(level, names[i], node.gpu_type, [], [0] * (max_gpus + 1)))
        domains[ids[key]].nodes.append(i)
        owner.append(ids[key])
    return domains, owner


def spread(
    split: list[int], delta: int, size: int, floating: list[int] | None = None
) -> list[tuple[int, int]]:
    """Split ``delta`` free GPUs over NVLink domains: allocate from the freest domains first,
    release into the fullest ones (only as many as ``floating`` says a domain's floating slots
    hold, when given). Returns (domain, delta) pairs."""
    steps: list[tuple[int, int]] = []
    remaining = delta
    for d in sorted(range(len(split)), key=lambda d: split[d], reverse=delta < 0):
        room = size - split[d] if floating is None else min(size - split[d], floating[d])
        step = max(remaining, -split[d]) if delta < 0 else min(remaining, room)
        if step:
            steps.append((d, step))
            remaining -= step
        if remaining == 0:
            break
    return steps
