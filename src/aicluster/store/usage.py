"""What jobs used: their runs and what they held (their placement, the nodes' GPU types), for
``aicluster usage`` and ``GET /v1/usage`` (:mod:`aicluster.core.usage` adds them up).

A run is the runtime's measurement where it has one (a ``job.ran`` event: the attempt's first
rank process start to its last exit, ``control/loop/attempts.py``), else the store's RUNNING
interval (the loop sees a start or an end up to a tick late; a run still going ends now)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import or_, select

from aicluster.core import JobState
from aicluster.core.usage import JobRuns
from aicluster.store import schema
from aicluster.store.base import StoreBase

__all__ = ["UsageOps"]

jobs, events, nodes = schema.jobs, schema.events, schema.nodes
_RUNNING = JobState.RUNNING.value


class UsageOps(StoreBase):
    def job_runs(
        self, tenants: Sequence[str] | None, since: float | None, until: float | None
    ) -> list[JobRuns]:
        """Each job of ``tenants`` (None: every tenant) that ran in ``[since, until)``, with
        its runs clipped to it; a run still going ends now."""
        end = self._now() if until is None else min(until, self._now())
        start = since if since is not None else 0.0
        query = (
            select(events.c.job_id, events.c.at, events.c.from_state, events.c.to_state)
            .where(
                events.c.kind == "job.transition",
                or_(events.c.to_state == _RUNNING, events.c.from_state == _RUNNING),
            )
            .order_by(events.c.id)
        )
        if tenants is not None:
            query = query.where(events.c.tenant.in_(list(tenants)))
        measured_query = select(events.c.job_id, events.c.details).where(events.c.kind == "job.ran")
        if tenants is not None:
            measured_query = measured_query.where(events.c.tenant.in_(list(tenants)))
        with self._read() as connection:
            transitions = connection.execute(query).all()
            measured = _measured(connection.execute(measured_query).all())
            runs = _runs(transitions, measured, start, end)
            rows = connection.execute(
                select(jobs.c.id, jobs.c.tenant, jobs.c.name, jobs.c.gpus, jobs.c.placement).where(
                    jobs.c.id.in_(list(runs))
                )
            ).all()
            types = dict(connection.execute(select(nodes.c.name, nodes.c.gpu_type)).all())
        return [
            JobRuns(r.id, r.tenant, r.name, _held(r.placement, r.gpus, types), runs[r.id])
            for r in sorted(rows, key=lambda r: r.id)
        ]


def _runs(
    transitions: Sequence[Any],
    measured: Mapping[str, list[tuple[float, float]]],
    start: float,
    end: float,
) -> dict[str, list[tuple[float, float]]]:
    """Runs per job, clipped to ``[start, end)``; only jobs with some time in it. An ended
    RUNNING interval that a measured run overlaps (the same attempt) counts as measured."""
    opened: dict[str, float] = {}
    runs: dict[str, list[tuple[float, float]]] = {}
    for job_id, at, from_state, to_state in transitions:
        if to_state == _RUNNING:
            opened[job_id] = at
        elif from_state == _RUNNING and job_id in opened:
            began, ended = _as_measured(opened.pop(job_id), at, measured.get(job_id, ()))
            _clip(runs, job_id, began, ended, start, end)
    for job_id, began in opened.items():
        _clip(runs, job_id, began, end, start, end)
    return runs


def _as_measured(
    began: float, ended: float, measured: Sequence[tuple[float, float]]
) -> tuple[float, float]:
    for run in measured:
        if run[0] < ended and run[1] > began:
            return run
    return began, ended


def _measured(rows: Sequence[Any]) -> dict[str, list[tuple[float, float]]]:
    """The runtime's measured runs per job (``job.ran`` events; the control plane writes them
    from the launcher's exit records, so malformed ones are only skipped)."""
    found: dict[str, list[tuple[float, float]]] = {}
    for job_id, details in rows:
        try:
            run = (float(details["started_at"]), float(details["finished_at"]))
        except (KeyError, TypeError, ValueError):
            continue
        if run[1] > run[0]:
            found.setdefault(job_id, []).append(run)
    return found


def _clip(
    runs: dict[str, list[tuple[float, float]]],
    job_id: str,
    began: float,
    ended: float,
    start: float,
    end: float,
) -> None:
    low, high = max(began, start), min(ended, end)
    if high > low:
        runs.setdefault(job_id, []).append((low, high))


def _held(
    placement: Mapping[str, Any] | None, gpus: int, types: Mapping[str, str]
) -> list[tuple[str, int, float]]:
    """(GPU type, GPUs, CPUs) per slot of the job's placement (its last: one placement a job,
    as the scheduler re-places a restarted job at the same size); its GPU count alone if it
    has none recorded."""
    if not placement:
        return [("", gpus, 0.0)]
    held = []
    for node, slot_gpus, _, *host in placement.get("slots", []):
        cpus = float(host[0]) if host else 0.0
        held.append((types.get(str(node), ""), int(slot_gpus), cpus))
    return held
