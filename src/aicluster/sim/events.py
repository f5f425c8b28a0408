"""The replay's event heap: the kinds of event the engine (:mod:`aicluster.sim.engine`) waits
for, and the heap of ``(time, kind, seq, name, token)`` they wait in. At one time, kinds apply in
the order of their numbers: completions before failures, so a job finishing as its node fails
counts as finished; ``seq`` keeps events of one kind at one time in the order they were pushed.
Arrivals are not here: they stream from the trace (one look-ahead job), so the heap holds only
what is in flight.
"""

from __future__ import annotations

import heapq
import math

__all__ = ["COMPLETE", "CYCLE", "FAIL", "INJECTED", "POWER", "REPAIR", "WAKE", "EventHeap"]

COMPLETE, FAIL, REPAIR, WAKE, CYCLE, POWER = range(6)
INJECTED = 1  # token of a failure given by inject_failure (the model draws no successor)


class EventHeap:
    """The events in flight, earliest first."""

    __slots__ = ("heap", "seq")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, str, int]] = []
        self.seq = 0

    def push(self, when: float, kind: int, name: str = "", token: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (when, kind, self.seq, name, token))

    def next_time(self) -> float:
        """When the earliest event is due (infinity: none is)."""
        return self.heap[0][0] if self.heap else math.inf

    def pop_due(self, now: float) -> tuple[float, int, int, str, int] | None:
        """The earliest event due at or before ``now`` (None: none is), taken off the heap."""
        heap = self.heap
        return heapq.heappop(heap) if heap and heap[0][0] <= now else None
