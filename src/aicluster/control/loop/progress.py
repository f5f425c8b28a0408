"""A job's progress as the store keeps it: what its interrupted runs leave it, and when it went
back to the queue (``jobs.progress``, migration 0008).

The control loop writes it when a run is interrupted (preempted, failed and restarted) and reads
it when it takes the job in again, also after a restart or a failover, so the job is ranked as
the simulator ranks a requeued job (``scheduler.effects``). ``preempted_at``, when the job was
last preempted, starts its cool-down (``scheduler.protection``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from aicluster.scheduler import Progress

__all__ = ["progress_from_json", "progress_to_json"]


def progress_to_json(progress: Progress, requeued_at: float) -> dict[str, float | int]:
    data: dict[str, float | int] = {
        "attained_gpu_seconds": round(progress.attained_gpu_seconds, 3),
        "executed_seconds": round(progress.executed_seconds, 3),
        "last_run_seconds": round(progress.last_run_seconds, 3),
        "restarts": progress.restarts,
        "requeued_at": requeued_at,
    }
    if math.isfinite(progress.preempted_at):  # (absent: never preempted; -inf is not JSON)
        data["preempted_at"] = progress.preempted_at
    return data


def progress_from_json(data: Mapping[str, Any] | None) -> tuple[Progress, float] | None:
    """The progress and the time of the requeue; None when there is none (a job that never ran
    to an interruption) or it is not of this form."""
    if not isinstance(data, Mapping):
        return None
    keys = ("attained_gpu_seconds", "executed_seconds", "last_run_seconds", "requeued_at")
    numbers = [data.get(key, math.nan) for key in keys]  # missing: not finite, refused
    restarts = data.get("restarts")
    if not isinstance(restarts, int) or not all(_finite(n) for n in (*numbers, restarts)):
        return None
    attained, executed, last_run, requeued_at = (float(n) for n in numbers)
    preempted_at = data.get("preempted_at")  # (absent before issue 34, or never preempted)
    when = -math.inf
    if isinstance(preempted_at, int | float) and _finite(preempted_at):
        when = float(preempted_at)
    return Progress(attained, executed, last_run, restarts, when), requeued_at


def _finite(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )
