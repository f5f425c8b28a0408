"""The running jobs' next changes of standing (Tiresias demotions), earliest first.

Speed-up over a plain heap of ``(time, seq, job id)`` entries, in the same order: a job started in
a cycle reaches a threshold at its start time plus the threshold over its GPUs, so the jobs that
started together with as many GPUs are due at one time. Each time is kept once in a heap and its
jobs in a list beside it, sorted by ``(seq, job id)`` when the time comes; a 220,000-GPU Tiresias
run then pushes and pops about a tenth as many heap entries (it spent 5% of its time in those pops).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

__all__ = ["Wakeups"]


class Wakeups:
    """Jobs by the time their standing changes; an entry whose job has since stopped (or
    restarted with another seq) is stale, and the owner skips it."""

    __slots__ = ("_due", "_times")

    def __init__(self) -> None:
        self._times: list[float] = []  # a heap of the times that have jobs in _due
        self._due: dict[float, list[tuple[int, str]]] = {}

    def add(self, when: float, seq: int, job_id: str) -> None:
        due = self._due.get(when)
        if due is None:
            self._due[when] = [(seq, job_id)]
            heapq.heappush(self._times, when)
        else:
            due.append((seq, job_id))

    def pop_due(self, now: float) -> tuple[float, list[tuple[int, str]]] | None:
        """The earliest time, if it is not after ``now``, and its entries in ``(seq, job id)``
        order; None when no time is due. Call again until None: an entry added meanwhile for a
        time not after ``now`` comes out in its turn."""
        times = self._times
        if not times or times[0] > now:
            return None
        when = heapq.heappop(times)
        return when, sorted(self._due.pop(when))

    def first(self, live: Callable[[int, str], bool]) -> float | None:
        """The earliest time with an entry for which ``live(seq, job_id)`` holds; times whose
        every entry is stale are dropped on the way."""
        times = self._times
        while times:
            due = self._due[times[0]]
            if any(live(seq, job_id) for seq, job_id in due):
                return times[0]
            del self._due[heapq.heappop(times)]
        return None
