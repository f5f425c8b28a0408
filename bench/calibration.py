"""How fast this machine runs pure Python: a fixed workload, timed, for comparing machines.

The simulator's figures are CPU seconds of pure Python, and hosts differ by 2× and more in that
(22 Nov 2026: the same replay took 13.9 s on one session's machine and 28.1 s on the next's). The
replay scripts print this figure beside theirs, so two runs can be compared across machines.
"""

from __future__ import annotations

import heapq
import statistics
import time
from importlib import import_module


def interpreter_ms() -> float:
    """Median CPU milliseconds of three runs of a fixed mix of what a scheduling cycle does
    (dict lookups, heap pushes and pops, small tuples, attribute-free arithmetic)."""
    return statistics.median(_timed() for _ in range(3))


def _timed() -> float:
    began = time.process_time()
    table: dict[int, int] = {}
    heap: list[tuple[float, int]] = []
    total = 0
    for i in range(200_000):
        table[i % 4099] = table.get(i % 4099, 0) + i
        heapq.heappush(heap, ((i * 7919) % 10007 / 3.0, i))
        if len(heap) > 64:
            total += heapq.heappop(heap)[1]
    assert total >= 0  # keeps the work observable
    return (time.process_time() - began) * 1000


def build() -> str:
    """Which build of the simulator's hot path this process imported: ``make compiled`` puts a
    mypyc build in ``.build/compiled`` (run with ``PYTHONPATH=.build/compiled``)."""
    cycle = import_module("aicluster.scheduler.cycle")
    return "compiled (mypyc)" if str(cycle.__file__).endswith(".so") else "interpreted"
