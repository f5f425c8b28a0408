"""A read-only picture of the queue the loop publishes for the API (positions, reasons and
estimated starts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aicluster.core import Plan
from aicluster.scheduler import SchedulerState

__all__ = ["QueueEntry", "queue_entries", "queue_order"]


@dataclass(frozen=True, slots=True)
class QueueEntry:
    position: int
    job_id: str
    tenant: str
    name: str
    priority: int
    gpus: int
    waiting_seconds: float
    code: str | None
    reason: str
    estimated_start: float | None = None  # sim/forecast.py (None: none yet, or none found)


def queue_order(state: SchedulerState, now: float) -> list[str]:
    """Pending jobs' ids in the order the scheduler considers them: the policy's own ordering
    (fair share interleaves tenants by their weighted share; the others merge lanes by key)."""
    merge = state.policy.ordering(state.snapshot(now))
    order: list[str] = []
    while (candidate := merge.pop()) is not None:
        merge.finish(candidate, placed=False, drop_lane=False)
        order.append(candidate.job_id)
    return order


def queue_entries(
    state: SchedulerState,
    plan: Plan | None,
    names: dict[str, str],
    now: float,
    order: Sequence[str],
    estimates: Mapping[str, float | None],
) -> list[QueueEntry]:
    """The pending jobs of ``order`` (:func:`queue_order`'s) with their reasons in ``plan``
    and their ``estimates``."""
    entries: list[QueueEntry] = []
    for job_id in order:
        pending = state.pending[job_id]
        reason = plan.reason_for(job_id) if plan is not None else None
        entries.append(
            QueueEntry(
                position=len(entries) + 1,
                job_id=job_id,
                tenant=pending.job.tenant,
                name=names.get(job_id, job_id),
                priority=pending.job.priority,
                gpus=pending.job.total_gpus,
                waiting_seconds=max(0.0, now - pending.enqueued_at),
                code=reason.code.value if reason is not None else None,
                reason=reason.message if reason is not None else "waiting for the next cycle",
                estimated_start=estimates.get(job_id),
            )
        )
    return entries
