"""The nodes' security alarms (:mod:`aicluster.runtime.alarms`) into the event log.

Each alarm becomes one ``security.alarm`` event: of the job it names (its tenant sees it with
the job's events), else of the cluster, labelled with the tenant it aimed at. The event log is
the audit record; the metrics count the events (``aicluster_security_alarms``).
"""

from __future__ import annotations

import os

from aicluster.runtime.alarms import Alarm, take_alarms
from aicluster.store import NotFound, Store

__all__ = ["ALARM_EVENT", "record_alarms"]

ALARM_EVENT = "security.alarm"
ACTOR = "runtime"


def record_alarms(store: Store, state_dir: str | os.PathLike[str]) -> int:
    """Move the alarms the nodes wrote since the last call into the event log; how many."""

    def record(alarm: Alarm) -> None:
        details = alarm.to_dict()
        job_id = details.get("job_id")
        if isinstance(job_id, str):
            try:
                store.record_event(job_id, ALARM_EVENT, ACTOR, details)
                return
            except NotFound:  # a job deleted since: the alarm still counts
                pass
        store.record_cluster_event(ALARM_EVENT, ACTOR, details, tenant=alarm.tenant)

    return take_alarms(state_dir, record)
