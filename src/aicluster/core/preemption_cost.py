"""The cost of preemption: one definition of each figure, for the simulator and the live loop.

- A **preemption** (an eviction) is a run stopped so that its job runs again later, counted when
  the job is back in the queue. Its **kind** is the right the scheduler took the GPUs by
  (:class:`~aicluster.core.VictimKind`: ``reclaim``, ``priority``, ``policy``), or the live loop's
  own reason to move a job (``drain``: its node drains; ``elastic``: grown back to full size);
  ``unknown`` where none was recorded.
- Its **lost GPU-seconds** are the work the run did since its last save, times its GPUs: the
  lost-work rule of :func:`aicluster.scheduler.effects.account`, which the simulator's stop and
  the live loop's requeue both apply (the live loop writes it on the job's move back to PENDING
  as ``lost_gpu_seconds``).
- **Admitted GPU-seconds** are a run's GPUs times the time from its admission to the moment the
  scheduler took its GPUs back (a run still going counts up to now, or the replay's horizon).
- **Evictions per admitted GPU-hour**: preemptions over admitted GPU-hours (0 with none).

Pure: :class:`CostLedger` reads the live jobs' state changes (the store's ``job.transition``
events), the simulator adds to a :class:`PreemptionCost` per tenant as it stops jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DRAIN",
    "ELASTIC",
    "KINDS",
    "UNKNOWN",
    "CostLedger",
    "PreemptionCost",
    "total",
]

DRAIN = "drain"
ELASTIC = "elastic"
UNKNOWN = "unknown"
#: The kinds a preemption is recorded with (the plan's rights, then the live loop's own).
KINDS = ("reclaim", "priority", "policy", DRAIN, ELASTIC)

#: The states that end a run live: the scheduler holds no GPUs for the job once it is in one.
_RUN_ENDS = frozenset({"PREEMPTING", "RESTARTING", "PENDING", "SUCCEEDED", "FAILED", "CANCELLED"})


@dataclass(slots=True)
class PreemptionCost:
    """One tenant's (or the cluster's) preemptions, their lost work and its admitted time."""

    preemptions: int = 0
    lost_gpu_seconds: float = 0.0
    admitted_gpu_seconds: float = 0.0
    by_kind: dict[str, int] = field(default_factory=dict)
    lost_by_kind: dict[str, float] = field(default_factory=dict)

    def evicted(self, kind: str, lost_gpu_seconds: float) -> None:
        """Count one preemption of ``kind`` that lost ``lost_gpu_seconds`` of work."""
        self.preemptions += 1
        self.lost_gpu_seconds += lost_gpu_seconds
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        self.lost_by_kind[kind] = self.lost_by_kind.get(kind, 0.0) + lost_gpu_seconds

    def add(self, other: PreemptionCost) -> None:
        self.preemptions += other.preemptions
        self.lost_gpu_seconds += other.lost_gpu_seconds
        self.admitted_gpu_seconds += other.admitted_gpu_seconds
        for kind, count in other.by_kind.items():
            self.by_kind[kind] = self.by_kind.get(kind, 0) + count
        for kind, lost in other.lost_by_kind.items():
            self.lost_by_kind[kind] = self.lost_by_kind.get(kind, 0.0) + lost

    def copy(self) -> PreemptionCost:
        found = PreemptionCost()
        found.add(self)
        return found

    @property
    def lost_gpu_hours(self) -> float:
        return self.lost_gpu_seconds / 3600

    @property
    def admitted_gpu_hours(self) -> float:
        return self.admitted_gpu_seconds / 3600

    @property
    def evictions_per_gpu_hour(self) -> float:
        """Preemptions per admitted GPU-hour (0 when nothing was admitted)."""
        hours = self.admitted_gpu_hours
        return self.preemptions / hours if hours > 0 else 0.0

    def figures(self) -> dict[str, Any]:
        """The figures as reports and the API give them (hours, kinds sorted)."""
        return {
            "preemptions": self.preemptions,
            "lost_gpu_hours": self.lost_gpu_hours,
            "admitted_gpu_hours": self.admitted_gpu_hours,
            "evictions_per_gpu_hour": self.evictions_per_gpu_hour,
            "by_kind": dict(sorted(self.by_kind.items())),
            "lost_gpu_hours_by_kind": {k: v / 3600 for k, v in sorted(self.lost_by_kind.items())},
        }


def total(costs: Iterable[PreemptionCost]) -> PreemptionCost:
    """The sum of ``costs`` (a cluster's, from its tenants')."""
    found = PreemptionCost()
    for cost in costs:
        found.add(cost)
    return found


@dataclass(slots=True)
class _Run:
    tenant: str
    gpus: int
    admitted_at: float


class CostLedger:
    """Each tenant's :class:`PreemptionCost` from the jobs' state changes, fed oldest first and
    as often as new ones come (the metrics read the event log incrementally).

    A run opens when its job enters STARTING (the scheduler's admission) and closes when the
    scheduler takes its GPUs back (PREEMPTING, RESTARTING, PENDING or an end). A preemption is
    a move PREEMPTING -> PENDING, of the kind written on the move to PREEMPTING and with the
    lost work written on the move back (none written: none counted); a job cancelled while it
    was being preempted ends there and is not requeued, so it is no preemption."""

    def __init__(self) -> None:
        self.tenants: dict[str, PreemptionCost] = {}
        self._runs: dict[str, _Run] = {}  # open runs by job
        self._preempting: dict[str, str] = {}  # job -> the kind it is being preempted by

    def transition(
        self,
        job_id: str,
        tenant: str,
        gpus: int,
        at: float,
        to_state: str,
        details: Mapping[str, Any],
    ) -> None:
        """One state change of a job holding ``gpus`` GPUs, at ``at``."""
        if to_state == "STARTING":
            self._runs.setdefault(job_id, _Run(tenant, gpus, at))
            return
        if to_state not in _RUN_ENDS:
            return
        run = self._runs.pop(job_id, None)
        if run is not None:
            self._cost(tenant).admitted_gpu_seconds += max(0.0, at - run.admitted_at) * run.gpus
        if to_state == "PREEMPTING":
            self._preempting[job_id] = str(details.get("kind") or UNKNOWN)
            return
        kind = self._preempting.pop(job_id, None)
        if kind is not None and to_state == "PENDING":
            self._cost(tenant).evicted(kind, _seconds(details.get("lost_gpu_seconds")))

    def costs(self, now: float) -> dict[str, PreemptionCost]:
        """Each tenant's cost, its runs still open counted up to ``now``."""
        found = {tenant: cost.copy() for tenant, cost in self.tenants.items()}
        for run in self._runs.values():
            cost = found.setdefault(run.tenant, PreemptionCost())
            cost.admitted_gpu_seconds += max(0.0, now - run.admitted_at) * run.gpus
        return found

    def _cost(self, tenant: str) -> PreemptionCost:
        found = self.tenants.get(tenant)
        if found is None:
            found = self.tenants[tenant] = PreemptionCost()
        return found


def _seconds(value: object) -> float:
    """A recorded number of seconds, else 0 (the event log is read, never trusted to hold one)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return 0.0
