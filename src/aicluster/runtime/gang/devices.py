"""Which GPU of its node each rank gets: an index inside the NVLink domain the scheduler chose.

The scheduler counts GPUs per NVLink domain (``Slot.nvlink_domain``); it never names GPU
indices, and Ray cannot be asked for a given GPU (it hands an actor the ids it likes). So the
launcher chooses, once Ray has reserved the gang's placement group (then every gang holding GPUs
on the node holds them in Ray too, and the scheduler's view and Ray's agree): domain ``d`` of a
node with domains of ``k`` GPUs holds indices ``d*k .. d*k+k-1``, and a rank takes the lowest
index of its slot's domain that no live gang on the node holds (their run directories record
their ranks' indices). A floating slot (domain -1: a worker wider than a domain) takes its GPUs
a tensor-parallel group at a time, each group from one domain where one has room. Pure: the
caller gives the nodes' shapes and the indices in use.
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

    Ranks go a tensor-parallel group (``tensor`` consecutive ranks) at a time, pinned slots
    first: a group takes its slot's domain when it has room, else the fullest domain that holds
    it, else the freest domains in turn. Never refuses: where the node's records leave too few
    indices (a gang whose records this state directory does not hold), the group shares its
    domain's lowest indices; Ray has reserved the GPUs, so only the index is shared.
    """
    free = {node: shape.free_by_domain(used.get(node, ())) for node, shape in nodes.items()}
    group = max(tensor, 1)
    pinned = [slot for slot in layout if slot.nvlink_domain >= 0]
    floating = [slot for slot in layout if slot.nvlink_domain < 0]
    chosen: dict[int, tuple[int, int]] = {}
    for ranks in (pinned, floating):
        for start in range(0, len(ranks), group):
            members = ranks[start : start + group]
            node = members[0].node
            shape = nodes.get(node, NodeGpus(len(members), 0))
            picked = _take_group(
                free.setdefault(node, []), shape, members[0].nvlink_domain, len(members)
            )
            chosen.update(zip((slot.rank for slot in members), picked, strict=True))
    return tuple(
        dataclasses.replace(slot, device=chosen[slot.rank][0], nvlink_domain=chosen[slot.rank][1])
        for slot in layout
    )


def _take_group(
    domains: list[list[int]], shape: NodeGpus, preferred: int, count: int
) -> list[tuple[int, int]]:
    """``count`` (index, domain) pairs, taken out of ``domains`` (free indices by domain)."""
    holding = [d for d, left in enumerate(domains) if len(left) >= count]
    if 0 <= preferred < len(domains) and preferred in holding:
        order = [preferred]
    elif holding:
        order = [min(holding, key=lambda d: (len(domains[d]), d))]
    else:
        order = sorted(range(len(domains)), key=lambda d: -len(domains[d]))
    taken: list[tuple[int, int]] = []
    for domain in order:
        while domains[domain] and len(taken) < count:
            taken.append((domains[domain].pop(0), domain))
    size = shape.domain_size or max(shape.gpus, 1)
    share = max(preferred, 0)
    while len(taken) < count:  # no free index left by the records: share the domain's first
        index = share * size + len(taken) % size
        taken.append((index, share))
    return taken
