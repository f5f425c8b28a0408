"""Following running gangs' telemetry: a health monitor per gang (stragglers, hangs) and the
checkpoints each attempt reported. Part of
:class:`aicluster.control.loop.lifecycle.GangLifecycle`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aicluster.control.loop.faults import JobFaults
from aicluster.control.loop.health import GangMonitor, Straggler
from aicluster.control.settings import ACTOR, LoopSettings
from aicluster.runtime import TelemetryCursor
from aicluster.store import JobRecord, NodeHealth, Store

__all__ = ["GangWatch"]

#: Called with a job's id and the time of each checkpoint it reports (never past now).
Checkpointed = Callable[[str, float], None]


class GangWatch:
    """The monitors of the gangs followed now, each with its telemetry cursor; ``monitors`` is
    read by the metrics (a snapshot per gang, replaced whole by the loop's thread)."""

    def __init__(self, store: Store, faults: JobFaults, checkpointed: Checkpointed) -> None:
        self.store, self.faults, self.checkpointed = store, faults, checkpointed
        self.monitors: dict[str, tuple[GangMonitor, TelemetryCursor | None]] = {}

    def observe(
        self, record: JobRecord, handle: Any, now: float, settings: LoopSettings
    ) -> str | None:
        """Take in the gang's telemetry: record its stragglers (and cordon their nodes when the
        settings say so). Returns why the gang hangs, or None."""
        monitor, cursor = self.monitors.get(record.id, (None, None))
        if monitor is None:
            # Its ranks (a rank per GPU, as launched), which an elastic job's spec does not say.
            ranks = len(handle.nodes) or record.spec.workers
            monitor = GangMonitor(ranks, now, settings.health, record.spec.hang_check)
            # Each rank's node as the launcher placed it (its root-only gang spec): a job's
            # telemetry may name any node, and a straggler's node may be cordoned.
            monitor.nodes.update(enumerate(handle.nodes))
        if cursor is None:
            cursor = handle.telemetry_cursor()
        self.monitors[record.id] = (monitor, cursor)
        for straggler in self._read(record.id, monitor, cursor, now):
            details = {"rank": straggler.rank, "node": straggler.node, "ratio": straggler.ratio}
            details["step"] = straggler.step  # the step whose telemetry flagged it
            self.store.record_event(record.id, "job.straggler", ACTOR, details)
            if settings.cordon_stragglers and straggler.node:
                self.store.set_node_health(
                    straggler.node, NodeHealth.CORDONED, ACTOR, straggler.describe()
                )
        return monitor.hung(now)

    def checkpoints(self, job_id: str, now: float) -> int:
        """How many checkpoints the job's current attempt has reported, read up to now."""
        monitor, cursor = self.monitors.get(job_id, (None, None))
        if monitor is None:
            return 0
        if cursor is not None:
            self._read(job_id, monitor, cursor, now)
        return len(monitor.checkpoints)

    def flush(self, job_id: str) -> None:
        """An attempt ended: report what was held back of the records it dropped."""
        _, cursor = self.monitors.get(job_id, (None, None))
        if cursor is not None:
            self.faults.rejected(job_id, cursor.rejects.take(), flush=True)

    def forget(self, job_id: str) -> GangMonitor | None:
        """Stop following the job's attempt (the next one reports afresh); its monitor."""
        monitor, _ = self.monitors.pop(job_id, (None, None))
        return monitor

    def _read(
        self, job_id: str, monitor: GangMonitor, cursor: TelemetryCursor, now: float
    ) -> list[Straggler]:
        """Take in what the gang reported since the last read (through the safe reader); tell
        of the checkpoints it took. Returns the stragglers flagged now."""
        records = cursor.poll()
        self.faults.rejected(job_id, cursor.rejects.take())
        seen = len(monitor.checkpoints)
        stragglers = monitor.observe(records)
        for at, _ in monitor.checkpoints[seen:]:  # the job's clock: never past ours
            self.checkpointed(job_id, min(at, now))
        return stragglers
