"""Refuse at submit a job that no node of the cluster could ever hold.

"Ever" is judged on every registered node at once, all of them empty (cordoned and unhealthy
ones too: they may come back): if the scheduler's own placement search cannot place the job
there, it never can, and the submitter hears why now (a 400 naming GPUs, CPUs or memory)
rather than finding a job that waits forever. The cluster cannot grow by itself yet, so no
configuration lets such a job wait instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from aicluster.core import Cluster, Job, Node
from aicluster.scheduler import FreeIndex, find_placement
from aicluster.scheduler.placement import PlacementFailure

__all__ = ["Feasibility"]

#: How long a read of the node list answers for jobs that fit (a refusal always reads anew).
_FRESH_S = 5.0


class Feasibility:
    """Whether a job fits the empty cluster, from the node list ``read_nodes`` returns. The
    list is cached for a few seconds: most jobs fit, and a submit should not pay for a read of
    every node; a job that seems not to fit is checked again against a fresh list."""

    def __init__(self, read_nodes: Callable[[], Sequence[Node]]) -> None:
        self._read_nodes = read_nodes
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
        return found.message if isinstance(found, PlacementFailure) else None

    def _empty_cluster(self, fresh: bool) -> FreeIndex | None:
        with self._lock:
            if fresh or time.monotonic() - self._read_at > _FRESH_S:
                nodes = tuple(self._read_nodes())
                self._read_at = time.monotonic()
                if nodes != self._nodes or self._index is None:
                    self._nodes = nodes
                    self._index = FreeIndex(Cluster("registered", nodes)) if nodes else None
            return self._index
