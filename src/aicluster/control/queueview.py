"""A read-only picture of the queue the loop publishes for the API (positions and reasons)."""

from __future__ import annotations

from dataclasses import dataclass

from aicluster.core import Plan
from aicluster.scheduler import SchedulerState

__all__ = ["QueueEntry", "queue_entries"]


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


def queue_entries(
    state: SchedulerState, plan: Plan | None, names: dict[str, str], now: float
) -> list[QueueEntry]:
    """Pending jobs in the order the scheduler considers them: the policy's own ordering (fair
    share interleaves tenants by their weighted share; the others merge lanes by key)."""
    merge = state.policy.ordering(state.snapshot(now))
    entries: list[QueueEntry] = []
    while (candidate := merge.pop()) is not None:
        merge.finish(candidate, placed=False, drop_lane=False)
        pending = state.pending[candidate.job_id]
        reason = plan.reason_for(candidate.job_id) if plan is not None else None
        entries.append(
            QueueEntry(
                position=len(entries) + 1,
                job_id=candidate.job_id,
                tenant=pending.job.tenant,
                name=names.get(candidate.job_id, candidate.job_id),
                priority=pending.job.priority,
                gpus=pending.job.total_gpus,
                waiting_seconds=max(0.0, now - pending.enqueued_at),
                code=reason.code.value if reason is not None else None,
                reason=reason.message if reason is not None else "waiting for the next cycle",
            )
        )
    return entries
