"""Weighted dominant-resource fairness across tenants (Ghodsi et al., NSDI'11).

The tenant with the smallest weighted dominant share (its largest share of any GPU type, divided
by its weight) goes next; within a tenant, higher priority first, then arrival order.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable

from aicluster.scheduler.entries import Lane, PendingEntry
from aicluster.scheduler.policies.base import (
    Candidate,
    LaneItems,
    LaneMerge,
    Ordering,
    QueuePolicy,
    register,
)
from aicluster.scheduler.state import Snapshot

__all__ = ["FairOrdering", "FairPolicy"]


class FairPolicy(QueuePolicy):
    name = "fair"

    def key(self, entry: PendingEntry, now: float) -> tuple[float, ...]:
        return (-entry.job.priority, entry.job.submit_time)

    def group(self, entry: PendingEntry) -> Hashable:
        return entry.job.tenant

    def ordering(self, snapshot: Snapshot) -> Ordering:
        return FairOrdering(snapshot)


class FairOrdering(Ordering):
    """Tenants in a heap by weighted dominant share; each tenant's lanes merged by key."""

    def __init__(self, snapshot: Snapshot) -> None:
        state = snapshot.state
        self.state = state
        by_tenant: dict[str, dict[Lane, LaneItems]] = {}
        for lane, items in state.lanes.items():
            by_tenant.setdefault(str(lane[0]), {})[lane] = items
        self.merges = {tenant: LaneMerge(lanes) for tenant, lanes in by_tenant.items()}
        self.extra: dict[str, dict[str, int]] = {}
        self.heap = [(self.share(tenant), tenant) for tenant in self.merges]
        heapq.heapify(self.heap)
        self.current: str | None = None
        self.lane_owner: dict[int, str] = {}

    def share(self, tenant: str) -> float:
        usage = dict(self.state.usage.get(tenant, {}))
        for gpu_type, gpus in self.extra.get(tenant, {}).items():
            usage[gpu_type] = usage.get(gpu_type, 0) + gpus
        capacity = self.state.capacity_by_type
        dominant = max(
            (gpus / capacity[t] for t, gpus in usage.items() if capacity.get(t)), default=0.0
        )
        return dominant / self.state.tenant(tenant).weight

    def pop(self) -> Candidate | None:
        while self.heap:
            _, tenant = heapq.heappop(self.heap)
            candidate = self.merges[tenant].pop()
            if candidate is None:
                continue
            self.current = tenant
            return Candidate(candidate.job_id, candidate.lane, candidate.position)
        return None

    def finish(self, candidate: Candidate, *, placed: bool, drop_lane: bool) -> None:
        tenant = self.current
        assert tenant is not None
        self.merges[tenant].finish(candidate, placed=placed, drop_lane=drop_lane)
        if placed:
            entry = self.state.pending[candidate.job_id]
            job = entry.job
            extra = self.extra.setdefault(tenant, {})
            gpu_type = job.gpu_type if job.gpu_type != "any" else self.state.index.gpu_types[0]
            extra[gpu_type] = extra.get(gpu_type, 0) + job.total_gpus
        if not self.merges[tenant].empty:
            heapq.heappush(self.heap, (self.share(tenant), tenant))

    def put_back(self, candidate: Candidate) -> None:
        assert self.current is not None
        self.merges[self.current].put_back(candidate)
        heapq.heappush(self.heap, (self.share(self.current), self.current))

    def lane_items(self, candidate: Candidate) -> LaneItems:
        assert self.current is not None
        return self.merges[self.current].lane_items(candidate)

    def remaining(self) -> list[tuple[LaneItems, int]]:
        return [item for merge in self.merges.values() for item in merge.remaining()]


register(FairPolicy)
