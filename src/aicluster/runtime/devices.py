"""Which GPU of its node each rank gets: an index inside the NVLink domain the scheduler chose.

The scheduler counts GPUs per NVLink domain (``Slot.nvlink_domain``); it never names GPU
indices, and Ray cannot be asked for a given GPU (it hands an actor the ids it likes). So the
launcher chooses: domain ``d`` of a node with domains of ``k`` GPUs holds indices
``d*k .. d*k+k-1``, and a rank takes the lowest index of its slot's domain that no live gang on
the node holds (their run directories record their ranks' indices). A floating slot (domain -1:
a worker wider than a domain) takes its GPUs a tensor-parallel group at a time, each group from
one domain where one has room. Pure: the caller gives the nodes' shapes and the indices in use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

from aicluster.runtime.layout import RankSlot

__all__ = ["NodeGpus", "assign_devices"]


@dataclasses.dataclass(frozen=True, slots=True)
class NodeGpus:
    """A node's GPUs: how many, and how many per NVLink domain (``gpus`` for one domain)."""

    gpus: int
    domain_size: int

    def free_by_domain(self, used: Collection[int]) -> list[list[int]]:
        size = self.domain_size or max(self.gpus, 1)
        domains = [list(range(start, start + size)) for start in range(0, self.gpus, size)]
        return [[index for index in domain if index not in used] for domain in domains]


def assign_devices(
    layout: Sequence[RankSlot],
    nodes: Mapping[str, NodeGpus],
    used: Mapping[str, Collection[int]],
    tensor: int = 1,
) -> tuple[RankSlot, ...]:
    """``layout`` with each rank's ``device`` (GPU index on its node) and ``nvlink_domain``
    (that index's domain). ``used``: indices other live gangs hold, by node.

    Raises ``ValueError`` when a slot's domain has no free index left (the scheduler's counts
    and the node's gangs disagree) or a node has too few GPUs.
    """
    free = {node: shape.free_by_domain(used.get(node, ())) for node, shape in nodes.items()}
    chosen: dict[int, tuple[int, int]] = {}
    for slot in layout:
        if slot.nvlink_domain >= 0:
            chosen[slot.rank] = (_take_pinned(free, slot), slot.nvlink_domain)
    floating = [slot for slot in layout if slot.nvlink_domain < 0]
    group = max(tensor, 1)
    for start in range(0, len(floating), group):
        ranks = floating[start : start + group]
        node = ranks[0].node
        for slot, picked in zip(ranks, _take_group(free, node, len(ranks)), strict=True):
            chosen[slot.rank] = picked
    return tuple(
        dataclasses.replace(slot, device=chosen[slot.rank][0], nvlink_domain=chosen[slot.rank][1])
        for slot in layout
    )


def _take_pinned(free: dict[str, list[list[int]]], slot: RankSlot) -> int:
    domains = free.get(slot.node)
    if domains is None or slot.nvlink_domain >= len(domains):
        raise ValueError(f"node {slot.node} has no NVLink domain {slot.nvlink_domain}")
    if not domains[slot.nvlink_domain]:
        raise ValueError(
            f"rank {slot.rank}: no GPU of NVLink domain {slot.nvlink_domain} of {slot.node} is "
            "left (the placement asks more than the gangs there leave free)"
        )
    return domains[slot.nvlink_domain].pop(0)


def _take_group(free: dict[str, list[list[int]]], node: str, count: int) -> list[tuple[int, int]]:
    """``count`` (index, domain) pairs: from the fullest domain that holds them all, else from
    the freest domains in turn."""
    domains = free.get(node, [])
    holding = [d for d, left in enumerate(domains) if len(left) >= count]
    order = (
        [min(holding, key=lambda d: (len(domains[d]), d))]
        if holding
        else sorted(range(len(domains)), key=lambda d: -len(domains[d]))
    )
    taken: list[tuple[int, int]] = []
    for domain in order:
        while domains[domain] and len(taken) < count:
            taken.append((domains[domain].pop(0), domain))
    if len(taken) < count:
        raise ValueError(f"node {node} has no {count} free GPUs left for a floating worker")
    return taken
