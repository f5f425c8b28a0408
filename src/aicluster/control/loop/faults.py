"""Per-job fault isolation for the control loop: one job's trouble never stops the tick.

Every per-job step of a tick (taking a job in, adopting it after a restart, settling a launch or
a stop, polling its gang, reading its telemetry, registering its export) runs under
:meth:`JobFaults.guard`. An exception there is the job's fault, not the loop's: it is logged and
recorded on the job (a ``job.handling_failed`` event, at most one a minute per job), counted, and
after ``limit`` faults the job is given up (the loop fails it with the reason). The tick goes on
with every other job. Faults of the store itself (the database is down) and the loss of the
leader lease (:class:`~aicluster.store.LeaseLost`, a fenced write) are not a job's: they
propagate, and the whole tick is retried.

What a job writes that the reader drops (:class:`~aicluster.runtime.joboutput.Rejects`) is
reported here too, as ``job.output_rejected`` events, at most one a minute per job.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy.exc import DBAPIError

from aicluster.store import LeaseLost, Store

__all__ = ["FAULT_LIMIT", "NOT_A_JOB_FAULT", "REPORT_EVERY_S", "JobFaults"]

log = logging.getLogger(__name__)
#: Faults of one job before the loop gives up on it (fails it).
FAULT_LIMIT = 3
#: Seconds between two events of one kind about one job.
REPORT_EVERY_S = 60.0
#: Reasons listed in one ``job.output_rejected`` event, at most.
MAX_REASONS = 10


#: Exceptions that are the store's or the process's, never a job's: they end the tick.
NOT_A_JOB_FAULT: tuple[type[BaseException], ...] = (
    DBAPIError,  # OperationalError (the database is down) among them
    LeaseLost,  # fenced: this server no longer leads
    MemoryError,
)


@dataclass
class JobFaults:
    """Fault counts and report times per job; owned by the control loop's thread."""

    store: Store
    actor: str
    clock: Callable[[], float]
    limit: int = FAULT_LIMIT
    faults: Counter[str] = field(default_factory=Counter)
    total: int = 0
    _reported: dict[tuple[str, str], float] = field(default_factory=dict)
    _rejected: dict[str, Counter[str]] = field(default_factory=dict)

    @contextmanager
    def guard(self, job_id: str, step: str, give_up: Callable[[str, str], None]) -> Iterator[None]:
        """Run a per-job step; a fault in it is recorded on ``job_id``, and after ``limit``
        faults ``give_up(job_id, reason)`` is called (itself guarded)."""
        try:
            yield
        except NOT_A_JOB_FAULT:
            raise
        except Exception as error:
            self._fault(job_id, step, error, give_up)

    def _fault(
        self, job_id: str, step: str, error: Exception, give_up: Callable[[str, str], None]
    ) -> None:
        self.total += 1
        self.faults[job_id] += 1
        count = self.faults[job_id]
        what = f"{step}: {type(error).__name__}: {error}"[:500]
        if self._due(job_id, "handling_failed") or count >= self.limit:
            log.warning("control loop: job %s: %s (fault %d)", job_id, what, count, exc_info=True)
            self._event(
                job_id, "job.handling_failed", {"step": step, "error": what, "count": count}
            )
        if count >= self.limit:
            self.faults.pop(job_id, None)
            try:
                give_up(job_id, f"the control plane could not handle the job ({what})")
            except NOT_A_JOB_FAULT:
                raise
            except Exception:
                log.exception("control loop: giving up on job %s failed too", job_id)

    def rejected(self, job_id: str, counts: Counter[str], *, flush: bool = False) -> None:
        """Record what the reader dropped of ``job_id``'s output (an event a minute at most;
        ``flush`` reports what is held back at once, as when the job ends)."""
        held = self._rejected.setdefault(job_id, Counter())
        held.update(counts)
        if not held or not (flush or self._due(job_id, "output_rejected")):
            return
        del self._rejected[job_id]
        reasons = dict(held.most_common(MAX_REASONS))
        details = {"count": sum(held.values()), "reasons": reasons}
        self._event(job_id, "job.output_rejected", details)

    def forget(self, job_id: str) -> None:
        """The job left the loop: drop what is kept of it."""
        self.faults.pop(job_id, None)
        self._rejected.pop(job_id, None)
        for key in [key for key in self._reported if key[0] == job_id]:
            del self._reported[key]

    def _due(self, job_id: str, kind: str) -> bool:
        now = self.clock()
        last = self._reported.get((job_id, kind), -math.inf)
        if now - last < REPORT_EVERY_S:
            return False
        self._reported[(job_id, kind)] = now
        return True

    def _event(self, job_id: str, kind: str, details: dict[str, object]) -> None:
        try:
            self.store.record_event(job_id, kind, self.actor, details)
        except NOT_A_JOB_FAULT:
            raise
        except Exception:  # e.g. the job is gone from the store: the log line stays
            log.exception("control loop: cannot record %s for job %s", kind, job_id)
