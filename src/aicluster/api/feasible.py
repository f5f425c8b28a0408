"""Refuse at submit a job that no node of the cluster could ever hold.

"Ever" is judged on every registered node at once, all of them empty (cordoned and unhealthy
ones too: they may come back): if the scheduler's own placement search cannot place the job
there, it never can, and the submitter hears why now (a 400 naming GPUs, CPUs or memory)
rather than finding a job that waits forever. The cluster cannot grow by itself yet, so no
configuration lets such a job wait instead. A job that asks for more GPUs than the cluster has
hears the shape it asked for, the capacity and what is in use now, apart: "needs 3 workers ×
8 GPUs (whole nodes) = 24 GPUs; the cluster has 16 GPUs (5 in use)".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence

from aicluster.core import Cluster, Job, Node, PendingCode
from aicluster.scheduler import FreeIndex, find_placement
from aicluster.scheduler.placement import PlacementFailure, gpu_types_for
from aicluster.scheduler.placement.result import gpu_capacity, gpu_shape
from aicluster.store import Store

__all__ = ["Feasibility", "gpus_in_use"]

#: How long a read of the node list answers for jobs that fit (a refusal always reads anew).
_FRESH_S = 5.0


def gpus_in_use(store: Store) -> dict[str, int]:
    """The GPUs placed jobs hold, by node name."""
    used: dict[str, int] = {}
    for placed in store.placed_jobs():
        for node, gpus, *_ in placed.placement.get("slots", []):
            used[str(node)] = used.get(str(node), 0) + int(gpus)
    return used


class Feasibility:
    """Whether a job fits the empty cluster, from the node list ``read_nodes`` returns. The
    list is cached for a few seconds: most jobs fit, and a submit should not pay for a read of
    every node; a job that seems not to fit is checked again against a fresh list."""

    def __init__(
        self,
        read_nodes: Callable[[], Sequence[Node]],
        read_in_use: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        """``read_in_use``: the GPUs jobs hold now, by node name (read only for a refusal)."""
        self._read_nodes = read_nodes
        self._read_in_use = read_in_use
        self._lock = threading.Lock()
        self._index: FreeIndex | None = None
        self._nodes: tuple[Node, ...] = ()
        self._read_at = -_FRESH_S

    def refusal(self, job: Job) -> str | None:
        """Why ``job`` can never be placed, or None when it could be (or no node is known)."""
        reason = self._why_not(job, fresh=False)
        return reason if reason is None else self._why_not(job, fresh=True)

    def _why_not(self, job: Job, *, fresh: bool) -> str | None:
        index = self._empty_cluster(fresh)
        if index is None:
            return None
        with self._lock:  # a search changes nothing, but a FreeIndex is not made for threads
            found = find_placement(index, job)
            if not isinstance(found, PlacementFailure):
                return None
            if found.code is not PendingCode.NO_CAPACITY or job.unit_gpus <= 0:
                return found.message
            # The empty cluster's "free" is its capacity: say that, and what is in use now.
            types = gpu_types_for(index, job)
            shape = gpu_shape(job, max(index.max_gpus_by_type[t] for t in types))
            capacity = gpu_capacity(index, job, types)
            nodes = {node.name for node in index.nodes if node.gpu_type in types}
        used = sum(gpus for node, gpus in self._read_in_use().items() if node in nodes)
        return f"needs {shape}; the cluster has {capacity} ({used} in use)"

    def _empty_cluster(self, fresh: bool) -> FreeIndex | None:
        with self._lock:
            if fresh or time.monotonic() - self._read_at > _FRESH_S:
                nodes = tuple(self._read_nodes())
                self._read_at = time.monotonic()
                if nodes != self._nodes or self._index is None:
                    self._nodes = nodes
                    self._index = FreeIndex(Cluster("registered", nodes)) if nodes else None
            return self._index
