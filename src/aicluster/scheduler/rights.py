"""Preemption rights as data: who may take GPUs from whom, by which right (as Kueue's
``reclaimWithinCohort`` / ``borrowWithinCohort``), and each running job's standing.

A running job's *standing* is ``in quota`` or ``borrowed``: a tenant's running jobs of one GPU
type, in the order they started, count against its quota; a job whose GPUs take the tenant past
its quota, and every job started after it, runs on borrowed GPUs (a tenant without a quota has
every job in quota). A job's standing only rises while it runs: a new job starts after it, and
a job that stops only lowers the count of those after it.

The termination argument is in :mod:`aicluster.scheduler.preemption` (``docs/scheduler.md``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aicluster.scheduler.entries import RunningEntry

__all__ = [
    "LEGACY_RIGHTS",
    "PreemptionRights",
    "Reach",
    "Reclaim",
    "borrowed_jobs",
    "policy_ceiling",
]


class Reclaim(StrEnum):
    """Kueue's ``reclaimWithinCohort``: which borrowed jobs of other tenants a job within its
    tenant's quota takes back."""

    NEVER = "never"
    LOWER_PRIORITY = "lower_priority"
    ANY = "any"


class Reach(StrEnum):
    """Whose jobs the priority or the policy's right reaches."""

    NONE = "none"
    OWN = "own"  # the preemptor's tenant's (a borrowing preemptor's: its borrowed ones only)
    BORROWED = "borrowed"  # and other tenants' on borrowed GPUs, or of tenants without a quota


@dataclass(frozen=True, slots=True)
class PreemptionRights:
    """Who may take GPUs from whom, for preemptors within their tenant's quota (counting the
    job) and for borrowing ones (Kueue's ``borrowWithinCohort``, whose
    ``max_priority_threshold`` bounds the priority of other tenants' jobs a borrower takes).

    ``by_standing``: rights respect the victim's standing (a borrower takes only borrowed jobs,
    and the policy's right only jobs of no higher priority); the measure of the termination
    argument needs it. False gives the rights as they were before (:data:`LEGACY_RIGHTS`:
    reclaim and cross-tenant priority could chase each other for ever)."""

    reclaim: Reclaim = Reclaim.ANY
    priority: Reach = Reach.BORROWED
    policy: Reach = Reach.BORROWED
    borrowing_priority: Reach = Reach.OWN
    borrowing_policy: Reach = Reach.OWN
    max_priority_threshold: int | None = None
    by_standing: bool = True

    def reach(self, kind: str, borrowing: bool) -> Reach:
        """The reach of the ``priority`` or ``policy`` right for a preemptor."""
        if kind == "priority":
            return self.borrowing_priority if borrowing else self.priority
        return self.borrowing_policy if borrowing else self.policy


#: The rights before issue 34: a borrower kept every right, a victim's standing was not read.
LEGACY_RIGHTS = PreemptionRights(
    reclaim=Reclaim.ANY,
    priority=Reach.BORROWED,
    policy=Reach.BORROWED,
    borrowing_priority=Reach.BORROWED,
    borrowing_policy=Reach.BORROWED,
    by_standing=False,
)


def policy_ceiling(rights: PreemptionRights, priority: int) -> int:
    """The highest priority the policy's right of a job of ``priority`` reaches."""
    return priority if rights.by_standing else sys.maxsize


def borrowed_jobs(
    running: Mapping[str, RunningEntry],
    taken: set[str],
    quota_for: Callable[[str, str], int],
) -> set[str]:
    """The running jobs (less ``taken``) on borrowed GPUs: per tenant and GPU type, in start
    order (``running`` keeps it among equal start times), those from the first that takes the
    tenant past ``quota_for(tenant, gpu_type)``."""
    counted: dict[tuple[str, str], int] = {}
    borrowed: set[str] = set()
    for entry in sorted(running.values(), key=_started):  # (stable: ties in start order)
        job = entry.job
        if job.id in taken:
            continue
        key = (job.tenant, entry.gpu_type)
        used = counted[key] = counted.get(key, 0) + job.total_gpus
        if used > quota_for(job.tenant, entry.gpu_type):
            borrowed.add(job.id)
    return borrowed


def _started(entry: RunningEntry) -> float:
    return entry.started_at
