"""Goodput of a job from its attempts' telemetry: productive time, lost work, restart time, ETTR.

- *productive*: stepping time whose result was kept — the whole final attempt, and in an attempt
  that failed, the time up to its last completed checkpoint;
- *lost work*: stepping time after an attempt's last checkpoint, redone after the restart;
- *restart time*: from an attempt's last record to the next attempt's first step (detection,
  backoff, queueing, launch, rendezvous, loading the checkpoint);
- *ETTR* (effective training time ratio): productive time over wall time, first start to last
  record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from aicluster.train.telemetry import StepRecord

__all__ = ["Goodput", "goodput", "job_goodput"]


@dataclass(frozen=True, slots=True)
class Goodput:
    attempts: int
    wall_seconds: float
    productive_seconds: float
    lost_seconds: float
    restart_seconds: float
    checkpoints: int

    @property
    def ettr(self) -> float:
        return self.productive_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "ettr": self.ettr}


@dataclass(frozen=True, slots=True)
class _Attempt:
    first_record: float
    first_step: float | None
    last_step: float | None
    last_record: float
    last_checkpoint: float | None
    checkpoints: int


def _summarize(records: Sequence[StepRecord]) -> _Attempt | None:
    if not records:
        return None
    steps = [r.time for r in records if r.kind == "step"]
    checkpoints = [r.time for r in records if r.kind == "checkpoint" and r.rank == 0]
    return _Attempt(
        first_record=min(r.time for r in records),
        first_step=min(steps) if steps else None,
        last_step=max(steps) if steps else None,
        last_record=max(r.time for r in records),
        last_checkpoint=max(checkpoints) if checkpoints else None,
        checkpoints=len(checkpoints),
    )


def goodput(by_attempt: Mapping[int, Sequence[StepRecord]]) -> Goodput:
    """Goodput over every attempt that left telemetry (the last one counts as kept in full)."""
    attempts = [a for _, records in sorted(by_attempt.items()) if (a := _summarize(records))]
    if not attempts:
        return Goodput(0, 0.0, 0.0, 0.0, 0.0, 0)
    productive = lost = restart = 0.0
    for index, attempt in enumerate(attempts):
        if attempt.first_step is None or attempt.last_step is None:
            continue
        final = index == len(attempts) - 1
        kept_until = attempt.last_step if final else (attempt.last_checkpoint or attempt.first_step)
        kept_until = max(attempt.first_step, min(kept_until, attempt.last_step))
        productive += kept_until - attempt.first_step
        lost += attempt.last_step - kept_until
        if index > 0:
            restart += max(0.0, attempt.first_step - attempts[index - 1].last_record)
    wall = attempts[-1].last_record - attempts[0].first_record
    return Goodput(
        attempts=len(attempts),
        wall_seconds=wall,
        productive_seconds=productive,
        lost_seconds=lost,
        restart_seconds=restart,
        checkpoints=sum(a.checkpoints for a in attempts),
    )


def job_goodput(runtime: Any, job_id: str, attempts: int) -> Goodput:
    """Goodput of a job from the telemetry of its attempts 1..``attempts`` (rank 0's view)."""
    from aicluster.runtime import GangError

    by_attempt: dict[int, list[StepRecord]] = {}
    for attempt in range(1, attempts + 1):
        try:
            by_attempt[attempt] = list(runtime.telemetry(job_id, attempt).get(0, []))
        except GangError:  # an attempt that never launched left nothing
            continue
    return goodput(by_attempt)
