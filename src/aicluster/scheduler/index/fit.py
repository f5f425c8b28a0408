"""Shortcut: the racks (or pods) of the free-capacity index bucketed by their capacity in units of
one size, kept up to date as GPUs change, so that a placement or a reservation need not ask every
domain its capacity (on a 220,000-GPU cluster, 1,719 racks for every multi-node job).

The plain searches list every domain's :meth:`~.domains.Domain.capacity` and sort: best fit
(the least capacity that holds the gang, the first domain among equals) for a placement, the most
free capacity (the first among equals) for a reservation. :class:`CapacityBuckets` yields the same
domains in the same order from buckets: a domain's capacity is its histogram's, which the index
changes only in ``_add``, ``_remove`` and ``_change``, and each of those tells the buckets.
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Sequence

from aicluster.core import Node
from aicluster.scheduler.index.domains import Domain

__all__ = ["CapacityBuckets"]


class CapacityBuckets:
    """The ``domains`` of one level (``owner[i]``: node ``i``'s position among them) by their
    capacity in units of ``unit`` GPUs; and, beside it, each domain's capacity were all its
    schedulable nodes free (what a reservation may wait for)."""

    __slots__ = ("buckets", "capacity", "domains", "full", "gpus", "owner", "unit")

    def __init__(
        self,
        domains: Sequence[Domain],
        owner: list[int],  # (a list, not any Sequence: compiled, reading it boxes no int)
        unit: int,
        nodes: Sequence[Node],
        schedulable: Sequence[bool],
    ) -> None:
        self.domains, self.owner, self.unit = domains, owner, unit
        self.gpus = [node.gpus for node in nodes]
        self.capacity = [domain.capacity(unit) for domain in domains]
        self.full = [0] * len(domains)
        most = [0] * len(domains)  # the capacity of a domain whose every node is free
        for i, node in enumerate(nodes):
            most[owner[i]] += node.gpus // unit
            if schedulable[i]:
                self.full[owner[i]] += node.gpus // unit
        self.buckets: list[set[int]] = [set() for _ in range(max(most, default=0) + 1)]
        for position, capacity in enumerate(self.capacity):
            self.buckets[capacity].add(position)

    def changed(self, i: int, before: int, after: int) -> None:
        """Schedulable node ``i``'s free GPUs went from ``before`` to ``after``."""
        unit = self.unit
        delta = after // unit - before // unit
        if delta:  # (_move written out: every allocation and release comes here)
            position = self.owner[i]
            capacity = self.capacity[position]
            self.buckets[capacity].discard(position)
            self.capacity[position] = capacity + delta
            self.buckets[capacity + delta].add(position)

    def joined(self, i: int, free: int, sign: int) -> None:
        """Node ``i``, with ``free`` free GPUs, became schedulable (``sign`` 1) or stopped
        being so (-1)."""
        position = self.owner[i]
        self.full[position] += sign * (self.gpus[i] // self.unit)
        delta = sign * (free // self.unit)
        if delta:
            self._move(position, delta)

    def _move(self, position: int, delta: int) -> None:
        capacity = self.capacity[position]
        self.buckets[capacity].discard(position)
        self.capacity[position] = capacity + delta
        self.buckets[capacity + delta].add(position)

    def holds(self, units: int, types: Container[str]) -> bool:
        """Whether a domain of ``types`` holds at least ``units`` units now."""
        domains = self.domains
        for bucket in self.buckets[max(units, 0) :]:
            if any(domains[position].gpu_type in types for position in bucket):
                return True
        return False

    def best_fit(self, units: int, types: Sequence[str]) -> Iterator[Domain]:
        """Domains of ``types`` holding at least ``units`` units now, least capacity first, then
        in the order of the level (as sorting them by (capacity, position) would)."""
        domains = self.domains
        for bucket in self.buckets[units:] if units > 0 else self.buckets:
            for position in sorted(bucket):
                if domains[position].gpu_type in types:
                    yield domains[position]

    def freest(self, units: int, types: Sequence[str]) -> Iterator[Domain]:
        """Domains of ``types`` whose schedulable nodes could hold ``units`` units once free,
        most capacity now first, then in the order of the level (as a stable sort by capacity,
        descending, of those in level order would)."""
        domains, full = self.domains, self.full
        for bucket in reversed(self.buckets):
            for position in sorted(bucket):
                if full[position] >= units and domains[position].gpu_type in types:
                    yield domains[position]
