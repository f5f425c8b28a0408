"""Gang health from step telemetry: hangs and stragglers. Pure logic, fed by the control loop.

- **Hang**: no rank made step progress for max(``hang_factor`` × the gang's median step time,
  ``hang_floor_s``). Collectives make every rank of a stuck gang stop together, so this does not
  wait for NCCL's (or gloo's) own timeouts, which default to 10 or 30 minutes.
- **Straggler**: a rank whose recent step time is persistently above ``straggler_factor`` × the
  gang's median. In synchronous data parallelism every rank's wall-clock step time equals the
  slowest one's, so ranks should report their own compute time as the metric ``compute_time``
  (the examples do); without it the wall-clock step time is used.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from aicluster.train.telemetry import StepRecord

__all__ = ["GangMonitor", "HealthConfig", "Straggler"]


@dataclass(frozen=True, slots=True)
class HealthConfig:
    hang_factor: float = 3.0
    hang_floor_s: float = 30.0
    startup_grace_s: float = 120.0  # before the first step (imports, rendezvous, data)
    straggler_factor: float = 1.3
    straggler_window: int = 10  # steps per rank considered
    straggler_patience: int = 5  # consecutive flagged observations before reporting


@dataclass(frozen=True, slots=True)
class Straggler:
    rank: int
    node: str | None
    ratio: float  # the rank's recent median step time over the gang's

    def describe(self) -> str:
        where = f" on {self.node}" if self.node else ""
        return f"rank {self.rank}{where} is {self.ratio:.2f}x slower than the gang's median"


@dataclass
class GangMonitor:
    """Follows one attempt of one gang."""

    workers: int
    started_at: float
    config: HealthConfig = field(default_factory=HealthConfig)
    last_progress: dict[int, float] = field(default_factory=dict)
    step_times: dict[int, deque[float]] = field(default_factory=dict)
    nodes: dict[int, str] = field(default_factory=dict)
    suspects: dict[int, int] = field(default_factory=dict)
    flagged: dict[int, Straggler] = field(default_factory=dict)
    checkpoints: list[tuple[float, int]] = field(default_factory=list)  # (time, step)
    first_step_at: float | None = None
    last_step: int = 0

    def observe(self, records: list[StepRecord]) -> list[Straggler]:
        """Take in new records; returns stragglers flagged for the first time."""
        new: list[Straggler] = []
        for record in records:
            if record.node:
                self.nodes[record.rank] = record.node
            if record.kind == "checkpoint" and record.step is not None:
                self.checkpoints.append((record.time, record.step))
            if record.kind != "step":
                continue
            self.last_progress[record.rank] = record.time
            self.first_step_at = self.first_step_at or record.time
            self.last_step = max(self.last_step, record.step or 0)
            took = record.metrics.get("compute_time", record.step_time)
            if took is not None and took > 0:
                window = self.step_times.setdefault(
                    record.rank, deque(maxlen=self.config.straggler_window)
                )
                window.append(float(took))
                flagged = self._check(record.rank)
                if flagged is not None:
                    new.append(flagged)
        return new

    def median_step_time(self) -> float | None:
        times = [t for window in self.step_times.values() for t in window]
        return statistics.median(times) if times else None

    def hung(self, now: float) -> str | None:
        """Why the gang counts as hung at ``now``, or None."""
        if len(self.last_progress) < self.workers:
            silent = now - self.started_at
            if silent > self.config.startup_grace_s:
                return f"no step from every rank {silent:.0f}s after the start"
            return None
        median = self.median_step_time() or 0.0
        limit = max(self.config.hang_factor * median, self.config.hang_floor_s)
        rank, last = min(self.last_progress.items(), key=lambda item: item[1])
        if now - last > limit:
            return f"rank {rank} made no progress for {now - last:.0f}s (limit {limit:.0f}s)"
        return None

    def _check(self, rank: int) -> Straggler | None:
        """After a step of ``rank``: is it persistently slower than the gang's median?"""
        enough = max(3, self.config.straggler_window // 2)
        medians = {
            r: statistics.median(window)
            for r, window in self.step_times.items()
            if len(window) >= enough
        }
        if rank not in medians or len(medians) < 2:
            return None
        gang = statistics.median(medians.values())
        ratio = medians[rank] / gang if gang > 0 else 1.0
        slow = ratio >= self.config.straggler_factor
        self.suspects[rank] = self.suspects.get(rank, 0) + 1 if slow else 0
        if self.suspects[rank] >= self.config.straggler_patience and rank not in self.flagged:
            self.flagged[rank] = Straggler(rank, self.nodes.get(rank), ratio)
            return self.flagged[rank]
        return None
