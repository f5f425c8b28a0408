"""Gang health from step telemetry: hangs and stragglers. Pure logic, fed by the control loop.

- **Hang**: a rank is watched once it has made a step (a ``step`` record: ``aicluster.train``'s
  ``report``, or the launcher's step-timing shim at each optimizer step); it hangs when it makes
  no step for max(``hang_factor`` × the gang's median step time, ``hang_floor_s``). Collectives
  make every rank of a stuck gang stop together, so this does not wait for NCCL's (or gloo's)
  own timeouts, which default to 10 or 30 minutes. Before its first step a rank is watched only
  once it said it will step (:data:`DECLARES`: ``aicluster.train.init``'s ``start`` record, or
  the shim's ``stepping`` record when the job creates its first torch optimizer): it hangs when
  its first step does not come within ``startup_grace_s`` of saying so. A rank that never said
  it steps and never stepped is never hung (a plain script, data preparation, an evaluation).
  The job's spec changes this (``hang_check``, default ``auto``): ``from_start`` watches
  every rank from the attempt's start (its first step within ``startup_grace_s``), ``off``
  never calls the job hung.
- **Straggler**: a rank whose recent step time is persistently above ``straggler_factor`` × the
  gang's median. In synchronous data parallelism every rank's wall-clock step time equals the
  slowest one's, so ranks should report their own compute time as the metric ``compute_time``
  (the examples do; for a torch job that does not, the launcher's step timing shim reports
  step time minus the time spent in collectives, see :mod:`aicluster.runtime.gang._steptime`);
  without it the wall-clock step time is used. A rank must also be at least
  ``straggler_min_s`` slower than the median, so that millisecond noise is never flagged.
- **Synchronization jitter** (:func:`sync_jitter`): how much the ranks' compute times differ at
  the same step, in seconds: the time the fastest rank waits for the slowest at each
  collective. Per step, the job's spread is the slowest rank's compute time minus the fastest
  rank's; a node's is the slowest of its ranks minus the job's fastest (so a node with the
  straggler shows the job's spread and the others about zero). Each figure is the median over
  the latest ``straggler_window`` steps that every rank reported.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from aicluster.configuration import HealthConfig
from aicluster.train.telemetry import StepRecord

__all__ = [
    "DECLARES",
    "GangMonitor",
    "HealthConfig",
    "Straggler",
    "SyncJitter",
    "sync_jitter",
]

#: Telemetry kinds by which a rank says it will step, and what wrote them (for the reason).
DECLARES = {
    "start": "aicluster.train.init said it would step",
    "stepping": "the job made its first torch optimizer",
}


@dataclass(frozen=True, slots=True)
class Straggler:
    rank: int
    node: str | None
    ratio: float  # the rank's recent median step time over the gang's
    step: int | None = None  # the step at which it was flagged

    def describe(self) -> str:
        where = f" on {self.node}" if self.node else ""
        return f"rank {self.rank}{where} is {self.ratio:.2f}x slower than the gang's median"


@dataclass(frozen=True, slots=True)
class SyncJitter:
    """Synchronization jitter of a gang, in seconds (see the module's docstring)."""

    job: float
    nodes: Mapping[str, float]
    steps: int  # steps the medians are over
    last_step: int


def sync_jitter(
    steps: Mapping[int, Mapping[int, float]], nodes: Mapping[int, str], window: int
) -> SyncJitter | None:
    """Jitter over the latest ``window`` of ``steps`` (step -> rank -> compute seconds, only
    steps every rank reported); ``nodes`` maps a rank to its node (ranks without are left out
    of the per-node figures). None without a step."""
    latest = sorted(steps)[-window:]
    if not latest:
        return None
    job: list[float] = []
    per_node: dict[str, list[float]] = {}
    for step in latest:
        times = steps[step]
        fastest = min(times.values())
        job.append(max(times.values()) - fastest)
        slowest: dict[str, float] = {}
        for rank, took in times.items():
            node = nodes.get(rank)
            if node is not None:
                slowest[node] = max(slowest.get(node, took), took)
        for node, took in slowest.items():
            per_node.setdefault(node, []).append(took - fastest)
    return SyncJitter(
        job=statistics.median(job),
        nodes={node: statistics.median(spreads) for node, spreads in sorted(per_node.items())},
        steps=len(latest),
        last_step=latest[-1],
    )


@dataclass
class GangMonitor:
    """Follows one attempt of one gang."""

    workers: int  # the gang's ranks (a rank per GPU), each expected to report
    started_at: float
    config: HealthConfig = field(default_factory=HealthConfig)
    hang_check: str = "auto"  # the job spec's: auto, from_start or off
    last_progress: dict[int, float] = field(default_factory=dict)
    #: Ranks that said they will step (and had not stepped then): when, and the record's kind.
    declared: dict[int, tuple[float, str]] = field(default_factory=dict)
    step_times: dict[int, deque[float]] = field(default_factory=dict)
    nodes: dict[int, str] = field(default_factory=dict)
    suspects: dict[int, int] = field(default_factory=dict)
    flagged: dict[int, Straggler] = field(default_factory=dict)
    checkpoints: list[tuple[float, int]] = field(default_factory=list)  # (time, step)
    first_step_at: float | None = None
    last_step: int = 0
    by_step: dict[int, dict[int, float]] = field(default_factory=dict)  # recent steps only
    #: The latest jitter figures; replaced whole (never mutated) so another thread (a metrics
    #: scrape) may read it while the loop observes.
    jitter: SyncJitter | None = None

    def observe(self, records: list[StepRecord]) -> list[Straggler]:
        """Take in new records; returns stragglers flagged for the first time."""
        new: list[Straggler] = []
        for record in records:
            if record.node and record.rank not in self.nodes:  # the placement's name wins
                self.nodes[record.rank] = record.node
            if record.kind == "checkpoint" and record.step is not None:
                self.checkpoints.append((record.time, record.step))
            if record.kind in DECLARES and record.rank not in self.declared:
                self.declared[record.rank] = (record.time, record.kind)
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
                self._remember(record.step, record.rank, float(took))
                flagged = self._check(record.rank, record.step)
                if flagged is not None:
                    new.append(flagged)
        if records:
            self._update_jitter()
        return new

    def _remember(self, step: int | None, rank: int, took: float) -> None:
        """Keep the compute time of ``rank`` at ``step`` for the jitter (recent steps only)."""
        if step is None or step < self.last_step - 4 * self.config.straggler_window:
            return
        self.by_step.setdefault(step, {})[rank] = took
        if len(self.by_step) > 8 * self.config.straggler_window:
            for old in sorted(self.by_step)[: len(self.by_step) // 2]:
                del self.by_step[old]

    def _update_jitter(self) -> None:
        complete = {s: times for s, times in self.by_step.items() if len(times) >= self.workers}
        if self.workers >= 2 and complete:
            found = sync_jitter(complete, self.nodes, self.config.straggler_window)
            self.jitter = found or self.jitter

    def median_step_time(self) -> float | None:
        times = [t for window in self.step_times.values() for t in window]
        return statistics.median(times) if times else None

    def hung(self, now: float) -> str | None:
        """Why the gang counts as hung at ``now``, or None (see the module's docstring). The
        reason says what was watched and which setting sets the limit."""
        if self.hang_check == "off":
            return None
        factor, floor, grace = (
            self.config.hang_factor,
            self.config.hang_floor_s,
            self.config.startup_grace_s,
        )
        if self.last_progress:
            median = self.median_step_time() or 0.0
            limit = max(factor * median, floor)
            rank, last = min(self.last_progress.items(), key=lambda item: item[1])
            if now - last > limit:
                return (
                    f"rank {rank} made no progress for {now - last:.0f}s after its last step "
                    f"(limit {limit:.0f}s: the larger of health.hang_factor {factor:g} × the "
                    f"gang's median step {median:.1f}s and health.hang_floor_s {floor:g}s; "
                    "hang_check: off in the job's spec stops this)"
                )
        for rank in range(self.workers):
            if rank in self.last_progress:
                continue
            if self.hang_check == "from_start":
                since, said = self.started_at, "the attempt's start (hang_check: from_start)"
            elif rank in self.declared:
                since, kind = self.declared[rank]
                said = DECLARES[kind]
            else:
                continue  # never said it steps: not watched before its first step
            if now - since > grace:
                return (
                    f"rank {rank} made no first step {now - since:.0f}s after {said} (limit "
                    f"{grace:g}s: health.startup_grace_s; hang_check: off in the job's spec "
                    "stops this)"
                )
        return None

    def _check(self, rank: int, step: int | None) -> Straggler | None:
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
        slow = slow and medians[rank] - gang >= self.config.straggler_min_s
        self.suspects[rank] = self.suspects.get(rank, 0) + 1 if slow else 0
        if self.suspects[rank] >= self.config.straggler_patience and rank not in self.flagged:
            self.flagged[rank] = Straggler(rank, self.nodes.get(rank), ratio, step)
            return self.flagged[rank]
        return None
