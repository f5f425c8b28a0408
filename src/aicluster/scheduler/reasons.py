"""The words of a cycle's plan: why a job starts where it does, why a victim is preempted, why a
job waits (behind a reservation, behind the queue, while nodes resume from power saving), and
the reasons of the jobs a cycle never examined. The cycle (:mod:`.cycle`) decides; these only
say so, and only where someone reads them (``explain``; the simulator reads none).
"""

from __future__ import annotations

from aicluster.core import ANY_GPU_TYPE, Job, PendingCode, PendingReason, Placement, VictimKind
from aicluster.scheduler.backfill import Reservation
from aicluster.scheduler.entries import PendingEntry
from aicluster.scheduler.index import FreeIndex
from aicluster.scheduler.placement import describe_mesh
from aicluster.scheduler.policies.base import Ordering
from aicluster.scheduler.power import PowerManager

__all__ = [
    "admitted",
    "behind_reservation",
    "by_default",
    "explain_rest",
    "preempted",
    "resuming",
]


def admitted(
    index: FreeIndex,
    entry: PendingEntry,
    job: Job,
    placement: Placement,
    gpu_type: str,
    borrowed: int,
    backfilled: bool,
) -> str:
    """Why ``job`` (``entry``'s job, or an elastic one's smaller size) starts where it does."""
    why = f"placed in {placement.explain()}"
    if borrowed:
        why += f"; borrows {borrowed} idle {gpu_type} GPUs"
    if backfilled:
        why += "; backfilled without delaying the reserved head job"
    if job.parallelism.tensor > 1 or job.parallelism.pipeline > 1:
        why += f"; {describe_mesh(index, job, placement)}"
    if job.workers != entry.job.workers:
        why += f"; elastic: {job.workers} of {entry.job.workers} workers until more GPUs free up"
    return why


def preempted(kind: VictimKind, job: Job, queue: str) -> str:
    """Why a victim of ``kind`` makes way for ``job`` (``queue``: the policy's name)."""
    return {
        VictimKind.RECLAIM: (
            f"reclaimed: tenant {job.tenant} needs its quota back for job {job.id}"
        ),
        VictimKind.PRIORITY: f"preempted by higher-priority job {job.id}",
        VictimKind.POLICY: f"preempted by job {job.id} under the {queue} policy",
    }[kind]


def behind_reservation(job: Job, reservation: Reservation, index: FreeIndex) -> PendingReason:
    """Why ``job`` waits though it may fit: what is free would delay the reserved head."""
    hint = "" if job.duration_estimate is not None else " (it gives no duration estimate)"
    return PendingReason(
        PendingCode.RESERVATION,
        f"needs {job.total_gpus} GPUs; what is free would delay the head of the queue"
        f"{hint}: {reservation.describe(index)}",
        reservation.job_id,
    )


def resuming(
    power: PowerManager | None, gpu_type: str, reason: PendingReason, now: float
) -> PendingReason:
    """Under power saving, a job that waits while nodes of its type resume says so."""
    found = power.resuming_for(gpu_type) if power is not None else None
    if found is None:
        return reason
    nodes, up_at = found
    message = (
        f"{reason.message}; {nodes} node(s) resuming from power saving, "
        f"up in {max(0.0, up_at - now):.0f} s"
    )
    return PendingReason(reason.code, message, reason.blocking_job)


def by_default(
    blocked_by: str | None, index: FreeIndex, power: PowerManager | None, now: float
) -> PendingReason:
    """The reason of a job the cycle did not examine (``blocked_by``: the head that stopped a
    cycle without backfill)."""
    if blocked_by is not None:
        return PendingReason(
            PendingCode.QUEUE_ORDER,
            f"waiting behind job {blocked_by} (strict queue order, no backfill)",
            blocked_by,
        )
    free = sum(index.free_by_type.values())
    reason = PendingReason(
        PendingCode.NO_CAPACITY,
        f"waiting for capacity: jobs ahead in the queue take the {free} free GPU(s) first",
    )
    if power is not None:
        reason = resuming(power, ANY_GPU_TYPE, reason, now)
    return reason


def explain_rest(
    ordering: Ordering,
    pending: dict[str, PendingReason],
    lane_reasons: dict[int, PendingReason],
    default: PendingReason,
) -> None:
    """Give every job not examined the reason of its lane's head (``lane_reasons``, by the
    lane's items), or ``default``."""
    for items, position in ordering.remaining():
        lane_reason = lane_reasons.get(id(items))
        reason = default
        if lane_reason is not None and position > 0:
            reason = _like(lane_reason, items[position - 1][2])
        for _, _, job_id in items[position:]:
            pending.setdefault(job_id, reason)


def _like(reason: PendingReason, head: str) -> PendingReason:
    message = f"{reason.message} (as for job {head}, ahead in its lane)"
    return PendingReason(reason.code, message, reason.blocking_job)
