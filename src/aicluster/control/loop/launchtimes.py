"""How long the live cluster takes to launch a gang: from its admission (STARTING) to its first
report of running, over the latest launches. The start-time forecast (``aicluster.sim.forecast``)
adds the median before each job's run, as the job holds its GPUs from its admission."""

from __future__ import annotations

import statistics
from collections import deque

__all__ = ["LaunchTimes"]


class LaunchTimes:
    """The latest ``kept`` launch times; :attr:`typical` is their median (0 before any)."""

    def __init__(self, kept: int = 50) -> None:
        self.recent: deque[float] = deque(maxlen=kept)

    def observe(self, seconds: float) -> None:
        self.recent.append(max(0.0, seconds))

    @property
    def typical(self) -> float:
        return statistics.median(self.recent) if self.recent else 0.0
