"""Aggregate reads for metrics and the dashboard: counts, placements and events by kind.

These answer in one query each and never parse job specs, so a scrape or a dashboard poll over
thousands of jobs stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from aicluster.core import JobState
from aicluster.store import schema
from aicluster.store.base import StoreBase, _event
from aicluster.store.records import EventRecord

__all__ = ["JobCount", "PlacedJob", "StatsOps"]

jobs, events = schema.jobs, schema.events
_HOLDING = [state.value for state in JobState if state.holds_resources]


@dataclass(frozen=True, slots=True)
class JobCount:
    """How many jobs of one tenant are in one state, and their restarts added up."""

    tenant: str
    state: JobState
    jobs: int
    restarts: int


@dataclass(frozen=True, slots=True)
class PlacedJob:
    """A job that holds GPUs, with just what a cluster map needs."""

    id: str
    tenant: str
    name: str
    state: JobState
    priority: int
    gpus: int
    placement: Mapping[str, Any]


class StatsOps(StoreBase):
    def job_counts(self) -> list[JobCount]:
        """Jobs per (tenant, state) with their restarts summed: one GROUP BY."""
        query = select(
            jobs.c.tenant,
            jobs.c.state,
            func.count().label("n"),
            func.coalesce(func.sum(jobs.c.restarts), 0).label("restarts"),
        ).group_by(jobs.c.tenant, jobs.c.state)
        with self._read() as connection:
            rows = connection.execute(query).all()
        return [JobCount(r.tenant, JobState(r.state), int(r.n), int(r.restarts)) for r in rows]

    def pending_count(self, tenant: str) -> int:
        """How many of ``tenant``'s jobs are PENDING (one indexed COUNT)."""
        query = (
            select(func.count())
            .select_from(jobs)
            .where(jobs.c.state == JobState.PENDING.value, jobs.c.tenant == tenant)
        )
        with self._read() as connection:
            return int(connection.execute(query).scalar_one())

    def placed_jobs(self) -> list[PlacedJob]:
        """Jobs holding GPUs that have a placement, oldest first (no spec parsing)."""
        query = (
            select(
                jobs.c.id,
                jobs.c.tenant,
                jobs.c.name,
                jobs.c.state,
                jobs.c.priority,
                jobs.c.gpus,
                jobs.c.placement,
            )
            .where(jobs.c.state.in_(_HOLDING), jobs.c.placement.is_not(None))
            .order_by(jobs.c.id)
        )
        with self._read() as connection:
            rows = connection.execute(query).all()
        return [
            PlacedJob(r.id, r.tenant, r.name, JobState(r.state), r.priority, r.gpus, r.placement)
            for r in rows
            if r.placement  # JSON null reads back as None on some drivers
        ]

    def job_transitions(
        self, *, after_id: int | None = None, limit: int = 1000
    ) -> list[tuple[EventRecord, int]]:
        """Jobs' state changes (``job.transition`` events), oldest first, after ``after_id``,
        each with its job's GPUs (the spec's total; 0 for a job whose row is gone). Read
        incrementally, as :meth:`events_of_kind`, for the cost of preemption."""
        query = (
            select(events, jobs.c.gpus)
            .select_from(events.outerjoin(jobs, jobs.c.id == events.c.job_id))
            .where(events.c.kind == "job.transition")
            .order_by(events.c.id)
            .limit(limit)
        )
        if after_id is not None:
            query = query.where(events.c.id > after_id)
        with self._read() as connection:
            rows = connection.execute(query).all()
        return [(_event(row._mapping), int(row.gpus or 0)) for row in rows]

    def events_of_kind(
        self,
        kinds: Sequence[str],
        *,
        tenant: str | None = None,
        after_id: int | None = None,
        limit: int = 1000,
    ) -> list[EventRecord]:
        """Events of the given kinds, oldest first, after ``after_id``; one tenant's or all.

        Read incrementally (pass the last id seen) the scan covers only new events.
        """
        query = (
            select(events).where(events.c.kind.in_(list(kinds))).order_by(events.c.id).limit(limit)
        )
        if tenant is not None:
            query = query.where(events.c.tenant == tenant)
        if after_id is not None:
            query = query.where(events.c.id > after_id)
        with self._read() as connection:
            return [_event(row._mapping) for row in connection.execute(query)]
